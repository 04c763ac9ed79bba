//! Writing the ledger: a node's commit of a step, sealing a manifest, retention, marking one bad.
//! The rules are [`super::seal`]'s and [`super::retention`]'s; the keys are the door's.

use super::retention::after_seal;
use super::seal::{admit, completion, moves_latest, Completion};
use super::*;
use crate::Plan;

impl Ledger {
    /// Records `rec` for the running generation `plan` and seals the step if it is complete.
    ///
    /// # Errors
    /// [`LedgerError::Stale`] when `plan` is not the current generation or the node's membership
    /// key is gone (lease expired); [`LedgerError::Misaligned`] when the step is complete but the
    /// cursors differ (nothing is sealed); [`LedgerError::NotAfterResume`]; store errors.
    pub async fn commit(
        &self,
        plan: &Plan,
        rec: &NodeCommit,
        keep: Retention,
    ) -> Result<CommitOutcome, LedgerError> {
        admit(plan, rec)?;
        let g = plan.generation;
        let id = manifest_id(rec.step, g);
        if !self.state.commit_node(rec).await? {
            return Err(self.why_refused(g, &rec.node_id, &id).await?);
        }
        let records = self.state.step_commits(g, rec.step).await?;
        let manifest = match completion(&self.run_id, plan, rec, records, crate::clock::now_ms())? {
            Completion::Waiting(waiting_for) => return Ok(CommitOutcome::Recorded { waiting_for }),
            Completion::Ready(manifest) => manifest,
        };
        if let Some(outcome) = self.seal(&manifest, g).await? {
            return Ok(outcome);
        }
        tracing::debug!(run = %self.run_id, step = rec.step, gen = g, files = manifest.files.len(), "checkpoint sealed");
        let (dropped, garbage) = self.collect(&manifest, keep).await?;
        Ok(CommitOutcome::Sealed {
            manifest,
            dropped,
            garbage,
        })
    }

    /// Seals `manifest` for the running generation `g` (moving `ckpt/latest` forward if it is
    /// newer), retrying while only `ckpt/latest` moved under it. `Some(outcome)`: a peer sealed
    /// the same step first; `None`: sealed here. `g` is the manifest's generation but for a step
    /// resumed from memory, which the generation after it persists and seals.
    async fn seal(
        &self,
        manifest: &Manifest,
        g: u64,
    ) -> Result<Option<CommitOutcome>, LedgerError> {
        loop {
            let latest = self.state.ckpt_latest().await?;
            let latest_rev = latest.as_ref().map_or(0, |(_, rev)| *rev);
            let moves = moves_latest(latest.as_ref().map(|(id, _)| id.as_str()), manifest);
            if self.state.seal(manifest, g, latest_rev, moves).await? {
                return Ok(None);
            }
            if self.state.is_sealed(&manifest.id()).await? {
                // A peer completed the same step at the same moment and sealed it.
                return Ok(Some(CommitOutcome::Recorded {
                    waiting_for: vec![],
                }));
            }
            let (cur, _) = self.state.current_generation().await?;
            if cur != g {
                return Err(LedgerError::Stale(format!(
                    "generation {g} ended (now {cur}) before step {} was sealed",
                    manifest.step
                )));
            }
        }
    }

    async fn why_refused(&self, g: u64, node: &str, id: &str) -> Result<LedgerError, StoreError> {
        if self.state.is_sealed(id).await? {
            return Ok(LedgerError::AlreadySealed(describe_id(id)));
        }
        let (cur, _) = self.state.current_generation().await?;
        if cur != g {
            return Ok(LedgerError::Stale(format!(
                "generation {g} is over (the group runs generation {cur})"
            )));
        }
        Ok(LedgerError::Stale(format!(
            "node {node} is no longer a member of generation {g} (its lease expired)"
        )))
    }

    /// Retention and garbage collection after sealing `sealed` ([`after_seal`]): drops
    /// manifests outside the retention policy, and the shard records of dead generations and of
    /// earlier steps.
    async fn collect(
        &self,
        sealed: &Manifest,
        keep: Retention,
    ) -> Result<(Vec<Manifest>, Vec<String>), StoreError> {
        let shards = self.state.stored_shards().await?;
        let manifests = if keep.keep_last > 0 {
            self.manifests().await?
        } else {
            Vec::new()
        };
        let dropped = after_seal(sealed, shards, manifests, keep);
        self.state.prune(&dropped.prune).await?;
        Ok((dropped.manifests, dropped.garbage))
    }

    /// Marks manifest `id` bad (it failed verification); later formations skip it.
    ///
    /// # Errors
    /// Store errors.
    pub async fn mark_bad(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        self.state.mark_bad(id, reason).await
    }
}
