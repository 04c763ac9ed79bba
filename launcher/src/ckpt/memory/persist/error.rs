//! Why the persister did not put a staged file in place: the file and the step that failed.

use std::io;
use std::path::PathBuf;

/// A staged file that was not persisted (nothing of it is then in place in `--ckpt-dir`).
#[derive(Debug, thiserror::Error)]
#[error("cannot persist {}: {failure}", .target.display())]
pub struct PersistError {
    /// Its place in `--ckpt-dir`.
    pub target: PathBuf,
    /// What failed.
    #[source]
    pub failure: PersistFailure,
}

/// The step of persisting a file that failed.
#[derive(Debug, thiserror::Error)]
pub enum PersistFailure {
    /// Its directory in `--ckpt-dir` cannot be created.
    #[error("cannot create its directory: {0}")]
    CreateDir(#[source] io::Error),
    /// The agent stopped the persister (it exits): the temporary file is removed.
    #[error("stopped: the agent exits")]
    Stopped,
    /// The staged copy cannot be opened.
    #[error("the staged copy is gone: {0}")]
    StagedGone(#[source] io::Error),
    /// No temporary file can be created beside its place.
    #[error("cannot create a temporary file: {0}")]
    TempFile(#[source] io::Error),
    /// Reading the staged copy failed.
    #[error("reading: {0}")]
    Read(#[source] io::Error),
    /// Writing the temporary file failed.
    #[error("writing: {0}")]
    Write(#[source] io::Error),
    /// The staged copy holds another number of bytes than its rank's commit says.
    #[error("the staged copy has another size: {written} bytes, the commit says {expected}")]
    Size {
        /// Bytes read from the staged copy.
        written: u64,
        /// Bytes in the commit.
        expected: u64,
    },
    /// The fsync of the temporary file failed.
    #[error("fsync: {0}")]
    Fsync(#[source] io::Error),
    /// Reading the written bytes back from the device failed.
    #[error("reading it back: {0}")]
    ReadBack(#[source] io::Error),
    /// The bytes read back from the device are not the staged copy's.
    #[error("the bytes read back from disk differ from the staged copy's: from byte {at}")]
    Differs {
        /// The first byte that differs.
        at: u64,
    },
    /// The digest of the bytes written is not the rank's.
    #[error("its digest read back from disk differs from the rank's: {got} != {want}")]
    Digest {
        /// The digest of the bytes written.
        got: String,
        /// The rank's.
        want: String,
    },
    /// The temporary file cannot be renamed into its place.
    #[error("rename into place: {0}")]
    Rename(#[source] io::Error),
}
