//! The checkpoint ledger: which checkpoint every rank resumes from, and where the data stands.
//!
//! # Theory of operation (`docs/architecture.md` §4)
//!
//! * A rank saves its shard, then tells its agent `{step, rank, files (bytes, sha256), cursor}`.
//!   The agent batches its ranks into one [`NodeCommit`] per step and [`Ledger::commit`]s it:
//!   `ckpt/shards/<g>/<step>/<node>` is written only if `gen/current == g` and the node's
//!   membership key of `g` (attached to its lease) still exists, so a stale (fenced) agent
//!   cannot commit.
//! * The node whose record completes the step (every member of `g` has reported it) checks that
//!   every rank reported the same [`Cursor`] and seals: one transaction writes
//!   `ckpt/manifest/<id>` and moves `ckpt/latest` forward only in `(step, generation)`, guarded by
//!   `gen/current == g` and `ckpt/latest`'s mod revision. A differing cursor is refused as
//!   misaligned data and names the ranks.
//! * At every formation the decider picks the newest sealed manifest not marked bad
//!   ([`Ledger::resume_point`]) and puts it in the plan; agents verify it and may
//!   [`Ledger::mark_bad`] it, which re-forms the group onto the previous one.
//! * The cursor is global: samples of the epoch's permutation consumed by committed steps. No
//!   per-rank offset is ever stored, so a world-size change re-splits what remains.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::keys::RunKeys;
use crate::store::{Compare, Op, Store, Txn};
use crate::{Plan, StoreError};

/// Where the data stands after a committed step, identical on every rank (`docs/architecture.md` §4, item 5).
///
/// All counts are in samples of the global (world-size independent) epoch permutation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cursor {
    /// Epoch the next sample comes from (0-based).
    #[serde(default)]
    pub epoch: u64,
    /// Samples of epoch `epoch`'s permutation consumed by committed steps.
    pub consumed_in_epoch: u64,
    /// Samples consumed since the start of training, all epochs.
    #[serde(default)]
    pub consumed_total: u64,
    /// Permutation seed (the permutation of epoch `e` is seeded with `seed + e`).
    #[serde(default)]
    pub seed: i64,
    /// Samples in the dataset.
    #[serde(default)]
    pub dataset_len: u64,
    /// Samples per optimizer step over all ranks.
    #[serde(default)]
    pub global_batch: u64,
}

/// One file of a checkpoint, as reported by the rank that wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardFile {
    /// Global rank that wrote it.
    pub rank: u32,
    /// Absolute path.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the content, lowercase hex (64 characters).
    pub sha256: String,
}

/// One node's report of a step: every local rank's files, batched (one store write per node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCommit {
    /// Node identity.
    pub node_id: String,
    /// Generation the ranks ran in.
    pub generation: u64,
    /// Training step the checkpoint was taken after (the user's step counter).
    pub step: u64,
    /// Global ranks of this node that reported, ascending.
    pub ranks: Vec<u32>,
    /// The data cursor the ranks reported (identical on all of them; the agent checks).
    pub cursor: Cursor,
    /// Files of all those ranks.
    pub files: Vec<ShardFile>,
}

/// A sealed checkpoint: complete (every rank of its generation reported it) and consistent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Run id.
    pub run_id: String,
    /// Step.
    pub step: u64,
    /// Generation that saved it.
    pub generation: u64,
    /// WORLD_SIZE that saved it.
    pub world_size: u32,
    /// The data cursor after `step`.
    pub cursor: Cursor,
    /// Every file, ordered by rank then path.
    pub files: Vec<ShardFile>,
    /// When it was sealed, milliseconds since the Unix epoch.
    pub sealed_at_ms: u64,
    /// Set when this run adopted the checkpoint from another run (`drun --ckpt-resume-from`):
    /// that run's id. Its files belong to that run: retention never deletes them and no
    /// manifest file is written over that run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_from: Option<String>,
}

impl Manifest {
    /// The ledger id, `<step>-<generation>` zero-padded so ids sort like `(step, generation)`.
    pub fn id(&self) -> String {
        manifest_id(self.step, self.generation)
    }

