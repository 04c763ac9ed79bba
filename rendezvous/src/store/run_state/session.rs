//! The door's transactions for a session: entering, closing and ending a generation, spending
//! a restart, save requests, a node's loss, its session's claim, accusations of silence.

use std::time::Duration;

use super::{encode, encode_generation, RunState};
use crate::store::records::{FailureRecord, Interval, Restarts, RootCause, RunEnd, SaveRequest};
use crate::store::{Compare, LeaseId, Op};
use crate::StoreError;

/// One worker failure paid from the job-wide budget: the counters spent and generation `g`
/// closed, in one transaction.
#[derive(Debug)]
pub struct SpendRestart<'a> {
    /// The generation the failure ends.
    pub g: u64,
    /// `gen/current`'s `mod_revision` when the verdict was taken.
    pub gen_rev: i64,
    /// `restarts`' `mod_revision` when the verdict was taken (0: never written).
    pub restarts_rev: i64,
    /// The counters after the spend.
    pub next: &'a Restarts,
    /// Why `g` closes (`gen/<g>/closed`).
    pub closed: &'a str,
    /// The worker failure, recorded as `g`'s root cause.
    pub root_cause: Option<&'a RootCause>,
    /// `g`'s record in the job-wide failure history.
    pub failure: &'a FailureRecord,
}

