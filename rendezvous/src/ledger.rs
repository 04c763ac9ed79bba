//! The checkpoint ledger: which checkpoint every rank resumes from, and where the data stands.
//!
//! # Theory of operation (`docs/architecture.md` §4)
//!
//! * A rank saves its shard, then tells its agent `{step, rank, files (bytes, digest), cursor}`.
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

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::store::records::{
    describe_id, manifest_id, parse_id, Cursor, DigestKind, Manifest, NodeCommit, ShardFile,
};
use crate::store::run_state::RunState;
use crate::store::Store;
use crate::StoreError;

/// Which manifests to keep (`--ckpt-keep-last`, `--ckpt-keep-every`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep the newest K manifests; 0 keeps all (and deletes no file).
    pub keep_last: u32,
    /// Also keep every manifest whose step is a multiple of M (milestones); 0: none.
    pub keep_every: u64,
}

/// What a commit achieved.
// One per commit answer, moved once to the agent: boxing the manifest would buy nothing.
#[allow(clippy::large_enum_variant)]
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
    /// Two ranks reported the same file with different sizes or digests.
    #[error("step {step} not sealed: {detail}")]
    ConflictingFiles {
        /// Step.
        step: u64,
        /// Which file, which ranks.
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

/// The ledger of one run: its rules ([`seal`], [`retention`], [`resume`], pure) carried out
/// through the run's door ([`crate::store::run_state::ledger`]).
#[derive(Clone)]
pub struct Ledger {
    state: RunState,
    run_id: String,
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

/// A file two ranks reported with different sizes or digests (they did not see the same
/// content).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rank {} and rank {} report '{}' with different contents ({} vs {} bytes, digest {} vs {}); let one rank report a shared file",
    .ranks[0].min(.ranks[1]),
    .ranks[0].max(.ranks[1]),
    .path,
    .bytes[0],
    .bytes[1],
    DigestKind::short(&.digests[0]),
    DigestKind::short(&.digests[1])
)]
pub struct FileConflict {
    /// The file.
    pub path: String,
    /// The rank it was listed under first (the lowest that reported it so far), and the rank
    /// whose report differs.
    pub ranks: [u32; 2],
    /// The sizes they reported, in that order.
    pub bytes: [u64; 2],
    /// The digests they reported, in that order.
    pub digests: [String; 2],
}

/// Every file of a step once, ordered by rank then path: a file several ranks reported (e.g. a
/// shared file on a shared filesystem) is listed under the lowest of them.
///
/// # Errors
/// A file two ranks reported with different sizes or digests.
pub fn merge_files(
    files: impl IntoIterator<Item = ShardFile>,
) -> Result<Vec<ShardFile>, FileConflict> {
    let mut by_path: std::collections::BTreeMap<String, ShardFile> = Default::default();
    for f in files {
        match by_path.get_mut(&f.path) {
            None => {
                by_path.insert(f.path.clone(), f);
            }
            Some(seen) if (seen.bytes, &seen.digest) != (f.bytes, &f.digest) => {
                return Err(FileConflict {
                    path: f.path,
                    ranks: [seen.rank, f.rank],
                    bytes: [seen.bytes, f.bytes],
                    digests: [seen.digest.clone(), f.digest],
                });
            }
            Some(seen) => seen.rank = seen.rank.min(f.rank),
        }
    }
    let mut out: Vec<ShardFile> = by_path.into_values().collect();
    out.sort_by(|a, b| (a.rank, &a.path).cmp(&(b.rank, &b.path)));
    Ok(out)
}

impl Ledger {
    /// The ledger of run `run_id` in `store`.
    pub fn new(store: Arc<dyn Store>, run_id: &str) -> Self {
        Self {
            state: RunState::new(store, run_id),
            run_id: run_id.to_string(),
        }
    }
}

pub mod failure_log;
pub mod memory;
mod read;
pub mod resume;
pub mod retention;
pub mod seal;
mod write;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_lists_every_file_once() {
        let f = |rank: u32, path: &str, sha: &str| ShardFile {
            rank,
            path: path.into(),
            bytes: 3,
            digest: sha.repeat(64),
        };
        let merged = merge_files([
            f(1, "/c/s/.metadata", "a"),
            f(1, "/c/s/__1_0.distcp", "b"),
            f(0, "/c/s/.metadata", "a"),
            f(0, "/c/s/__0_0.distcp", "c"),
        ])
        .unwrap();
        let got: Vec<(u32, &str)> = merged.iter().map(|f| (f.rank, f.path.as_str())).collect();
        assert_eq!(
            got,
            [
                (0, "/c/s/.metadata"),
                (0, "/c/s/__0_0.distcp"),
                (1, "/c/s/__1_0.distcp")
            ]
        );
        assert!(merge_files(Vec::new()).unwrap().is_empty());
        let e = merge_files([f(2, "/c/s/x", "a"), f(0, "/c/s/x", "b")]).unwrap_err();
        assert!(
            matches!(&e, FileConflict { ranks: [2, 0], path, .. } if path == "/c/s/x"),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "rank 0 and rank 2 report '/c/s/x' with different contents (3 vs 3 bytes, digest aaaaaaaaaaaa vs bbbbbbbbbbbb); let one rank report a shared file"
        );
    }

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
            digest: String::new(),
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
            save_ms: None,
            stall_ms: None,
        };
        assert_eq!(m.dir(), std::path::PathBuf::from("/c/step-1"));
        m.files.push(f("/c/extra/x"));
        assert_eq!(m.dir(), std::path::PathBuf::from("/c"));
    }
}
