//! [`CkptError`]: what can go wrong with a checkpoint on this node, with the file, rank and step.

use std::path::PathBuf;

use drun_rendezvous::DigestKind;

/// A checkpoint problem found by the agent: writing or reading manifest files, verifying the
/// files of a resume point, checking a rank's commit. Every variant renders as one line.
#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    /// The manifest file next to a checkpoint could not be written.
    #[error("cannot write the manifest file {}: {source}", path.display())]
    WriteManifest {
        /// The manifest file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A `latest` pointer file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    WritePointer {
        /// The pointer file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `--ckpt-resume-from DIR` without a readable `DIR/latest`.
    #[error("{} has no readable `latest` pointer ({source}); name a drun-manifest-*.json file instead", dir.display())]
    NoPointer {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A manifest file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadManifest {
        /// The manifest file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file that is not a drun manifest.
    #[error("{} is not a drun checkpoint manifest ({source}); name a drun-manifest-*.json file or a --ckpt-dir with a `latest` pointer", path.display())]
    NotManifest {
        /// The file.
        path: PathBuf,
        /// Why it did not decode.
        #[source]
        source: serde_json::Error,
    },
    /// A manifest that lists nothing.
    #[error("{} lists no files", path.display())]
    NoFiles {
        /// The manifest file.
        path: PathBuf,
    },
    /// A checkpoint file is missing or unreadable.
    #[error("{path} (rank {rank}){}: {source}", of_step(*step))]
    Unreadable {
        /// The file.
        path: String,
        /// The rank that wrote it.
        rank: u32,
        /// The checkpoint step, when known.
        step: Option<u64>,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint file has another size than its manifest records.
    #[error("{path} (rank {rank}){} has {found} bytes, the manifest says {expected}", of_step(*step))]
    Size {
        /// The file.
        path: String,
        /// The rank that wrote it.
        rank: u32,
        /// The checkpoint step, when known.
        step: Option<u64>,
        /// Its size now.
        found: u64,
        /// The size recorded.
        expected: u64,
    },
    /// A checkpoint file has another digest than its manifest records (taken with the
    /// function the manifest names).
    #[error(
        "{path} (rank {rank}) has digest {}…, the manifest says {}…",
        DigestKind::short(found),
        DigestKind::short(expected)
    )]
    Digest {
        /// The file.
        path: String,
        /// The rank that wrote it.
        rank: u32,
        /// Its digest now.
        found: String,
        /// The digest recorded.
        expected: String,
    },
    /// The verification task itself failed.
    #[error("verification panicked: {0}")]
    VerifyPanicked(String),
    /// A rank reported a commit for a rank this node does not run.
    #[error("rank {rank} does not run on node {node} (ranks {first}..{end})")]
    ForeignRank {
        /// The rank named.
        rank: u32,
        /// This node.
        node: String,
        /// First local rank.
        first: u32,
        /// One past the last local rank.
        end: u32,
    },
    /// A committed file is unusable (relative, outside `--ckpt-dir`, bad digest, not a
    /// regular file, another size); `why` says which.
    #[error("{why}")]
    BadCommitFile {
        /// The file as reported.
        path: String,
        /// One line.
        why: String,
    },
    /// A commit refused for its step or generation (stale, repeated, before the resume point).
    #[error("{why}")]
    BadCommit {
        /// Generation of the commit.
        generation: u64,
        /// Step of the commit.
        step: u64,
        /// One line.
        why: String,
    },
}

impl CkptError {
    /// Whether this says a checkpoint's files are damaged (missing, unreadable, another size or
    /// digest than its manifest records), rather than that there is no checkpoint to look at.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            CkptError::Unreadable { .. } | CkptError::Size { .. } | CkptError::Digest { .. }
        )
    }
}

fn of_step(step: Option<u64>) -> String {
    step.map(|s| format!(" of step {s}")).unwrap_or_default()
}
