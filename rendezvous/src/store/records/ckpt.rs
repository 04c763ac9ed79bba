//! The checkpoint ledger's records: a node's commit of a step ([`NodeCommit`]), a sealed
//! [`Manifest`], the data [`Cursor`], and manifest ids (keys `ckpt/…`; `docs/architecture.md` §4).

use serde::{Deserialize, Serialize};

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
    /// When the first of those ranks began saving the step (or was told to by
    /// `drun.should_save()`), milliseconds since the Unix epoch; `None` when no rank said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_started_ms: Option<u64>,
    /// `--ckpt-memory`: when the agent answered those ranks because their files were staged in
    /// memory (the training went on from then; the record is written once the files are
    /// persisted), milliseconds since the Unix epoch; `None` when the ranks waited for the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_ms: Option<u64>,
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
    /// The save cost as the ranks saw it: the first rank's save start (any node) → the seal,
    /// milliseconds; `None` when no rank reported its start (the `--ckpt-interval auto` input C).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_ms: Option<u64>,
    /// `--ckpt-memory`: the time the training waited for the save, the first rank's save start
    /// → the last node's staged answer, milliseconds; `None` unless every node staged the step
    /// (then the training waited until the seal, `save_ms`). With it `--ckpt-interval auto`
    /// uses it as C, and `save_ms − stall_ms` is the persistence behind the training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<u64>,
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

/// The `(step, generation)` a manifest id names, if it is one (`"000012-3"` → `(12, 3)`).
pub fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (s, g) = id.split_once('-')?;
    Some((s.parse().ok()?, g.parse().ok()?))
}

#[cfg(test)]
impl Manifest {
    /// A test manifest of `run`'s `step` sealed by generation `g` of one rank, without files.
    pub(crate) fn bare(run: &str, step: u64, g: u64, sealed_at_ms: u64) -> Self {
        Manifest {
            run_id: run.into(),
            step,
            generation: g,
            world_size: 1,
            cursor: Default::default(),
            files: vec![],
            sealed_at_ms,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        }
    }
}
