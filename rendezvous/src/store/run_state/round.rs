//! The door's transactions for a round: a join, the decider's role and progress line, the
//! formation of a generation, a failed round's verdict, the restart counters.

use super::{encode, encode_generation, RunState};
use crate::store::records::{
    Formation, Join, Manifest, Plan, RestartCause, Restarts, RoundFailure,
};
use crate::store::{Compare, LeaseId, Op};
use crate::StoreError;

/// Everything the decider writes to form generation `g + 1`, in one transaction.
#[derive(Debug)]
pub struct FormGeneration<'a> {
    /// The generation formed from (0: none yet).
    pub g: u64,
    /// `gen/current`'s `mod_revision` when read: the guard against a concurrent formation.
    pub rev: i64,
    /// The plan of `g + 1`.
    pub plan: &'a Plan,
    /// Its formation record.
    pub formation: &'a Formation,
    /// A manifest from a node's checkpoint directory to record in the ledger (the plan
    /// resumes from it).
    pub import: Option<&'a Manifest>,
    /// `ckpt/latest`'s `mod_revision` when the resume point was chosen (0: missing): a seal
    /// since then fails the formation.
    pub latest_revision: i64,
    /// `g` was never closed (every member lost its lease at once): the restart counters to
    /// write (one more membership restart) and the `mod_revision` they were read at.
    pub unclosed: Option<(&'a Restarts, i64)>,
}

impl RunState {
    /// Writes `join` as `waiting/<node>` under `lease`. `returning`: the node comes back after
    /// generation `returning` (0: none), so its `lost/<node>` record and that generation's
    /// membership key go in the same transaction (a decider never sees a survivor of a
    /// re-form in neither the members nor the waiting set).
    pub async fn join(
        &self,
        join: &Join,
        lease: LeaseId,
        returning: Option<u64>,
    ) -> Result<(), StoreError> {
        let node = &join.candidate.node_id;
        let mut ops = Vec::new();
        if let Some(last) = returning {
            ops.push(Op::Delete(self.keys.lost(node)));
            if last > 0 {
                ops.push(Op::Delete(self.keys.member(last, node)));
            }
        }
        ops.push(Op::Put {
            key: self.keys.waiting(node),
            value: encode(join),
            lease: Some(lease),
        });
        self.txn(vec![], ops).await?;
        Ok(())
    }

    /// Adds one restart of `cause` to the job-wide counters (compare-and-swap loop).
    pub async fn record_restart(&self, cause: RestartCause) -> Result<Restarts, StoreError> {
        loop {
            let (mut r, rev) = self.restarts().await?;
            match cause {
                RestartCause::Failure => r.failures += 1,
                RestartCause::Membership => r.membership += 1,
            }
            let key = self.keys.restarts();
            if self
                .txn(
                    vec![Compare::ModRevisionEquals(key.clone(), rev)],
                    vec![Op::put(key, encode(&r))],
                )
                .await?
            {
                return Ok(r);
            }
        }
    }

    /// Creates the round's decider key for `node` under `lease` unless another node holds it;
    /// whether `node` decides now. A lost lease is `false`.
    pub async fn lead(&self, node: &str, lease: LeaseId) -> Result<bool, StoreError> {
        let key = self.keys.leader();
        // Read first: when a round has a decider, its thousand other nodes learn so from one
        // shared read instead of a thousand failing transactions.
        if let Some(value) = self.leader().await? {
            return Ok(value == node.as_bytes());
        }
        let put = Op::Put {
            key: key.clone(),
            value: node.as_bytes().to_vec(),
            lease: Some(lease),
        };
        match self.txn(vec![Compare::Missing(key)], vec![put]).await {
            Ok(true) => Ok(true),
            Ok(false) => Ok(self.leader().await?.is_some_and(|v| v == node.as_bytes())),
            Err(StoreError::LeaseLost(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Publishes the decider's progress line (`gen/current.progress`).
    pub async fn publish_progress(&self, reason: &str) -> Result<(), StoreError> {
        self.store
            .put(&self.keys.progress(), reason.as_bytes().to_vec(), None)
            .await
            .map(drop)
    }

    /// Forms generation `f.g + 1` (see [`FormGeneration`]): `gen/current`, the plan, the
    /// formation record, the round's decider keys and verdict cleared; whether the guards held.
    pub async fn form(&self, f: FormGeneration<'_>) -> Result<bool, StoreError> {
        let next = f.g + 1;
        // Constant size whatever the node count (etcd allows 128 ops per txn): admitted nodes
        // find themselves in the plan and write their own membership keys.
        let mut ops = vec![
            Op::put(self.keys.gen_current(), encode_generation(next)),
            Op::put(self.keys.plan(next), encode(f.plan)),
            Op::put(self.keys.formation(next), encode(f.formation)),
            Op::Delete(self.keys.leader()),
            Op::Delete(self.keys.progress()),
            Op::Delete(self.keys.round_failed()),
        ];
        if let Some(m) = f.import {
            ops.extend(self.import_ops(m));
        }
        let mut compares = vec![
            Compare::ModRevisionEquals(self.keys.gen_current(), f.rev),
            // A seal that landed since the read: decide again with it.
            Compare::ModRevisionEquals(self.keys.ckpt_latest(), f.latest_revision),
        ];
        if let Some((restarts, restarts_rev)) = f.unclosed {
            ops.push(Op::put(self.keys.restarts(), encode(restarts)));
            compares.push(Compare::ModRevisionEquals(
                self.keys.restarts(),
                restarts_rev,
            ));
            compares.push(Compare::Missing(self.keys.closed(f.g)));
        }
        self.txn(compares, ops).await
    }

    /// The ops that record an imported manifest (from a manifest file) in the ledger.
    fn import_ops(&self, m: &Manifest) -> Vec<Op> {
        vec![
            Op::put(self.keys.ckpt_manifest(&m.id()), encode(m)),
            Op::put(self.keys.ckpt_latest(), m.id()),
        ]
    }

    /// Writes a failed round's verdict `record`, replacing the one at `mod_revision`
    /// `replaces` (`None`: none may exist); whether the guard held.
    pub async fn put_round_failure(
        &self,
        record: &RoundFailure,
        replaces: Option<i64>,
    ) -> Result<bool, StoreError> {
        let key = self.keys.round_failed();
        let compare = match replaces {
            None => Compare::Missing(key.clone()),
            Some(rev) => Compare::ModRevisionEquals(key.clone(), rev),
        };
        self.txn(vec![compare], vec![Op::put(key, encode(record))])
            .await
    }

    /// Deletes the round's decider key and progress line if `node` decides: a new round need
    /// not wait for its lease to expire.
    pub async fn step_down(&self, node: &str) -> Result<(), StoreError> {
        self.txn(
            vec![Compare::ValueEquals(
                self.keys.leader(),
                node.as_bytes().to_vec(),
            )],
            vec![
                Op::Delete(self.keys.leader()),
                Op::Delete(self.keys.progress()),
            ],
        )
        .await?;
        Ok(())
    }
}
