//! Retention, pure: after a seal, which node records and manifests go, and which files no kept
//! manifest refers to any more.

use std::collections::BTreeSet;

use super::{Manifest, Retention};
use crate::store::run_state::ledger::{Prune, StoredShard};

/// What retention drops after sealing one manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped {
    /// The deletions.
    pub prune: Prune,
    /// Manifests dropped from the ledger whose files can go (not those adopted from another
    /// run: their record goes, their files stay).
    pub manifests: Vec<Manifest>,
    /// Files no kept manifest or step in flight refers to; empty unless retention is on.
    pub garbage: Vec<String>,
}

/// After sealing `sealed`: the node records of dead generations and of earlier steps (and those
/// that do not decode) go, their files garbage unless kept; with `keep.keep_last > 0` the
/// manifests beyond the newest `keep_last`, but for milestones (`keep_every`) and `sealed`
/// itself, go too. `manifests`: every sealed manifest (read only when `keep_last > 0`).
pub fn after_seal(
    sealed: &Manifest,
    shards: Vec<StoredShard>,
    mut manifests: Vec<Manifest>,
    keep: Retention,
) -> Dropped {
    let mut out = Dropped::default();
    let mut unsealed_files = Vec::new();
    // A later step still in flight: its files are not garbage.
    let mut kept_paths = BTreeSet::new();
    for s in shards {
        let Some(r) = s.commit else {
            out.prune.shard_keys.push(s.key);
            continue;
        };
        if (r.generation, r.step) < (sealed.generation, sealed.step) {
            unsealed_files.extend(r.files.into_iter().map(|f| f.path));
            out.prune.shard_keys.push(s.key);
        } else {
            kept_paths.extend(r.files.into_iter().map(|f| f.path));
        }
    }
    kept_paths.extend(sealed.files.iter().map(|f| f.path.clone()));
    if keep.keep_last == 0 {
        return out;
    }
    manifests.sort_by_key(|m| std::cmp::Reverse((m.step, m.generation)));
    for (i, m) in manifests.into_iter().enumerate() {
        let milestone = keep.keep_every > 0 && m.step % keep.keep_every == 0;
        if i < keep.keep_last as usize || milestone || m.id() == sealed.id() {
            kept_paths.extend(m.files.iter().map(|f| f.path.clone()));
        } else if m.adopted_from.is_some() {
            // Another run's checkpoint: forget the record, keep its files.
            out.prune.manifest_ids.push(m.id());
            kept_paths.extend(m.files.iter().map(|f| f.path.clone()));
        } else {
            out.prune.manifest_ids.push(m.id());
            out.manifests.push(m);
        }
    }
    let candidates = out
        .manifests
        .iter()
        .flat_map(|m| m.files.iter().map(|f| f.path.clone()))
        .chain(unsealed_files);
    let garbage: BTreeSet<String> = candidates.filter(|p| !kept_paths.contains(p)).collect();
    out.garbage.extend(garbage);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Cursor, NodeCommit, ShardFile};

    fn file(path: &str) -> ShardFile {
        ShardFile {
            rank: 0,
            path: path.into(),
            bytes: 1,
            digest: String::new(),
        }
    }

    fn manifest(step: u64, g: u64) -> Manifest {
        Manifest {
            run_id: "r".into(),
            step,
            generation: g,
            world_size: 1,
            cursor: Cursor::default(),
            files: vec![file(&format!("/c/{step}"))],
            sealed_at_ms: 0,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        }
    }

    fn shard(key: &str, g: u64, step: u64) -> StoredShard {
        StoredShard {
            key: key.into(),
            commit: Some(NodeCommit {
                node_id: "a".into(),
                generation: g,
                step,
                ranks: vec![0],
                cursor: Cursor::default(),
                files: vec![file(&format!("/c/unsealed-{g}-{step}"))],
                save_started_ms: None,
                staged_ms: None,
            }),
        }
    }

    #[test]
    fn records_of_earlier_steps_and_dead_generations_go_later_steps_stay() {
        let sealed = manifest(10, 2);
        let undecodable = StoredShard {
            key: "bad".into(),
            commit: None,
        };
        let shards = vec![
            shard("g1s12", 1, 12),
            shard("g2s8", 2, 8),
            shard("g2s12", 2, 12),
            undecodable,
        ];
        let off = after_seal(&sealed, shards.clone(), vec![], Retention::default());
        assert_eq!(off.prune.shard_keys, ["g1s12", "g2s8", "bad"]);
        assert!(off.prune.manifest_ids.is_empty() && off.garbage.is_empty());
        // With retention on, the files of the dead records are garbage; the step in flight's
        // are not.
        let on = Retention {
            keep_last: 1,
            keep_every: 0,
        };
        let out = after_seal(&sealed, shards, vec![sealed.clone()], on);
        assert_eq!(out.garbage, ["/c/unsealed-1-12", "/c/unsealed-2-8"]);
    }

    #[test]
    fn retention_keeps_the_newest_the_milestones_and_adopted_files() {
        let sealed = manifest(40, 1);
        let mut adopted = manifest(5, 1);
        adopted.adopted_from = Some("other".into());
        let all = vec![
            adopted.clone(),
            manifest(10, 1),
            manifest(20, 1),
            manifest(30, 1),
            sealed.clone(),
        ];
        let keep = Retention {
            keep_last: 2,
            keep_every: 20,
        };
        let out = after_seal(&sealed, vec![], all, keep);
        let ids: Vec<String> = out.manifests.iter().map(Manifest::id).collect();
        assert_eq!(ids, [manifest(10, 1).id()]);
        assert_eq!(out.prune.manifest_ids, [manifest(10, 1).id(), adopted.id()]);
        assert_eq!(out.garbage, ["/c/10"]);
    }
}
