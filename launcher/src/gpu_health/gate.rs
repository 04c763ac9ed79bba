//! When the node's GPUs are checked, and whether a join may go (pure, on instants).
//!
//! A join goes at once on a fresh healthy (or unknown) verdict; it waits for a probe when the
//! node was never checked, when its last check is stale, or when one of its own workers just
//! failed (its GPUs are the first suspects); it stands by while a GPU is unhealthy, probing again
//! every [`Cadence::standing_by`]. While the node trains its GPUs are probed every
//! [`Cadence::training`], so that a re-form after another node's loss finds a fresh verdict and
//! does not wait for `nvidia-smi`.

use std::time::Duration;

use tokio::time::Instant;

use super::judge::{Finding, Verdict};

/// How often probes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// While the node trains (keeps the verdict fresh for the next re-form).
    pub training: Duration,
    /// While the node stands by with an unhealthy GPU.
    pub standing_by: Duration,
    /// A verdict older than this is not trusted for a join.
    pub fresh_for: Duration,
}

impl Default for Cadence {
    fn default() -> Self {
        Cadence {
            training: Duration::from_secs(30),
            standing_by: Duration::from_secs(30),
            fresh_for: Duration::from_secs(90),
        }
    }
}

/// What the checks know.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checks {
    /// The last verdict and when its probe ended.
    pub last: Option<(Instant, Verdict)>,
    /// A probe is under way.
    pub probing: bool,
    /// One of this node's workers failed since the last probe.
    pub suspect: bool,
}

/// Whether a join may go now.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// It may.
    Go,
    /// Hold it for a probe (start one unless one is under way), for this reason.
    Probe(&'static str),
    /// Hold it: these GPUs may not train.
    StandBy(Vec<Finding>),
}

/// Whether a join may go at `now`.
pub fn join_gate(c: &Checks, now: Instant, cadence: &Cadence) -> Gate {
    if c.probing {
        return Gate::Probe("a GPU check is under way");
    }
    match &c.last {
        None => Gate::Probe("this node's GPUs were not checked yet"),
        Some(_) if c.suspect => {
            Gate::Probe("a worker of this node failed: its GPUs are checked again")
        }
        Some((at, _)) if now.saturating_duration_since(*at) > cadence.fresh_for => {
            Gate::Probe("the last GPU check is stale")
        }
        Some((_, Verdict::Unhealthy(f))) => Gate::StandBy(f.clone()),
        Some((_, Verdict::Healthy { .. } | Verdict::Unknown(_))) => Gate::Go,
    }
}

/// When the next probe is due unasked (`standing_by`: a join is held for an unhealthy GPU).
pub fn next_probe(c: &Checks, standing_by: bool, cadence: &Cadence) -> Option<Instant> {
    if c.probing {
        return None;
    }
    let (at, _) = c.last.as_ref()?;
    Some(
        *at + if standing_by {
            cadence.standing_by
        } else {
            cadence.training
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Verdict {
        Verdict::Healthy { gpus: 2 }
    }

    fn sick() -> Verdict {
        Verdict::Unhealthy(vec![Finding {
            gpu: "GPU 1 (0000:3b:00.0)".to_string(),
            reason: "2 uncorrectable ECC error(s) since the driver loaded".to_string(),
        }])
    }

    #[test]
    fn the_first_join_waits_for_the_first_check() {
        let now = Instant::now();
        let c = Checks::default();
        assert!(matches!(
            join_gate(&c, now, &Cadence::default()),
            Gate::Probe(_)
        ));
        let c = Checks { probing: true, ..c };
        assert_eq!(
            join_gate(&c, now, &Cadence::default()),
            Gate::Probe("a GPU check is under way")
        );
    }

    #[test]
    fn a_fresh_healthy_or_unknown_verdict_lets_the_join_go() {
        let t0 = Instant::now();
        let cad = Cadence::default();
        for v in [healthy(), Verdict::Unknown("cannot run nvidia-smi".into())] {
            let c = Checks {
                last: Some((t0, v)),
                ..Checks::default()
            };
            assert_eq!(join_gate(&c, t0 + Duration::from_secs(89), &cad), Gate::Go);
            assert_eq!(
                join_gate(&c, t0 + Duration::from_secs(91), &cad),
                Gate::Probe("the last GPU check is stale")
            );
        }
    }

    #[test]
    fn a_local_worker_failure_makes_the_gpus_suspect_again() {
        let t0 = Instant::now();
        let c = Checks {
            last: Some((t0, healthy())),
            suspect: true,
            ..Checks::default()
        };
        assert!(matches!(
            join_gate(&c, t0, &Cadence::default()),
            Gate::Probe(_)
        ));
    }

    #[test]
    fn an_unhealthy_gpu_holds_the_join_and_is_probed_again_at_the_stand_by_cadence() {
        let t0 = Instant::now();
        let cad = Cadence {
            training: Duration::from_secs(60),
            standing_by: Duration::from_secs(5),
            fresh_for: Duration::from_secs(90),
        };
        let c = Checks {
            last: Some((t0, sick())),
            ..Checks::default()
        };
        let Gate::StandBy(f) = join_gate(&c, t0, &cad) else {
            panic!()
        };
        assert_eq!(f[0].gpu, "GPU 1 (0000:3b:00.0)");
        assert_eq!(
            next_probe(&c, true, &cad),
            Some(t0 + Duration::from_secs(5))
        );
        assert_eq!(
            next_probe(&c, false, &cad),
            Some(t0 + Duration::from_secs(60))
        );
        let c = Checks { probing: true, ..c };
        assert_eq!(next_probe(&c, true, &cad), None);
    }
}
