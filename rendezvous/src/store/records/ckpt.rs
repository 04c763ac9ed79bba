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
    /// Digest of the content as [`DigestKind`] spells it: 64 lowercase hex digits of its
    /// SHA-256 (what a rank's own `atomic_save` reports), or `blake3:` and 64 hex digits of its
    /// BLAKE3 (what the agent takes of a file staged in memory). Empty until known (a staged
    /// file before it is persisted). Read under its old name `sha256` too.
    #[serde(alias = "sha256")]
    pub digest: String,
}

/// The hash function a [`ShardFile`]'s digest was taken with, which its text names: 64 hex
/// digits alone are a SHA-256 (every manifest before BLAKE3, and a rank's own digests), a
/// `blake3:` prefix a BLAKE3. A digest is checked again with the function that took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestKind {
    /// SHA-256: `<64 hex>`.
    Sha256,
    /// BLAKE3 (32 bytes): `blake3:<64 hex>`; about four times faster on one core.
    Blake3,
}

impl DigestKind {
    /// What precedes the hex digits.
    pub const fn prefix(self) -> &'static str {
        match self {
            DigestKind::Sha256 => "",
            DigestKind::Blake3 => "blake3:",
        }
    }

    /// The function's name, for messages.
    pub const fn name(self) -> &'static str {
        match self {
            DigestKind::Sha256 => "SHA-256",
            DigestKind::Blake3 => "BLAKE3",
        }
    }

    /// The start of `digest` for a message: its prefix and 12 hex digits.
    pub fn short(digest: &str) -> &str {
        let keep = DigestKind::of(digest).map_or(0, |k| k.prefix().len()) + 12;
        digest
            .char_indices()
            .nth(keep)
            .map_or(digest, |(at, _)| &digest[..at])
    }

    /// The kind `digest` was taken with, when it is one well-formed (its prefix, then 64 hex
    /// digits); `None` otherwise (empty included).
    pub fn of(digest: &str) -> Option<DigestKind> {
        let (kind, hex) = match digest.strip_prefix(DigestKind::Blake3.prefix()) {
            Some(hex) => (DigestKind::Blake3, hex),
            None => (DigestKind::Sha256, digest),
        };
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(kind)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_names_the_function_that_took_it() {
        let hex = "0123456789abcdef".repeat(4);
        assert_eq!(DigestKind::of(&hex), Some(DigestKind::Sha256));
        assert_eq!(
            DigestKind::of(&format!("blake3:{hex}")),
            Some(DigestKind::Blake3)
        );
        for bad in [
            String::new(),
            hex[1..].to_string(),
            format!("{hex}0"),
            format!("blake3:{}", &hex[1..]),
            format!("sha1:{hex}"),
            "g".repeat(64),
        ] {
            assert_eq!(DigestKind::of(&bad), None, "{bad}");
        }
        assert_eq!(DigestKind::short(&hex), "0123456789ab");
        assert_eq!(
            DigestKind::short(&format!("blake3:{hex}")),
            "blake3:0123456789ab"
        );
        assert_eq!(DigestKind::short("ü€ab"), "ü€ab");
    }

    #[test]
    fn a_manifest_written_before_blake3_is_read_with_its_sha256() {
        let old = r#"{"rank":1,"path":"/c/x","bytes":3,"sha256":"ab"}"#;
        let f: ShardFile = serde_json::from_str(old).unwrap();
        assert_eq!(f.digest, "ab");
        let back = serde_json::to_value(&f).unwrap();
        assert_eq!(back["digest"], "ab");
    }
}
