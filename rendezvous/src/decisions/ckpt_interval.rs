//! The automatic checkpoint interval (`--ckpt-interval auto`): a pure function of the measured
//! save cost C, the job's observed mean time between failures M and the bounds, returning the
//! interval and the reason ([`decide`]).
//!
//! The model is Young's first-order optimum (J. W. Young, "A first order approximation to the
//! optimum checkpoint interval", CACM 1974): saving every `T` costs `C/T` of the time, and a
//! failure loses on average `T/2` of work plus the restart, so the lost fraction
//! `C/T + T/(2M)` is smallest at `T = √(2·C·M)`. It assumes failures arrive as a Poisson
//! process (exponential gaps) and `C ≪ M`; it breaks down when failures come within a few
//! saves of each other, which is where the lower bound (`2·C`) takes over.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::human::MAX_SECONDS;

/// The smallest interval ever returned, seconds.
pub const MIN_INTERVAL_S: f64 = 1.0;
/// The largest interval ever returned, seconds (24 h).
pub const MAX_INTERVAL_S: f64 = 86_400.0;
/// `--expected-mtbf` default: the prior for M before the job has failed, seconds (4 h).
pub const DEFAULT_EXPECTED_MTBF_S: f64 = 4.0 * 3600.0;
/// The save cost assumed before any save was measured, seconds.
pub const PRIOR_COST_S: f64 = 1.0;
/// How many of the newest measured saves C averages.
pub const COST_WINDOW: usize = 5;

/// `--ckpt-interval`: when drun asks the ranks for a coordinated checkpoint on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IntervalMode {
    /// Never (the default, torchrun's behaviour): the training script decides when to save.
    #[default]
    Off,
    /// Every this long since the last seal.
    Fixed(Duration),
    /// `√(2·C·M)` from the measured C and M, re-evaluated after each seal and each failure.
    Auto,
}

/// A `--ckpt-interval` value [`IntervalMode::parse`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} {why}")]
pub struct BadInterval {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub why: IntervalFault,
}

/// What is wrong with a `--ckpt-interval` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IntervalFault {
    /// Neither `auto`, `off` nor a number.
    #[error("is not auto, off or a number of seconds (e.g. 600)")]
    NotAForm,
    /// Zero or less, infinite or NaN.
    #[error("must be a positive, finite number of seconds (off turns it off)")]
    NotPositive,
    /// Past [`MAX_SECONDS`].
    #[error("must be at most {MAX_SECONDS} seconds (30 days)")]
    TooLong,
}

impl IntervalMode {
    /// Parses `auto`, `off` or a number of seconds (`> 0` and at most [`MAX_SECONDS`],
    /// 30 days as drun's other timeouts; fractions allowed, optional `s`).
    ///
    /// # Errors
    /// One line naming the accepted forms, or the range a number missed.
    pub fn parse(v: &str) -> Result<Self, BadInterval> {
        let bad = |why| BadInterval {
            value: v.to_string(),
            why,
        };
        match v.trim() {
            "auto" => Ok(Self::Auto),
            "off" | "0" => Ok(Self::Off),
            s => match s.trim_end_matches('s').parse::<f64>() {
                Err(_) => Err(bad(IntervalFault::NotAForm)),
                Ok(x) if !x.is_finite() || x <= 0.0 => Err(bad(IntervalFault::NotPositive)),
                Ok(x) if x > MAX_SECONDS => Err(bad(IntervalFault::TooLong)),
                Ok(x) => Ok(Self::Fixed(Duration::from_secs_f64(x))),
            },
        }
    }

    /// The form [`Self::parse`] reads back (`auto`, `off`, seconds).
    pub fn to_arg(&self) -> String {
        match self {
            Self::Off => "off".into(),
            Self::Auto => "auto".into(),
            Self::Fixed(d) => format!("{}", d.as_secs_f64()),
        }
    }

