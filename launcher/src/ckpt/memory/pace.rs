//! How the persister shares the node with the training: a byte-rate throttle ([`pause`]) and
//! the CPU ([`pace`]): while the CPUs it may run on are busy it keeps to a share of one CPU,
//! at full speed when the agent asks, past a lag bound, or while a CPU is spare
//! ([`spare_cpu`]). Pure decisions; the persister ([`super::persist`]) measures and sleeps.

use std::time::Duration;

/// The throttle: how long to pause after `written` bytes in `elapsed` so the copy runs at no
/// more than `rate` bytes per second (`0`: no limit).
pub fn pause(written: u64, elapsed: Duration, rate: u64) -> Duration {
    if rate == 0 {
        return Duration::ZERO;
    }
    let due = Duration::from_secs_f64(written as f64 / rate as f64);
    due.saturating_sub(elapsed)
}

/// How the persister shares the node's CPUs with the training ([`pace`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceParams {
    /// The share of one CPU the persister keeps to while the node's CPUs are busy (0.05: at
    /// most 50 ms of CPU time per second).
    pub share: f64,
    /// Past this lag (the step being written staged this long ago) it goes at full speed: the
    /// training's slowdown is bounded, and so is the disk's delay.
    pub lag_bound: Duration,
}

/// What the persister sees when it decides whether to yield the CPU ([`pace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceInput {
    /// The agent asks for full speed: the workers' end waits for the disk (no training left
    /// to protect), or a newer step is staged behind this one (the disk falls behind the
    /// saves).
    pub urgent: bool,
    /// How long ago the step being written was staged.
    pub lag: Duration,
    /// Whether the node had a CPU to spare in the last window ([`spare_cpu`]).
    pub spare: bool,
    /// The persister's CPU time since it began yielding, and the wall time since then.
    pub cpu: Duration,
    /// Wall time since it began yielding.
    pub elapsed: Duration,
}

/// Why the persister goes at full speed, or how long it yields ([`pace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// The agent asked for it ([`PaceInput::urgent`]).
    Urgent,
    /// The step waited past [`PaceParams::lag_bound`].
    LagBound,
    /// The node has a CPU the training does not use: the persister takes nothing from it.
    SpareCpu,
    /// The node's CPUs are busy: the persister keeps to its share of one CPU, pausing this
    /// long first (zero: it is within its share).
    Yield {
        /// The pause.
        pause: Duration,
    },
}

impl Pace {
    /// Whether the persister yields the CPU (and the disk: it asks for the idle I/O class).
    pub fn yields(&self) -> bool {
        matches!(self, Pace::Yield { .. })
    }

    /// The pause before the next slice of work (zero at full speed).
    pub fn pause(&self) -> Duration {
        match self {
            Pace::Yield { pause } => *pause,
            _ => Duration::ZERO,
        }
    }

    /// Why, in a few words (for the persister's log).
    pub fn reason(&self) -> &'static str {
        match self {
            Pace::Urgent => "full speed: the run's end or a newer step waits for the disk",
            Pace::LagBound => "full speed: the step waited past the persistence lag bound",
            Pace::SpareCpu => "full speed: the node has a CPU to spare",
            Pace::Yield { .. } => "yielding: the node's CPUs are busy with the training",
        }
    }
}

/// The persister's CPU throttle: full speed when the agent asks for it, past the lag bound, or
/// while the node has a CPU to spare; else it pauses so that its CPU time since it began
/// yielding stays within `share` of one CPU over the wall time since then.
pub fn pace(i: &PaceInput, p: &PaceParams) -> Pace {
    if i.urgent {
        return Pace::Urgent;
    }
    if i.lag >= p.lag_bound {
        return Pace::LagBound;
    }
    if i.spare {
        return Pace::SpareCpu;
    }
    if p.share <= 0.0 || !p.share.is_finite() {
        return Pace::Yield {
            pause: Duration::ZERO,
        };
    }
    let due = Duration::from_secs_f64(i.cpu.as_secs_f64() / p.share.min(1.0));
    Pace::Yield {
        pause: due.saturating_sub(i.elapsed),
    }
}

