//! The phases of a restart, timed: failure (or membership change) detected → workers stopped
//! → group formed → workers spawned. Printed once per restart, so a user sees where the
//! seconds of a recovery went.

use std::time::Duration;

use tokio::time::Instant;

/// Instants of one restart, filled in as it goes.
#[derive(Debug, Clone, Copy)]
pub struct RestartClock {
    /// When the agent learned that the generation ends (worker exit, re-form, fence).
    pub detected: Instant,
    /// When the last local worker was reaped.
    pub stopped: Option<Instant>,
    /// When the next generation's plan arrived.
    pub formed: Option<Instant>,
}

impl RestartClock {
    /// A restart detected at `at`.
    pub fn detected(at: Instant) -> Self {
        Self {
            detected: at,
            stopped: None,
            formed: None,
        }
    }

    /// The report once the workers of generation `generation` were spawned at `spawned`:
    /// `restart into generation 2 took 1.3 s: workers stopped 210 ms, group formed 1.1 s,
    /// workers spawned 12 ms` (each phase measured from the end of the one before).
    pub fn line(&self, generation: u64, spawned: Instant) -> String {
        let stopped = self.stopped.unwrap_or(self.detected);
        let formed = self.formed.unwrap_or(stopped).max(stopped);
        let h = drun_rendezvous::human::duration;
        let since = |a: Instant, b: Instant| b.saturating_duration_since(a);
        format!(
            "restart into generation {generation} took {}: workers stopped {}, group formed {}, workers spawned {}",
            h(since(self.detected, spawned)),
            h(since(self.detected, stopped)),
            h(since(stopped, formed)),
            h(since(formed, spawned)),
        )
    }

    /// Total time from detection to `spawned`.
    pub fn total(&self, spawned: Instant) -> Duration {
        spawned.saturating_duration_since(self.detected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phase_is_measured_from_the_end_of_the_one_before() {
        let t0 = Instant::now();
        let mut c = RestartClock::detected(t0);
        c.stopped = Some(t0 + Duration::from_millis(210));
        c.formed = Some(t0 + Duration::from_millis(1310));
        let spawned = t0 + Duration::from_millis(1322);
        assert_eq!(
            c.line(2, spawned),
            "restart into generation 2 took 1.3 s: workers stopped 210 ms, group formed 1.1 s, workers spawned 12 ms"
        );
        assert_eq!(c.total(spawned), Duration::from_millis(1322));
    }

    #[test]
    fn missing_phases_count_as_zero() {
        let t0 = Instant::now();
        let c = RestartClock::detected(t0);
        assert_eq!(
            c.line(3, t0 + Duration::from_secs(2)),
            "restart into generation 3 took 2 s: workers stopped 0 s, group formed 0 s, workers spawned 2 s"
        );
    }
}