    /// Total size of the files in bytes.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// The deepest directory holding every file (`DRUN_RESUME_PATH`); `/` when none is shared.
    pub fn dir(&self) -> std::path::PathBuf {
        use std::path::{Path, PathBuf};
        let mut common: Option<PathBuf> = None;
        for f in &self.files {
            let parent = Path::new(&f.path).parent().unwrap_or(Path::new("/"));
            common = Some(match common {
                None => parent.to_path_buf(),
                Some(c) => c
                    .components()
                    .zip(parent.components())
                    .take_while(|(a, b)| a == b)
                    .map(|(a, _)| a)
                    .collect(),
            });
        }
        common.unwrap_or_else(|| PathBuf::from("/"))
    }

    /// File name of the manifest written next to the checkpoint.
    pub fn file_name(&self) -> String {
        format!("drun-manifest-{}-{}.json", self.step, self.generation)
    }
}

/// The id of the manifest of `step` saved by generation `generation`.
pub fn manifest_id(step: u64, generation: u64) -> String {
    format!("{step:020}-{generation:020}")
}

/// "step 6 (generation 1)" for a manifest id; the id itself if it does not parse.
pub fn describe_id(id: &str) -> String {
    match parse_id(id) {
        Some((s, g)) => format!("step {s} (generation {g})"),
        None => id.to_string(),
    }
}

fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (s, g) = id.split_once('-')?;
    Some((s.parse().ok()?, g.parse().ok()?))
}

/// Which manifests to keep (`--ckpt-keep-last`, `--ckpt-keep-every`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep the newest K manifests; 0 keeps all (and deletes no file).
    pub keep_last: u32,
    /// Also keep every manifest whose step is a multiple of M (milestones); 0: none.
    pub keep_every: u64,
}

/// What a commit achieved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommitOutcome {
    /// Recorded; the step seals when these nodes have reported it too (empty: a peer sealed it).
    Recorded {
        /// Nodes of the generation that have not reported the step yet.
        waiting_for: Vec<String>,
    },
    /// This commit completed the step and sealed it.
    Sealed {
        /// The new manifest.
        manifest: Manifest,
        /// Manifests retention dropped from the ledger (their manifest files can go).
        dropped: Vec<Manifest>,
        /// Files no kept manifest refers to any more (dropped manifests, unsealed shards of
        /// dead generations); empty unless retention is on.
        garbage: Vec<String>,
    },
}

/// Why a commit was refused.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The committing node is not (or no longer) a member of the running generation.
    #[error("stale commit: {0}")]
    Stale(String),
    /// The step is already sealed (a duplicate commit).
    #[error("checkpoint {0} is already sealed")]
    AlreadySealed(String),
    /// Ranks reported different data cursors for the same step.
    #[error("step {step} not sealed: misaligned data: {detail}")]
    Misaligned {
        /// Step.
        step: u64,
        /// Which ranks reported which cursor.
        detail: String,
    },
    /// A step at or before the checkpoint the generation resumed from.
    #[error("step {step} is not after the step this generation resumed from ({resumed})")]
    NotAfterResume {
        /// Step committed.
        step: u64,
        /// Step resumed from.
        resumed: u64,
    },
    /// The store failed underneath.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The resume point chosen for a new generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// Newest sealed manifest not marked bad, if any.
    pub manifest: Option<Manifest>,
    /// `ckpt/latest`'s mod revision when read (0: missing); formation compares on it.
    pub latest_revision: i64,
    /// The manifest came from a node's manifest file, not from this store: formation records it.
    pub import: bool,
}

/// The ledger of one run.
#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn Store>,
    keys: RunKeys,
    run_id: String,
}

fn corrupt(key: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    }
}

/// "ranks 0-3" / "ranks 0,2,5" / "rank 4".
fn ranks_text(ranks: &[u32]) -> String {
    let mut r = ranks.to_vec();
    r.sort_unstable();
    let contiguous = r.windows(2).all(|w| w[1] == w[0] + 1);
    match r.as_slice() {
        [one] => format!("rank {one}"),
        [first, .., last] if contiguous => format!("ranks {first}-{last}"),
        _ => format!(
            "ranks {}",
            r.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ),
    }
}