    /// Whether drun requests checkpoints on its own.
    pub fn is_on(&self) -> bool {
        !matches!(self, Self::Off)
    }
}

/// `--ckpt-interval` and `--expected-mtbf` of a run, as the sessions get them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalConfig {
    /// `--ckpt-interval`.
    pub mode: IntervalMode,
    /// `--expected-mtbf`: M before the job has failed (default [`DEFAULT_EXPECTED_MTBF_S`]).
    pub expected_mtbf: Duration,
}

impl Default for IntervalConfig {
    fn default() -> Self {
        Self {
            mode: IntervalMode::Off,
            expected_mtbf: Duration::from_secs_f64(DEFAULT_EXPECTED_MTBF_S),
        }
    }
}

impl IntervalConfig {
    /// [`decide`] with these settings.
    pub fn decide(&self, obs: &Observed) -> Option<Interval> {
        decide(self.mode, obs, self.expected_mtbf.as_secs_f64())
    }
}

/// What the job has measured so far (all times in seconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Save costs of sealed checkpoints, oldest first: the time the training waited (the first
    /// rank's save start → the seal; with `--ckpt-memory`, → the staged answer).
    pub save_costs_s: Vec<f64>,
    /// `--ckpt-memory`: how long each staged checkpoint took to reach `--ckpt-dir` after the
    /// training went on (staged answer → seal), oldest first; empty without it.
    pub persist_costs_s: Vec<f64>,
    /// Failures (worker failures and lost nodes) recorded job-wide.
    pub failures: u32,
    /// How long the job has been running: now − its first formation.
    pub exposure_s: f64,
    /// Mean restart cost seen at re-forms (round opened → plan written), 0 when none.
    pub restart_s: f64,
}

/// The interval drun uses and why (the record `ckpt/interval`, shown by `status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Interval {
    /// Seconds between checkpoints (from the last seal, or the generation's start).
    pub interval_s: f64,
    /// C: the save cost used, seconds.
    pub cost_s: f64,
    /// Whether C was measured (`false`: [`PRIOR_COST_S`]).
    pub cost_measured: bool,
    /// `--ckpt-memory`: the persistence behind the training (staged answer → seal, mean of the
    /// newest), seconds; C is then the stall alone. `None` without staged checkpoints.
    pub persist_s: Option<f64>,
    /// M: the mean time between failures used, seconds.
    pub mtbf_s: f64,
    /// Failures M was computed from (0: the prior).
    pub failures: u32,
    /// Expected work lost per failure: interval/2 + restart cost, seconds.
    pub expected_loss_s: f64,
    /// One line: how the interval was chosen.
    pub reason: String,
}

impl Interval {
    /// The interval as a [`Duration`]: [`Duration::MAX`] past what a `Duration` holds, zero for
    /// a negative or NaN value (an interval read back from another process is not trusted).
    pub fn duration(&self) -> Duration {
        match Duration::try_from_secs_f64(self.interval_s) {
            Ok(d) => d,
            Err(_) if self.interval_s > 0.0 => Duration::MAX,
            Err(_) => Duration::ZERO,
        }
    }

    /// Whether `other` changes what a human would read (the log prints one line per change):
    /// the interval moved by more than 5 % or the number of failures changed.
    pub fn differs(&self, other: &Interval) -> bool {
        other.failures != self.failures
            || (other.interval_s - self.interval_s).abs() > 0.05 * self.interval_s.max(1e-9)
    }

    /// The log line.
    pub fn line(&self) -> String {
        format!(
            "checkpoint interval {:.1} s (C = {:.2} s{}{}, M = {:.1} s{}; expected lost work per failure ≈ {:.1} s): {}",
            self.interval_s,
            self.cost_s,
            if self.cost_measured { "" } else { " assumed" },
            self.persist_s.map_or(String::new(), |p| format!(
                " the training's stall; persisted in {p:.2} s behind it"
            )),
            self.mtbf_s,
            if self.failures == 0 {
                " prior".to_string()
            } else {
                format!(" from {} failure(s)", self.failures)
            },
            self.expected_loss_s,
            self.reason
        )
    }
}

