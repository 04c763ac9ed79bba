//! Error types of the rendezvous crate.

use std::time::Duration;

/// Failure of a [`crate::Store`] operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The lease does not exist any more (expired or revoked). Keys attached to it are gone.
    #[error("lease {0:#x} expired or was revoked")]
    LeaseLost(i64),
    /// The backend could not be reached or answered with an error.
    #[error("store backend {endpoint} unavailable: {reason}")]
    Unavailable {
        /// Endpoint or backend name (e.g. `memory`, `127.0.0.1:2379`).
        endpoint: String,
        /// What the backend said.
        reason: String,
    },
    /// A stored value could not be decoded.
    #[error("corrupt value at key {key}: {reason}")]
    Corrupt {
        /// Full key.
        key: String,
        /// Decoder message.
        reason: String,
    },
}

/// Failure of a rendezvous round.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    /// The store failed underneath.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Not enough nodes joined before `join_timeout` (seconds) ran out.
    #[error("rendezvous of run {run} failed after {}: {detail}", crate::human::duration(*waited))]
    Timeout {
        /// Run id.
        run: String,
        /// How long the round was open.
        waited: Duration,
        /// Nodes that joined.
        joined: usize,
        /// Nodes needed.
        min: usize,
        /// Which nodes came.
        detail: String,
    },
    /// The admitted set cannot be ranked into a plan.
    #[error("cannot assign node ranks: {0}")]
    Assignment(String),
    /// The nodes due to form cannot form a group (see [`crate::plan::formable`]).
    #[error("run {run}: {reason}")]
    Unformable {
        /// Run id.
        run: String,
        /// Which nodes, and why not.
        reason: String,
    },
    /// The round this node waited in failed by another participant's verdict, published at
    /// `gen/current.failed`: the message is that participant's error, so every node of the round
    /// reports the same line.
    #[error("{0}")]
    RoundFailed(String),
    /// The run ended (key `finished`) while this node was waiting: nothing to form.
    #[error("run {0} finished while this node was waiting to join")]
    RunFinished(String),
}
