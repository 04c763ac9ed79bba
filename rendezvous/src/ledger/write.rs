//! Writing the ledger: a node's commit of a step, sealing a manifest, retention, marking one bad.

use std::collections::BTreeSet;

use super::*;
use crate::store::{Compare, Op, Txn};

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
        let g = plan.generation;
        if rec.generation < g {
            return Err(LedgerError::Stale(format!(
                "generation {} is over; the node runs generation {g}",
                rec.generation
            )));
        }
        if rec.generation > g {
            return Err(LedgerError::Stale(format!(
                "generation {} has not begun; the node runs generation {g}",
                rec.generation
            )));
        }
        if let Some(r) = &plan.resume {
            if rec.step <= r.step {
                return Err(LedgerError::NotAfterResume {
                    step: rec.step,
                    resumed: r.step,
                });
            }
        }
        let id = manifest_id(rec.step, g);
        let gen_is_current = Compare::ValueEquals(self.keys.gen_current(), g.to_string().into());
        let resp = self
            .store
            .txn(Txn {
                compares: vec![
                    gen_is_current.clone(),
                    Compare::Exists(self.keys.member(g, &rec.node_id)),
                    Compare::Missing(self.keys.ckpt_manifest(&id)),
                ],
                success: vec![Op::put(
                    self.keys.ckpt_shard(g, rec.step, &rec.node_id),
                    serde_json::to_vec(rec).expect("NodeCommit serializes"),
                )],
                failure: vec![],
            })
            .await?;
        if !resp.succeeded {
            return Err(self.why_refused(g, &rec.node_id, &id).await?);
        }
        let prefix = self.keys.ckpt_step_prefix(g, rec.step);
        let mut records = Vec::new();
        for kv in self.store.get_prefix(&prefix).await? {
            let r: NodeCommit =
                serde_json::from_slice(&kv.value).map_err(|e| corrupt(&kv.key, e))?;
            records.push(r);
        }
        let waiting_for: Vec<String> = plan
            .members
            .iter()
            .filter(|m| !records.iter().any(|r| r.node_id == m.node_id))
            .map(|m| m.node_id.clone())
            .collect();
        if !waiting_for.is_empty() {
            return Ok(CommitOutcome::Recorded { waiting_for });
        }
        records.retain(|r| plan.member(&r.node_id).is_some());
        if let Some(detail) =
            cursor_disagreement(records.iter().map(|r| (r.ranks.as_slice(), &r.cursor)))
        {
            return Err(LedgerError::Misaligned {
                step: rec.step,
                detail,
            });
        }
        let files =
            merge_files(records.iter().flat_map(|r| r.files.clone())).map_err(|detail| {
                LedgerError::ConflictingFiles {
                    step: rec.step,
                    detail,
                }
            })?;
        let sealed_at_ms = crate::clock::now_ms();
        let save_ms = records
            .iter()
            .filter_map(|r| r.save_started_ms)
            .min()
            .map(|start| sealed_at_ms.saturating_sub(start));
        let manifest = Manifest {
            run_id: self.run_id.clone(),
            step: rec.step,
            generation: g,
            world_size: plan.world_size,
            cursor: rec.cursor.clone(),
            files,
            sealed_at_ms,
            adopted_from: None,
            save_ms,
        };
        if let Some(outcome) = self.seal(&manifest, &id, &prefix, &gen_is_current).await? {
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

    /// Writes `manifest` (id `id`) and moves `ckpt/latest` forward if it is newer, deleting the
    /// step's records under `prefix`; guarded by `gen_is_current`. `Some(outcome)`: a peer sealed
    /// the same step first; `None`: sealed here.
    async fn seal(
        &self,
        manifest: &Manifest,
        id: &str,
        prefix: &str,
        gen_is_current: &Compare,
    ) -> Result<Option<CommitOutcome>, LedgerError> {
        loop {
            let latest = self.store.get(&self.keys.ckpt_latest()).await?;
            let (latest_rev, moves) = match &latest {
                None => (0, true),
                Some(kv) => (
                    kv.mod_revision,
                    parse_id(&kv.value_str())
                        .is_none_or(|l| l < (manifest.step, manifest.generation)),
                ),
            };
            let mut success = vec![
                Op::put(
                    self.keys.ckpt_manifest(id),
                    serde_json::to_vec(manifest).expect("Manifest serializes"),
                ),
                Op::DeletePrefix(prefix.to_string()),
            ];
            if moves {
                success.push(Op::put(self.keys.ckpt_latest(), id.to_string()));
            }
            let resp = self
                .store
                .txn(Txn {
                    compares: vec![
                        gen_is_current.clone(),
                        Compare::ModRevisionEquals(self.keys.ckpt_latest(), latest_rev),
                        Compare::Missing(self.keys.ckpt_manifest(id)),
                    ],
                    success,
                    failure: vec![],
                })
                .await?;
            if resp.succeeded {
                return Ok(None);
            }
            if self
                .store
                .get(&self.keys.ckpt_manifest(id))
                .await?
                .is_some()
            {
                // A peer completed the same step at the same moment and sealed it.
                return Ok(Some(CommitOutcome::Recorded {
                    waiting_for: vec![],
                }));
            }
            let (cur, _) = self.current_generation().await?;
            if cur != manifest.generation {
                return Err(LedgerError::Stale(format!(
                    "generation {} ended (now {cur}) before step {} was sealed",
                    manifest.generation, manifest.step
                )));
            }
        }
    }

    async fn current_generation(&self) -> Result<(u64, i64), StoreError> {
        crate::run_state::RunState::new(self.store.clone(), &self.run_id)
            .current_generation()
            .await
    }

    async fn why_refused(&self, g: u64, node: &str, id: &str) -> Result<LedgerError, StoreError> {
        if self
            .store
            .get(&self.keys.ckpt_manifest(id))
            .await?
            .is_some()
        {
            return Ok(LedgerError::AlreadySealed(describe_id(id)));
        }
        let (cur, _) = self.current_generation().await?;
        if cur != g {
            return Ok(LedgerError::Stale(format!(
                "generation {g} is over (the group runs generation {cur})"
            )));
        }
        Ok(LedgerError::Stale(format!(
            "node {node} is no longer a member of generation {g} (its lease expired)"
        )))
    }

    /// Retention and garbage collection after sealing `sealed`: drops manifests outside the
    /// retention policy, and the shard records of dead generations and of earlier steps.
    async fn collect(
        &self,
        sealed: &Manifest,
        keep: Retention,
    ) -> Result<(Vec<Manifest>, Vec<String>), StoreError> {
        let mut ops = Vec::new();
        let mut unsealed_files = Vec::new();
        let mut in_flight = BTreeSet::new();
        for kv in self
            .store
            .get_prefix(&self.keys.ckpt_shards_prefix())
            .await?
        {
            let Ok(r) = serde_json::from_slice::<NodeCommit>(&kv.value) else {
                ops.push(Op::Delete(kv.key));
                continue;
            };
            if r.generation < sealed.generation
                || (r.generation == sealed.generation && r.step < sealed.step)
            {
                unsealed_files.extend(r.files.into_iter().map(|f| f.path));
                ops.push(Op::Delete(kv.key));
            } else {
                // A later step still in flight: its files are not garbage.
                in_flight.extend(r.files.into_iter().map(|f| f.path));
            }
        }
        let mut dropped = Vec::new();
        let mut kept_paths = in_flight;
        kept_paths.extend(sealed.files.iter().map(|f| f.path.clone()));
        if keep.keep_last > 0 {
            let mut all = self.manifests().await?;
            all.sort_by_key(|m| std::cmp::Reverse((m.step, m.generation)));
            for (i, m) in all.into_iter().enumerate() {
                let milestone = keep.keep_every > 0 && m.step % keep.keep_every == 0;
                if i < keep.keep_last as usize || milestone || m.id() == sealed.id() {
                    kept_paths.extend(m.files.iter().map(|f| f.path.clone()));
                } else if m.adopted_from.is_some() {
                    // Another run's checkpoint: forget the record, keep its files.
                    ops.push(Op::Delete(self.keys.ckpt_manifest(&m.id())));
                    ops.push(Op::Delete(self.keys.ckpt_bad(&m.id())));
                    kept_paths.extend(m.files.iter().map(|f| f.path.clone()));
                } else {
                    ops.push(Op::Delete(self.keys.ckpt_manifest(&m.id())));
                    ops.push(Op::Delete(self.keys.ckpt_bad(&m.id())));
                    dropped.push(m);
                }
            }
        }
        for chunk in ops.chunks(100) {
            self.store
                .txn(Txn {
                    compares: vec![],
                    success: chunk.to_vec(),
                    failure: vec![],
                })
                .await?;
        }
        let mut garbage = Vec::new();
        if keep.keep_last > 0 {
            let candidates = dropped
                .iter()
                .flat_map(|m| m.files.iter().map(|f| f.path.clone()))
                .chain(unsealed_files);
            let set: BTreeSet<String> = candidates.filter(|p| !kept_paths.contains(p)).collect();
            garbage.extend(set);
        }
        Ok((dropped, garbage))
    }

    /// Marks manifest `id` bad (it failed verification); later formations skip it.
    ///
    /// # Errors
    /// Store errors.
    pub async fn mark_bad(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        self.store
            .put(&self.keys.ckpt_bad(id), reason.as_bytes().to_vec(), None)
            .await?;
        Ok(())
    }
}
