//! The job-wide failure history (keys `failure/<g>`) and what `--ckpt-interval auto` reads
//! from the store: the measured save costs, the failures, how long the job has run
//! ([`observe`], the I/O; [`observed`], the pure part).
//!
//! A record is written in the transaction that closes generation `g` for a worker failure or a
//! lost node (never for a newcomer admitted or a bad checkpoint), so there is exactly one per
//! failed generation and it survives re-forms — and requeues, on a store that outlives the job
//! (etcd).

use crate::decisions::ckpt_interval::Observed;
use crate::decisions::formation::Formation;
use crate::ledger::Manifest;
use crate::store::run_state::RunState;
use crate::{Ledger, StoreError};

pub use crate::store::records::FailureRecord;

/// How many of the newest re-forms the restart cost averages.
const RESTARTS_AVERAGED: u64 = 10;

/// What the job measured (pure): save costs of `manifests` (oldest first), the `failures`, the
/// time since the first formation `first_formed_ms` until `now_ms`, and the mean of the
/// re-forms' formation times `restart_ms` (all milliseconds since the Unix epoch or durations).
pub fn observed(
    manifests: &[Manifest],
    failures: &[FailureRecord],
    first_formed_ms: Option<u64>,
    restart_ms: &[u64],
    now_ms: u64,
) -> Observed {
    let mut sealed: Vec<&Manifest> = manifests.iter().filter(|m| m.save_ms.is_some()).collect();
    sealed.sort_by_key(|m| m.sealed_at_ms);
    let restart_s = if restart_ms.is_empty() {
        0.0
    } else {
        restart_ms.iter().sum::<u64>() as f64 / restart_ms.len() as f64 / 1000.0
    };
    Observed {
        // C is what the training waited: the stall when the step was staged in memory
        // (`--ckpt-memory`), else the whole save; the persistence behind it is reported apart.
        save_costs_s: sealed
            .iter()
            .filter_map(|m| m.stall_ms.or(m.save_ms))
            .map(|ms| ms as f64 / 1000.0)
            .collect(),
        persist_costs_s: sealed
            .iter()
            .filter_map(|m| Some(m.save_ms?.saturating_sub(m.stall_ms?)))
            .map(|ms| ms as f64 / 1000.0)
            .collect(),
        failures: failures.len() as u32,
        exposure_s: first_formed_ms.map_or(0.0, |t| now_ms.saturating_sub(t) as f64 / 1000.0),
        restart_s,
    }
}

/// Reads what [`observed`] needs for a run now running generation `g`.
///
/// # Errors
/// Store errors; a record that does not decode.
pub async fn observe(
    state: &RunState,
    ledger: &Ledger,
    g: u64,
    now_ms: u64,
) -> Result<Observed, StoreError> {
    let manifests = ledger.manifests().await?;
    let failures = state.failures().await?;
    let first = state.formation(1).await?.map(|f| f.formed_at_ms);
    let mut restarts = Vec::new();
    for h in g.saturating_sub(RESTARTS_AVERAGED - 1).max(2)..=g {
        if let Some(f) = state.formation(h).await? {
            restarts.push(Formation::duration_ms(&f));
        }
    }
    Ok(observed(&manifests, &failures, first, &restarts, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(sealed_at_ms: u64, save_ms: Option<u64>) -> Manifest {
        Manifest {
            run_id: "r".into(),
            step: sealed_at_ms,
            generation: 1,
            world_size: 1,
            cursor: Default::default(),
            files: vec![],
            sealed_at_ms,
            adopted_from: None,
            save_ms,
            stall_ms: None,
        }
    }

    #[test]
    fn observed_from_records() {
        let fail = |g, at_ms| FailureRecord {
            generation: g,
            at_ms,
            reason: "rank 0 exited with 1".into(),
        };
        let o = observed(
            &[
                manifest(9_000, Some(700)),
                manifest(3_000, Some(500)),
                manifest(6_000, None),
            ],
            &[fail(1, 21_000), fail(2, 41_000)],
            Some(1_000),
            &[200, 400],
            61_000,
        );
        assert_eq!(o.save_costs_s, vec![0.5, 0.7]);
        assert_eq!(o.failures, 2);
        assert_eq!(o.exposure_s, 60.0);
        assert!((o.restart_s - 0.3).abs() < 1e-9);
        let none = observed(&[], &[], None, &[], 5);
        assert_eq!(none, Observed::default());
    }

    #[test]
    fn a_step_staged_in_memory_costs_its_stall_and_persists_apart() {
        let staged = Manifest {
            stall_ms: Some(40),
            ..manifest(9_000, Some(2_040))
        };
        let o = observed(
            &[manifest(3_000, Some(500)), staged],
            &[],
            Some(1_000),
            &[],
            10_000,
        );
        assert_eq!(
            o.save_costs_s,
            vec![0.5, 0.04],
            "C is what the training waited"
        );
        assert_eq!(o.persist_costs_s, vec![2.0], "the disk's time behind it");
    }
}
