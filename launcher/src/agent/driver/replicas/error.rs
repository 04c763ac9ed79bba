//! Why a replica was not sent, taken or served, or a resume from memory not gathered: one
//! variant per failure of the replica port's exchange ([`crate::ckpt::memory::wire`]), each
//! line as it is logged and answered on the wire.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::ckpt::memory::wire::judge::Refusal;
use crate::ckpt::memory::wire::{HeaderError, MAX_OFFER};

/// A failure of one exchange on the replica port, or of gathering a step's files.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicaError {
    /// The receiver's judgement of an offer or a fetch ([`crate::ckpt::memory::wire::judge`]).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A header that is neither an offer nor a fetch.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The other end answered something else than `take` or `ok` (its `refused: ` or `bad: `
    /// line, as it sent it).
    #[error("{answer}")]
    Answered {
        /// The line.
        answer: String,
    },
    /// The offer does not fit this node's replica budget: the budget's reason
    /// ([`crate::ckpt::memory::replica::release`]).
    #[error("{reason}")]
    NoRoom {
        /// The budget's reason.
        reason: String,
    },
    /// The step offered is held here already.
    #[error("step {step} is held here already")]
    HeldAlready {
        /// The step.
        step: u64,
    },
    /// An offer's header longer than [`MAX_OFFER`].
    #[error("an offer of {bytes} bytes is more than {MAX_OFFER}")]
    TooLong {
        /// Its length as sent.
        bytes: u32,
    },
    /// No header arrived in time.
    #[error("no offer from {peer} within {} s", .waited.as_secs())]
    NoOffer {
        /// The connection's peer.
        peer: SocketAddr,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The connection from a peer failed.
    #[error("connection from {peer}: {source}")]
    Connection {
        /// The peer.
        peer: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Sending to the other end failed.
    #[error("sending to {to}: {source}")]
    Send {
        /// The other end: its address, or the node id of a fetch's requester.
        to: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The other end's answer could not be read.
    #[error("reading the answer: {0}")]
    Answer(#[source] std::io::Error),
    /// The peer's host name does not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        /// The host.
        host: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The peer's host name resolves to no address.
    #[error("{host} resolves to nothing")]
    Unresolved {
        /// The host.
        host: String,
    },
    /// The peer's replica port cannot be reached.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// Its address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The peer sent no nonce.
    #[error("no nonce from {addr}: {source}")]
    NoNonce {
        /// Its address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No answer to an offer within the transfer's limit.
    #[error("no answer within {} s", .limit.as_secs())]
    NoAnswer {
        /// The limit.
        limit: Duration,
    },
    /// The bytes of a transfer were not all sent within its limit.
    #[error("the bytes were not sent within {} s", .limit.as_secs())]
    NotSent {
        /// The limit.
        limit: Duration,
    },
    /// The bytes of a transfer did not all arrive within its limit.
    #[error("the bytes did not arrive within {} s", .limit.as_secs())]
    NotArrived {
        /// The limit.
        limit: Duration,
    },
    /// A staged copy to send cannot be opened.
    #[error("cannot read the staged copy {}: {source}", .path.display())]
    Staged {
        /// The staged copy.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A staged copy is shorter than the offer says.
    #[error("{} is shorter than its {bytes} bytes", .path.display())]
    Short {
        /// The staged copy.
        path: PathBuf,
        /// Its size in the offer.
        bytes: u64,
    },
    /// Reading a file's bytes (a staged copy, or the connection carrying a file) failed.
    #[error("reading {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The connection ended before a file's every byte.
    #[error("{path} ended before its {bytes} bytes")]
    Ended {
        /// The file's final path.
        path: String,
        /// Its size.
        bytes: u64,
    },
    /// The digest after a file's bytes could not be read.
    #[error("reading the digest of {path}: {source}")]
    Digest {
        /// The file's final path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes received are not those the sender hashed.
    #[error("{path}: the bytes received do not match the sender's digest")]
    NotSenders {
        /// The file's final path.
        path: String,
    },
    /// The bytes received are not those the rank hashed.
    #[error("{path}: digest {got}, the rank's is {want}")]
    NotRanks {
        /// The file's final path.
        path: String,
        /// The digest of the bytes received.
        got: String,
        /// The rank's.
        want: String,
    },
    /// A gathered file is not the one the plan names.
    #[error("{path}: digest {got} in memory, the plan's is {want}")]
    NotPlans {
        /// The file's final path.
        path: String,
        /// The digest of the staged file.
        got: String,
        /// The plan's.
        want: String,
    },
    /// A file's final path is not inside `--ckpt-dir`.
    #[error("'{path}' is not inside --ckpt-dir")]
    Outside {
        /// The path.
        path: String,
    },
    /// A fetch asks for a file this node does not hold.
    #[error("{path} is not held here")]
    NotHeld {
        /// The file's final path.
        path: String,
    },
    /// A file or directory cannot be created.
    #[error("cannot create {}: {source}", .path.display())]
    Create {
        /// It.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing a file failed.
    #[error("writing {}: {source}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A replica held here cannot be linked (or copied) into the staging directory.
    #[error("cannot link the replica {}: {source}", .path.display())]
    Link {
        /// The replica.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A gathered file cannot be read to verify it.
    #[error("cannot read {}: {source}", .path.display())]
    Verify {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The manifest handed to the workers cannot be written.
    #[error("cannot write {}: {source}", .path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The plan names a source that is no member with a replica port.
    #[error("the source {node} is not a member with a replica port")]
    NoSource {
        /// The source's node id.
        node: String,
    },
    /// Fetching from a source failed.
    #[error("fetching from {node}: {source}")]
    Fetching {
        /// The source's node id.
        node: String,
        /// Why.
        source: Box<ReplicaError>,
    },
    /// The verifying task ended without an answer.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    /// This node has nowhere to gather a step in.
    #[error("this node has no --ckpt-memory staging directory to gather it in")]
    NoStage,
}