impl RunState {
    /// Grants this node's lease.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.store.lease_grant(ttl).await
    }

    /// Renews `lease` (a reconnecting agent's); [`StoreError::LeaseLost`] when it is gone.
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.store.lease_keep_alive(lease).await
    }

    /// Revokes `lease`: the keys under it (a membership, a join, accusations) go with it.
    pub async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.store.lease_revoke(lease).await
    }

    /// Records why `node` is gone (`lost/<node>`), read by the member that closes its
    /// generation.
    pub async fn record_lost(&self, node: &str, reason: &str) -> Result<(), StoreError> {
        self.store
            .put(&self.keys.lost(node), reason.as_bytes().to_vec(), None)
            .await
            .map(drop)
    }

    /// Server-side: records under `lease` that the session with `token` resumed `node`'s
    /// lease `lease` (`sessions/<node>/<lease>`).
    pub async fn claim(&self, node: &str, token: &str, lease: LeaseId) -> Result<(), StoreError> {
        self.store
            .put(
                &self.keys.session_owner(node, lease),
                token.as_bytes().to_vec(),
                Some(lease),
            )
            .await
            .map(drop)
    }

    /// Enters generation `g`: `node`'s membership key under `lease` replaces its join, in one
    /// transaction. [`StoreError::LeaseLost`] when the lease is gone.
    pub async fn enter_generation(
        &self,
        g: u64,
        node: &str,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        let ops = vec![
            Op::Put {
                key: self.keys.member(g, node),
                value: b"{}".to_vec(),
                lease: Some(lease),
            },
            Op::Delete(self.keys.waiting(node)),
        ];
        self.txn(vec![], ops).await.map(drop)
    }

    /// Records that `node`'s workers of generation `g` all succeeded (`done/<g>/<node>`).
    pub async fn record_done(&self, g: u64, node: &str) -> Result<(), StoreError> {
        self.store
            .put(&self.keys.done(g, node), b"{}".to_vec(), None)
            .await
            .map(drop)
    }

    /// Closes generation `g` with `reason` if it is still current at `rev` and not closed yet,
    /// with `failure` recorded in the job-wide failure history in the same transaction;
    /// whether this call closed it.
    pub async fn close(
        &self,
        g: u64,
        rev: i64,
        reason: &str,
        failure: Option<&FailureRecord>,
    ) -> Result<bool, StoreError> {
        let ops = [Op::put(self.keys.closed(g), reason)]
            .into_iter()
            .chain(failure.map(|f| Op::put(self.keys.failure(g), encode(f))))
            .collect();
        self.txn(
            vec![
                Compare::ModRevisionEquals(self.keys.gen_current(), rev),
                Compare::Missing(self.keys.closed(g)),
            ],
            ops,
        )
        .await
    }

    /// Spends one restart and closes `s.g` (see [`SpendRestart`]); whether the guards held.
    pub async fn spend_restart(&self, s: SpendRestart<'_>) -> Result<bool, StoreError> {
        let ops = [
            Op::put(self.keys.restarts(), encode(s.next)),
            Op::put(self.keys.closed(s.g), s.closed),
        ]
        .into_iter()
        .chain(self.root_cause_put(s.g, s.root_cause))
        .chain(Some(Op::put(self.keys.failure(s.g), encode(s.failure))))
        .collect();
        self.txn(
            vec![
                Compare::ModRevisionEquals(self.keys.gen_current(), s.gen_rev),
                Compare::ModRevisionEquals(self.keys.restarts(), s.restarts_rev),
                Compare::Missing(self.keys.closed(s.g)),
            ],
            ops,
        )
        .await
    }

    /// Ends the run as `end` when a worker failure of generation `g` spent the budget, unless
    /// it has ended already: the last counters and `g`'s root cause with it.
    pub async fn end_spent(
        &self,
        g: u64,
        end: &RunEnd,
        last: &Restarts,
        root_cause: Option<&RootCause>,
    ) -> Result<bool, StoreError> {
        let ops = [
            Op::put(self.keys.finished(), encode(end)),
            Op::put(self.keys.restarts(), encode(last)),
        ]
        .into_iter()
        .chain(self.root_cause_put(g, root_cause))
        .collect();
        self.txn(vec![Compare::Missing(self.keys.finished())], ops)
            .await
    }

    /// The exit barrier's write: ends the run as `end` unless it ended or generation `g` was
    /// closed meanwhile; whether this call ended it.
    pub async fn finish(&self, g: u64, end: &RunEnd) -> Result<bool, StoreError> {
        self.txn(
            vec![
                Compare::Missing(self.keys.finished()),
                Compare::Missing(self.keys.closed(g)),
            ],
            vec![Op::put(self.keys.finished(), encode(end))],
        )
        .await
    }

    /// The write of `g`'s root cause, when a worker failed.
    fn root_cause_put(&self, g: u64, cause: Option<&RootCause>) -> Option<Op> {
        cause.map(|c| Op::put(self.keys.root_cause(g), encode(c)))
    }

    /// Writes generation `g`'s request for a coordinated checkpoint once, while `g` is current
    /// (`gen/<g>/preempt`, or `gen/<g>/scale-up-save` for a scale-up); whether it was written.
    pub async fn request_save(&self, g: u64, req: &SaveRequest) -> Result<bool, StoreError> {
        let key = if req.scale_up {
            self.keys.scale_up_save(g)
        } else {
            self.keys.preempt(g)
        };
        self.txn(
            vec![
                Compare::Missing(key.clone()),
                Compare::ValueEquals(self.keys.gen_current(), encode_generation(g)),
            ],
            vec![Op::put(key, encode(req))],
        )
        .await
    }

    /// Writes generation `g`'s interval save request once per checkpoint
    /// (`gen/<g>/save-due/<req.latest_before>`), while `g` is current and `ckpt/latest` is
    /// still at `mod_revision` `latest_rev` (`None`: missing); whether it was written.
    pub async fn request_interval_save(
        &self,
        g: u64,
        latest_rev: Option<i64>,
        req: &SaveRequest,
    ) -> Result<bool, StoreError> {
        let key = self.keys.save_due(g, &req.latest_before);
        let latest_guard = match latest_rev {
            Some(rev) => Compare::ModRevisionEquals(self.keys.ckpt_latest(), rev),
            None => Compare::Missing(self.keys.ckpt_latest()),
        };
        self.txn(
            vec![
                Compare::Missing(key.clone()),
                Compare::ValueEquals(self.keys.gen_current(), encode_generation(g)),
                latest_guard,
            ],
            vec![Op::put(key, encode(req))],
        )
        .await
    }

    /// Records the checkpoint interval in force (`ckpt/interval`).
    pub async fn record_interval(&self, interval: &Interval) -> Result<(), StoreError> {
        self.store
            .put(&self.keys.ckpt_interval(), encode(interval), None)
            .await
            .map(drop)
    }

    /// `by`'s accusations of silence in generation `g` (`gen/<g>/silent/<accused>/<by>`):
    /// writes those of `write` under `lease` and withdraws those of `withdraw`, in one
    /// transaction (none when both are empty).
    pub async fn accuse(
        &self,
        g: u64,
        by: &str,
        write: &[String],
        withdraw: &[String],
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        let mut ops: Vec<Op> = withdraw
            .iter()
            .map(|a| Op::Delete(self.keys.silent(g, a, by)))
            .collect();
        ops.extend(write.iter().map(|a| Op::Put {
            key: self.keys.silent(g, a, by),
            value: b"{}".to_vec(),
            lease: Some(lease),
        }));
        if ops.is_empty() {
            return Ok(());
        }
        self.txn(vec![], ops).await.map(drop)
    }
}
