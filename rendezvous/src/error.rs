//! Error types of the rendezvous crate.

use std::time::Duration;

/// Failure of a [`crate::Store`] operation.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// etcd refused this client (credentials, permissions, TLS): retrying cannot help.
    #[error("{reason} (etcd at {endpoint})")]
    Refused {
        /// The endpoint(s).
        endpoint: String,
        /// One line: why, and the fix.
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
    /// The nodes due to form cannot form a group (see [`crate::decisions::plan::formable`]).
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

/// Why a `drun-rendezvous` server turned a request down, as the gRPC status carries it. One
/// function maps it to a [`tonic::Status`] ([`ServiceError::to_status`]) and one back
/// ([`ServiceError::from_status`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed (e.g. a session that does not start with Hello). Retrying the
    /// same request cannot help.
    #[error("{0}")]
    InvalidRequest(String),
    /// Agent and server cannot work together (e.g. protocol versions differ). Retrying cannot
    /// help.
    #[error("{0}")]
    Incompatible(String),
    /// The server or its store cannot answer now; another attempt (or replica) may.
    #[error("{0}")]
    Unavailable(String),
    /// The request carries no token, or one not accepted for its run ([`crate::server::auth`]).
    /// Retrying the same request cannot help.
    #[error("{0}")]
    Unauthenticated(String),
    /// The server is at a resource limit (runs served at once, [`crate::server::run_limit`]). Retrying
    /// the same request cannot help until a run ends.
    #[error("{0}")]
    Exhausted(String),
}

impl ServiceError {
    /// The gRPC status of this error.
    pub fn to_status(&self) -> tonic::Status {
        let mut s = match self {
            ServiceError::InvalidRequest(m) => tonic::Status::invalid_argument(m.clone()),
            ServiceError::Incompatible(m) => tonic::Status::failed_precondition(m.clone()),
            ServiceError::Unavailable(m) => tonic::Status::unavailable(m.clone()),
            ServiceError::Unauthenticated(m) => tonic::Status::unauthenticated(m.clone()),
            ServiceError::Exhausted(m) => tonic::Status::resource_exhausted(m.clone()),
        };
        s.metadata_mut().insert(
            FROM_SERVER,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        s
    }

    /// Whether `s` was answered by a `drun-rendezvous` server (as opposed to a transport
    /// failure that tonic reports with the same codes): it carries [`FROM_SERVER`].
    pub fn answered_by_server(s: &tonic::Status) -> bool {
        s.metadata().contains_key(FROM_SERVER)
    }

    /// The error a gRPC status carries; codes other than the four refusals are "unavailable"
    /// (transport errors, a replica going away).
    pub fn from_status(s: &tonic::Status) -> ServiceError {
        let m = s.message().to_string();
        match s.code() {
            tonic::Code::InvalidArgument => ServiceError::InvalidRequest(m),
            tonic::Code::FailedPrecondition => ServiceError::Incompatible(m),
            tonic::Code::Unauthenticated => ServiceError::Unauthenticated(m),
            tonic::Code::ResourceExhausted => ServiceError::Exhausted(m),
            _ => ServiceError::Unavailable(m),
        }
    }

    /// A refusal: the same request to any replica fails the same way, so do not retry.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, ServiceError::Unavailable(_))
    }
}

impl From<ServiceError> for tonic::Status {
    fn from(e: ServiceError) -> Self {
        e.to_status()
    }
}

/// Metadata key a server's error statuses carry (see [`ServiceError::answered_by_server`]).
pub const FROM_SERVER: &str = "drun-server-error";

/// The URL of a `drun-rendezvous` endpoint: `host:port` gets `http://`; a URL stays as it is.
pub fn endpoint_url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// An error with its causes, on one line (`transport error: tcp connect error: Connection
/// refused`); a cause whose text the line already ends with is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    chain_from(e.to_string(), e)
}

/// [`error_chain`] of a gRPC status, starting from its message rather than its `Display`
/// (which is a debug dump of code, message and source).
pub fn status_chain(s: &tonic::Status) -> String {
    chain_from(s.message().to_string(), s)
}

fn chain_from(first: String, e: &dyn std::error::Error) -> String {
    let mut s = first;
    let mut cur = e.source();
    while let Some(c) = cur {
        let c_s = c.to_string();
        if !s.ends_with(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_errors_round_trip_through_grpc_status() {
        for e in [
            ServiceError::InvalidRequest("no Hello".into()),
            ServiceError::Incompatible("drun.v2".into()),
            ServiceError::Unavailable("etcd down".into()),
            ServiceError::Unauthenticated("no token".into()),
            ServiceError::Exhausted("1000 runs".into()),
        ] {
            assert_eq!(ServiceError::from_status(&e.to_status()), e);
        }
        let other = tonic::Status::internal("boom");
        assert!(!ServiceError::from_status(&other).is_refusal());
        assert!(ServiceError::from_status(&tonic::Status::failed_precondition("x")).is_refusal());
    }

    #[test]
    fn endpoints_become_urls() {
        assert_eq!(endpoint_url("10.0.0.1:29400"), "http://10.0.0.1:29400");
        assert_eq!(endpoint_url("https://rdzv:443"), "https://rdzv:443");
    }
}