/// Young's optimum `√(2·C·M)`, seconds.
///
/// ```
/// let t = drun_rendezvous::decisions::ckpt_interval::optimum(0.5, 20.0);
/// assert!((t - 20f64.sqrt()).abs() < 1e-9);
/// ```
pub fn optimum(cost_s: f64, mtbf_s: f64) -> f64 {
    (2.0 * cost_s * mtbf_s).sqrt()
}

/// C: the mean of the newest [`COST_WINDOW`] measured saves, or `None` before any.
pub fn save_cost(costs_s: &[f64]) -> Option<f64> {
    let recent = &costs_s[costs_s.len().saturating_sub(COST_WINDOW)..];
    (!recent.is_empty()).then(|| recent.iter().sum::<f64>() / recent.len() as f64)
}

/// M: with failures, the exposure divided by their number (the maximum-likelihood mean of
/// exponential gaps); before the first, the prior `expected_mtbf_s`, or the exposure when the
/// job has already run longer than that without failing.
pub fn mtbf(obs: &Observed, expected_mtbf_s: f64) -> f64 {
    if obs.failures == 0 {
        expected_mtbf_s.max(obs.exposure_s)
    } else {
        obs.exposure_s.max(0.0) / f64::from(obs.failures)
    }
}

/// The interval for `mode` given what was observed: `None` when off. Fixed intervals are
/// reported with the same C, M and expected loss as `auto`.
pub fn decide(mode: IntervalMode, obs: &Observed, expected_mtbf_s: f64) -> Option<Interval> {
    let measured = save_cost(&obs.save_costs_s);
    let cost_s = measured.unwrap_or(PRIOR_COST_S);
    let mtbf_s = mtbf(obs, expected_mtbf_s);
    let (interval_s, reason) = match mode {
        IntervalMode::Off => return None,
        IntervalMode::Fixed(d) => (d.as_secs_f64(), "fixed by --ckpt-interval".to_string()),
        IntervalMode::Auto => {
            let best = optimum(cost_s, mtbf_s);
            let persist_s = save_cost(&obs.persist_costs_s).unwrap_or(0.0);
            let floor = MIN_INTERVAL_S.max(2.0 * cost_s);
            if best < persist_s && persist_s > floor {
                // Staged steps reach the disk one at a time: saving faster than that only
                // queues them in memory until the budget sends saves straight to disk.
                (
                    persist_s,
                    format!("√(2·C·M) = {best:.1}s clamped up to the persistence time (staged checkpoints reach --ckpt-dir no faster)"),
                )
            } else if best < floor {
                let why = if floor > MIN_INTERVAL_S {
                    "clamped up to 2·C (failures come within a few saves of each other: the first-order model no longer holds)"
                } else {
                    "clamped up to the 1s minimum"
                };
                (floor, format!("√(2·C·M) = {best:.1}s {why}"))
            } else if best > MAX_INTERVAL_S {
                (
                    MAX_INTERVAL_S,
                    format!("√(2·C·M) = {best:.0}s clamped down to 24h"),
                )
            } else {
                (best, "√(2·C·M)".to_string())
            }
        }
    };
    Some(Interval {
        interval_s,
        cost_s,
        cost_measured: measured.is_some(),
        persist_s: save_cost(&obs.persist_costs_s),
        mtbf_s,
        failures: obs.failures,
        expected_loss_s: interval_s / 2.0 + obs.restart_s,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `text` fuzz target: a number of seconds past what a `Duration` holds
    /// panicked instead of being refused.
    #[test]
    fn an_interval_too_long_or_not_a_number_is_refused_not_a_panic() {
        for v in [
            "21111111111111111111111",
            "1e400",
            "nan",
            "inf",
            "-5",
            "1e300s",
        ] {
            assert!(IntervalMode::parse(v).is_err(), "{v}");
        }
        assert_eq!(
            IntervalMode::parse("600s"),
            Ok(IntervalMode::Fixed(Duration::from_secs(600)))
        );
        assert!(IntervalMode::parse("1e20")
            .unwrap_err()
            .to_string()
            .contains("at most 2592000 seconds"));
        assert!(IntervalMode::parse("-5")
            .unwrap_err()
            .to_string()
            .contains("positive, finite"));
        assert!(IntervalMode::parse("soon")
            .unwrap_err()
            .to_string()
            .contains("not auto, off"));
        assert!(IntervalMode::parse("2592000").is_ok());
        let at = |s: f64| {
            Interval {
                interval_s: s,
                ..Default::default()
            }
            .duration()
        };
        assert_eq!(at(1e300), Duration::MAX);
        assert_eq!(at(f64::NAN), Duration::ZERO);
        assert_eq!(at(-1.0), Duration::ZERO);
        assert_eq!(at(2.5), Duration::from_millis(2500));
    }

    fn obs(costs: &[f64], failures: u32, exposure_s: f64) -> Observed {
        Observed {
            save_costs_s: costs.to_vec(),
            persist_costs_s: Vec::new(),
            failures,
            exposure_s,
            restart_s: 2.0,
        }
    }

    fn auto(o: &Observed, prior: f64) -> Interval {
        decide(IntervalMode::Auto, o, prior).unwrap()
    }

    #[test]
    fn known_values() {
        // C = 0.5 s, killed every 20 s: √(2·0.5·20) ≈ 4.47 s.
        let i = auto(&obs(&[0.5], 3, 60.0), 3600.0);
        assert!((i.interval_s - 20f64.sqrt()).abs() < 1e-9, "{i:?}");
        assert_eq!(i.mtbf_s, 20.0);
        assert!((i.expected_loss_s - (20f64.sqrt() / 2.0 + 2.0)).abs() < 1e-9);
        assert_eq!(i.reason, "√(2·C·M)");
        // C = 30 s, M = 1 h: 465 s.
        let i = auto(&obs(&[30.0], 4, 4.0 * 3600.0), 1.0);
        assert!((i.interval_s - 464.758).abs() < 1e-3);
    }

    #[test]
    fn in_memory_the_stall_is_c_and_the_persistence_is_reported_apart() {
        // 60 s to disk with 2 h between failures: ~14 % of the training; a 0.2 s stall with
        // the disk 10 s behind it: √(2·0.2·7200) ≈ 54 s, and the line names both.
        let disk = auto(&obs(&[60.0], 4, 4.0 * 7200.0), 1.0);
        assert!((disk.interval_s - 929.516).abs() < 1e-3, "{disk:?}");
        assert_eq!(disk.persist_s, None);
        assert!(!disk.line().contains("stall"), "{}", disk.line());
        let memory = Observed {
            persist_costs_s: vec![9.0, 11.0],
            ..obs(&[0.2, 0.2], 4, 4.0 * 7200.0)
        };
        let i = auto(&memory, 1.0);
        assert!((i.cost_s - 0.2).abs() < 1e-12, "C is the stall: {i:?}");
        assert!((i.interval_s - 53.666).abs() < 1e-3, "{i:?}");
        assert_eq!(i.persist_s, Some(10.0));
        // Failures every 100 s: √(2·0.2·100) ≈ 6.3 s, but a step takes 60 s to reach the disk:
        // the interval is the persistence time, not a queue growing in memory.
        let often = Observed {
            persist_costs_s: vec![60.0],
            ..obs(&[0.2], 4, 400.0)
        };
        let j = auto(&often, 1.0);
        assert_eq!(j.interval_s, 60.0, "{j:?}");
        assert!(j.reason.contains("persistence time"), "{}", j.reason);
        let line = i.line();
        assert!(
            line.contains("C = 0.20 s the training's stall; persisted in 10.00 s behind it"),
            "{line}"
        );
    }

    #[test]
    fn cost_averages_the_newest_saves() {
        assert_eq!(save_cost(&[]), None);
        assert_eq!(save_cost(&[100.0, 1.0, 1.0, 1.0, 3.0, 3.0]), Some(1.8));
    }

    #[test]
    fn prior_before_any_failure_or_save() {
        let i = auto(&obs(&[], 0, 10.0), 200.0);
        assert!(!i.cost_measured);
        assert_eq!((i.cost_s, i.mtbf_s, i.failures), (PRIOR_COST_S, 200.0, 0));
        assert!((i.interval_s - 20.0).abs() < 1e-9);
        assert!(i.line().contains("M = 200.0 s prior"), "{}", i.line());
        // A job that ran longer than the prior without failing: M grows with it.
        assert_eq!(auto(&obs(&[1.0], 0, 800.0), 200.0).mtbf_s, 800.0);
    }

    #[test]
    fn updates_after_failures() {
        let before = auto(&obs(&[0.5], 0, 40.0), 3600.0);
        let after = auto(&obs(&[0.5], 2, 40.0), 3600.0);
        assert_eq!(after.mtbf_s, 20.0);
        assert!(after.interval_s < before.interval_s / 5.0);
        assert!(before.differs(&after));
        // More failures in the same time: shorter; more time without one: longer.
        assert!(auto(&obs(&[0.5], 4, 40.0), 1.0).interval_s < after.interval_s);
        assert!(auto(&obs(&[0.5], 2, 80.0), 1.0).interval_s > after.interval_s);
        assert!(!after.differs(&auto(&obs(&[0.5], 2, 40.5), 1.0)));
    }

    #[test]
    fn clamps() {
        // Failures every 1.5 s with 1 s saves: √3 ≈ 1.7 s < 2·C.
        let i = auto(&obs(&[1.0], 4, 6.0), 1.0);
        assert_eq!(i.interval_s, 2.0);
        assert!(i.reason.contains("2·C"), "{}", i.reason);
        let i = auto(&obs(&[0.01], 10, 10.0), 1.0);
        assert_eq!(i.interval_s, MIN_INTERVAL_S);
        assert!(i.reason.contains("1s minimum"));
        let i = auto(&obs(&[600.0], 0, 0.0), 1e9);
        assert_eq!(i.interval_s, MAX_INTERVAL_S);
        assert!(i.reason.contains("24h"));
    }

    #[test]
    fn modes() {
        assert_eq!(decide(IntervalMode::Off, &obs(&[1.0], 1, 9.0), 1.0), None);
        let f = decide(
            IntervalMode::Fixed(Duration::from_secs(30)),
            &obs(&[1.0], 1, 9.0),
            1.0,
        )
        .unwrap();
        assert_eq!((f.interval_s, f.mtbf_s), (30.0, 9.0));
        assert_eq!(IntervalMode::parse("auto"), Ok(IntervalMode::Auto));
        assert_eq!(IntervalMode::parse("off"), Ok(IntervalMode::Off));
        assert_eq!(
            IntervalMode::parse("600"),
            Ok(IntervalMode::Fixed(Duration::from_secs(600)))
        );
        assert_eq!(
            IntervalMode::parse("2.5s"),
            Ok(IntervalMode::Fixed(Duration::from_millis(2500)))
        );
        for m in [
            IntervalMode::Auto,
            IntervalMode::Off,
            IntervalMode::Fixed(Duration::from_millis(2500)),
        ] {
            assert_eq!(IntervalMode::parse(&m.to_arg()), Ok(m));
        }
        for bad in ["-1", "soon", "nan", ""] {
            assert!(IntervalMode::parse(bad).is_err(), "{bad}");
        }
    }
}