/// Whether the node had a CPU to spare over a `window` of wall time in which its CPUs were idle
/// for `idle` in all (summed over CPUs) and the persister ran for `mine`: what the persister
/// took counts as spare, so it is spare when the rest of the node left at least nine tenths of
/// one CPU unused.
pub fn spare_cpu(window: Duration, idle: Duration, mine: Duration) -> bool {
    !window.is_zero() && (idle + mine).as_secs_f64() >= 0.9 * window.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn input(cpu_ms: u64, elapsed_ms: u64) -> PaceInput {
        PaceInput {
            urgent: false,
            lag: Duration::from_secs(1),
            spare: false,
            cpu: Duration::from_millis(cpu_ms),
            elapsed: Duration::from_millis(elapsed_ms),
        }
    }

    const PARAMS: PaceParams = PaceParams {
        share: 0.05,
        lag_bound: Duration::from_secs(60),
    };

    #[test]
    fn on_busy_cpus_the_persister_keeps_to_its_share_of_one() {
        let ms = Duration::from_millis;
        // 10 ms of CPU at 5 % is due after 200 ms: 150 ms to go after 50 ms.
        assert_eq!(
            pace(&input(10, 50), &PARAMS),
            Pace::Yield { pause: ms(150) }
        );
        assert_eq!(pace(&input(10, 50), &PARAMS).pause(), ms(150));
        assert!(pace(&input(10, 50), &PARAMS).yields());
        // Within its share: no pause, but still yielding (idle I/O class).
        let within = pace(&input(10, 400), &PARAMS);
        assert_eq!(within, Pace::Yield { pause: ms(0) });
        assert!(within.yields());
        // A share of more than one CPU is one CPU; none at all is no pause.
        let whole = PaceParams {
            share: 3.0,
            ..PARAMS
        };
        assert_eq!(pace(&input(100, 40), &whole).pause(), ms(60));
        let none = PaceParams {
            share: 0.0,
            ..PARAMS
        };
        assert_eq!(pace(&input(100, 40), &none).pause(), ms(0));
    }

    #[test]
    fn the_persister_goes_full_speed_at_the_end_past_the_lag_bound_or_on_a_spare_cpu() {
        let busy = input(1_000, 100);
        let urgent = PaceInput {
            urgent: true,
            ..busy
        };
        assert_eq!(pace(&urgent, &PARAMS), Pace::Urgent);
        let late = PaceInput {
            lag: PARAMS.lag_bound,
            ..busy
        };
        assert_eq!(pace(&late, &PARAMS), Pace::LagBound);
        let spare = PaceInput {
            spare: true,
            ..busy
        };
        assert_eq!(pace(&spare, &PARAMS), Pace::SpareCpu);
        for p in [Pace::Urgent, Pace::LagBound, Pace::SpareCpu] {
            assert!(!p.yields() && p.pause().is_zero(), "{p:?}");
            assert!(p.reason().starts_with("full speed"), "{p:?}");
        }
        assert!(pace(&busy, &PARAMS).reason().starts_with("yielding"));
    }

    #[test]
    fn a_cpu_is_spare_when_the_rest_of_the_node_leaves_most_of_one_unused() {
        let ms = Duration::from_millis;
        // 2 CPUs, 200 ms: the training keeps both busy while the persister got 60 ms.
        assert!(!spare_cpu(ms(200), ms(0), ms(60)));
        // One rank on one CPU, the persister alone on the other.
        assert!(spare_cpu(ms(200), ms(5), ms(190)));
        // The persister paused and the other CPU idled.
        assert!(spare_cpu(ms(200), ms(200), ms(0)));
        assert!(
            !spare_cpu(ms(200), ms(100), ms(50)),
            "three quarters of a CPU"
        );
        assert!(!spare_cpu(ms(0), ms(0), ms(0)), "no window yet");
    }

    #[test]
    fn the_throttle_pauses_to_the_rate() {
        let s = Duration::from_secs;
        assert_eq!(pause(100 * MIB, s(0), 0), Duration::ZERO, "no limit");
        assert_eq!(pause(100 * MIB, s(0), 100 * MIB), s(1));
        assert_eq!(
            pause(100 * MIB, Duration::from_millis(400), 100 * MIB),
            Duration::from_millis(600)
        );
        assert_eq!(pause(100 * MIB, s(2), 100 * MIB), Duration::ZERO, "behind");
    }
}
