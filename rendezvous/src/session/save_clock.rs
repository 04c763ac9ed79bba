//! Node rank 0's checkpoint clock (`--ckpt-interval`): when the next interval save is due, as
//! a pure state the generation core drives ([`super::generation::step`]) with synthetic
//! instants in its tests.
//!
//! The work at risk starts when the generation starts (it resumed from the last seal) and again
//! at every seal; one save is asked per checkpoint: after asking, the clock waits for a seal.

use std::time::Duration;

use tokio::time::Instant;

/// Where the interval save stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SaveClock {
    /// The interval is being (re-)evaluated from the store; work at risk since `since`.
    Evaluating {
        /// The generation's start or the last seal.
        since: Instant,
    },
    /// Waiting for `since + interval`.
    Counting {
        /// The generation's start or the last seal.
        since: Instant,
        /// The interval in force.
        interval: Duration,
    },
    /// A save was asked at `at`; waiting for its seal.
    Asked {
        /// When.
        at: Instant,
        /// The interval in force.
        interval: Duration,
    },
}

impl SaveClock {
    /// A generation starting at `now`.
    pub fn start(now: Instant) -> Self {
        Self::Evaluating { since: now }
    }

    /// When a save is due, if counting.
    pub fn due_at(&self) -> Option<Instant> {
        match *self {
            Self::Counting { since, interval } => Some(since + interval),
            Self::Evaluating { .. } | Self::Asked { .. } => None,
        }
    }

    /// The interval was (re-)evaluated: count it from the start of the work at risk (a save
    /// already asked stays asked).
    pub fn set(&mut self, interval: Duration) {
        *self = match *self {
            Self::Evaluating { since } | Self::Counting { since, .. } => {
                Self::Counting { since, interval }
            }
            Self::Asked { at, .. } => Self::Asked { at, interval },
        };
    }

    /// A checkpoint was sealed at `now`: the work at risk starts again (the interval is
    /// re-evaluated next).
    pub fn sealed(&mut self, now: Instant) {
        *self = Self::Evaluating { since: now };
    }

    /// Whether a save is due at `now`; if so the clock waits for its seal from now on.
    pub fn take_due(&mut self, now: Instant) -> Option<Duration> {
        match *self {
            Self::Counting { since, interval } if since + interval <= now => {
                *self = Self::Asked { at: now, interval };
                Some(interval)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_save_per_interval_counted_from_the_last_seal() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut c = SaveClock::start(t0);
        assert_eq!(c.due_at(), None, "nothing due before the interval is known");
        assert_eq!(c.take_due(t0 + s(100)), None);
        c.set(s(5));
        assert_eq!(c.due_at(), Some(t0 + s(5)));
        assert_eq!(c.take_due(t0 + s(4)), None);
        assert_eq!(c.take_due(t0 + s(5)), Some(s(5)));
        assert_eq!(c.take_due(t0 + s(50)), None, "asked once until a seal");
        c.set(s(3));
        assert_eq!(c.due_at(), None, "still waiting for the seal");
        c.sealed(t0 + s(6));
        c.set(s(4));
        assert_eq!(c.due_at(), Some(t0 + s(10)), "counted from the seal");
        c.set(s(2));
        assert_eq!(
            c.due_at(),
            Some(t0 + s(8)),
            "a re-evaluation keeps the start"
        );
    }
}