/// Groups ranks by the cursor they reported; `None` when all agree. The error text names the
/// ranks of each group, largest group first.
pub fn cursor_disagreement<'a>(
    reports: impl IntoIterator<Item = (&'a [u32], &'a Cursor)>,
) -> Option<String> {
    let mut groups: Vec<(Cursor, Vec<u32>)> = Vec::new();
    for (ranks, c) in reports {
        match groups.iter_mut().find(|(gc, _)| gc == c) {
            Some((_, rs)) => rs.extend_from_slice(ranks),
            None => groups.push((c.clone(), ranks.to_vec())),
        }
    }
    if groups.len() <= 1 {
        return None;
    }
    groups.sort_by_key(|(_, rs)| std::cmp::Reverse(rs.len()));
    Some(
        groups
            .iter()
            .map(|(c, rs)| {
                format!(
                    "{} report cursor {}",
                    ranks_text(rs),
                    serde_json::to_string(c).expect("cursor serializes")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

impl Ledger {
    /// The ledger of run `run_id` in `store`.
    pub fn new(store: Arc<dyn Store>, run_id: &str) -> Self {
        Self {
            store,
            keys: RunKeys::new(run_id),
            run_id: run_id.to_string(),
        }
    }

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
        if rec.generation != g {
            return Err(LedgerError::Stale(format!(
                "generation {} is over; the node runs generation {g}",
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
        let mut files: Vec<ShardFile> = records.iter().flat_map(|r| r.files.clone()).collect();
        files.sort_by(|a, b| (a.rank, &a.path).cmp(&(b.rank, &b.path)));
        let manifest = Manifest {
            run_id: self.run_id.clone(),
            step: rec.step,
            generation: g,
            world_size: plan.world_size,
            cursor: rec.cursor.clone(),
            files,
            sealed_at_ms: crate::clock::now_ms(),
            adopted_from: None,
        };
        loop {
            let latest = self.store.get(&self.keys.ckpt_latest()).await?;
            let (latest_rev, moves) = match &latest {
                None => (0, true),
                Some(kv) => (
                    kv.mod_revision,
                    parse_id(&kv.value_str()).is_none_or(|l| l < (rec.step, g)),
                ),
            };
            let mut success = vec![
                Op::put(
                    self.keys.ckpt_manifest(&id),
                    serde_json::to_vec(&manifest).expect("Manifest serializes"),
                ),
                Op::DeletePrefix(prefix.clone()),
            ];
            if moves {
                success.push(Op::put(self.keys.ckpt_latest(), id.clone()));
            }
            let resp = self
                .store
                .txn(Txn {
                    compares: vec![
                        gen_is_current.clone(),
                        Compare::ModRevisionEquals(self.keys.ckpt_latest(), latest_rev),
                        Compare::Missing(self.keys.ckpt_manifest(&id)),
                    ],
                    success,
                    failure: vec![],
                })
                .await?;
            if resp.succeeded {
                break;
            }
            if self
                .store
                .get(&self.keys.ckpt_manifest(&id))
                .await?
                .is_some()
            {
                // A peer completed the same step at the same moment and sealed it.
                return Ok(CommitOutcome::Recorded {
                    waiting_for: vec![],
                });
            }
            let (cur, _) = self.current_generation().await?;
            if cur != g {
                return Err(LedgerError::Stale(format!(
                    "generation {g} ended (now {cur}) before step {} was sealed",
                    rec.step
                )));
            }
        }
        tracing::debug!(run = %self.run_id, step = rec.step, gen = g, files = manifest.files.len(), "checkpoint sealed");
        let (dropped, garbage) = self.collect(&manifest, keep).await?;
        Ok(CommitOutcome::Sealed {
            manifest,
            dropped,
            garbage,
        })
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

    /// Every sealed manifest, oldest first.
    ///
    /// # Errors
    /// Store errors; a manifest that does not decode is [`StoreError::Corrupt`].
    pub async fn manifests(&self) -> Result<Vec<Manifest>, StoreError> {
        let mut out = Vec::new();
        for kv in self
            .store
            .get_prefix(&self.keys.ckpt_manifest_prefix())
            .await?
        {
            out.push(
                serde_json::from_slice::<Manifest>(&kv.value).map_err(|e| corrupt(&kv.key, e))?,
            );
        }
        out.sort_by_key(|m| (m.step, m.generation));
        Ok(out)
    }

    /// Manifests marked bad: id → why.
    ///
    /// # Errors
    /// Store errors.
    pub async fn bad(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let prefix = self.keys.ckpt_bad_prefix();
        Ok(self
            .store
            .get_prefix(&prefix)
            .await?
            .into_iter()
            .map(|kv| (kv.key[prefix.len()..].to_string(), kv.value_str()))
            .collect())
    }

    /// The newest sealed manifest not marked bad, among the ledger's and `hints` (manifests read
    /// from checkpoint directories by the joining nodes, for a run whose store is new).
    ///
    /// # Errors
    /// Store errors.
    pub async fn resume_point(&self, hints: &[&Manifest]) -> Result<ResumePoint, StoreError> {
        let latest_revision = self
            .store
            .get(&self.keys.ckpt_latest())
            .await?
            .map_or(0, |kv| kv.mod_revision);
        let bad = self.bad().await?;
        let stored = self.manifests().await?;
        let best_stored = stored
            .into_iter()
            .rev()
            .find(|m| !bad.contains_key(&m.id()));
        let best_hint = hints
            .iter()
            .filter(|m| m.run_id == self.run_id && !bad.contains_key(&m.id()))
            .max_by_key(|m| (m.step, m.generation))
            .map(|m| (*m).clone());
        let (manifest, import) = match (best_stored, best_hint) {
            (Some(s), Some(h)) if (h.step, h.generation) > (s.step, s.generation) => {
                (Some(h), true)
            }
            (Some(s), _) => (Some(s), false),
            (None, Some(h)) => (Some(h), true),
            (None, None) => (None, false),
        };
        Ok(ResumePoint {
            manifest,
            latest_revision,
            import,
        })
    }

    /// The formation ops that record an imported manifest (from a manifest file) in the ledger.
    pub fn import_ops(&self, m: &Manifest) -> Vec<Op> {
        vec![
            Op::put(
                self.keys.ckpt_manifest(&m.id()),
                serde_json::to_vec(m).expect("Manifest serializes"),
            ),
            Op::put(self.keys.ckpt_latest(), m.id()),
        ]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(n: u64) -> Cursor {
        Cursor {
            consumed_in_epoch: n,
            ..Cursor::default()
        }
    }

    #[test]
    fn ids_sort_like_step_then_generation() {
        assert!(manifest_id(9, 5) < manifest_id(10, 1));
        assert!(manifest_id(10, 1) < manifest_id(10, 2));
        assert_eq!(parse_id(&manifest_id(42, 7)), Some((42, 7)));
    }

    #[test]
    fn disagreement_names_the_ranks() {
        let (a, b) = (cursor(8), cursor(9));
        assert_eq!(
            cursor_disagreement([(&[0u32, 1][..], &a), (&[2u32][..], &a)]),
            None
        );
        let text =
            cursor_disagreement([(&[0u32, 1][..], &a), (&[3u32][..], &b), (&[2u32][..], &a)])
                .expect("disagree");
        assert!(text.starts_with("ranks 0-2 report cursor"), "{text}");
        assert!(text.contains("; rank 3 report cursor"), "{text}");
        assert!(text.contains("\"consumed_in_epoch\":9"), "{text}");
    }

    #[test]
    fn manifest_dir_is_the_common_parent() {
        let f = |p: &str| ShardFile {
            rank: 0,
            path: p.into(),
            bytes: 1,
            sha256: String::new(),
        };
        let mut m = Manifest {
            run_id: "r".into(),
            step: 1,
            generation: 1,
            world_size: 2,
            cursor: cursor(0),
            files: vec![f("/c/step-1/rank0.pt"), f("/c/step-1/rank1.pt")],
            sealed_at_ms: 0,
            adopted_from: None,
        };
        assert_eq!(m.dir(), std::path::PathBuf::from("/c/step-1"));
        m.files.push(f("/c/extra/x"));
        assert_eq!(m.dir(), std::path::PathBuf::from("/c"));
    }
}
