//! Why `drun-rendezvous` ended short of its work, and the exit code each reason ends it with
//! ([`ServerError::code`]): 2 for usage (flags, files, addresses), 3 for a store or rendezvous
//! that cannot be reached or refuses, 1 for a server failing while it serves.

use std::net::{AddrParseError, SocketAddr};

use crate::client::token::TokenError;
use crate::error::error_chain;
use crate::server::auth::token_files::TokenFileError;
use crate::server::tls::TlsError;
use crate::status::client::StatusError;
use crate::store::etcd::access::EtcdAccessError;
use crate::StoreError;

/// A failed `drun-rendezvous` command: one readable line, and its exit code.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The etcd TLS or credential flags are incomplete, or one of their files cannot be read.
    #[error(transparent)]
    EtcdAccess(#[from] EtcdAccessError),
    /// A TLS file (`--tls-*`, `--rdzv-tls-*`) cannot be read or is not the PEM it should be.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A `--token-file` cannot be read or holds no usable token.
    #[error("{0} (--token-file)")]
    TokenFile(#[source] TokenFileError),
    /// The token `status` should send (`--rdzv-token-file`, `DRUN_RDZV_TOKEN`) is unusable.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// A `HOST:PORT` flag does not parse.
    #[error("invalid {flag} '{value}': {source} (expected HOST:PORT)")]
    Address {
        /// The flag (`--listen`, `--metrics-addr`).
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why it is no address.
        #[source]
        source: AddrParseError,
    },
    /// `--store etcd` without `--etcd-endpoints`.
    #[error("--store etcd needs --etcd-endpoints HOST:PORT[,...]")]
    NoEtcdEndpoints,
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// `--listen`.
        addr: SocketAddr,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The metrics address cannot be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        /// `--metrics-addr`.
        addr: SocketAddr,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// etcd refused this server (credentials, permissions, certificates).
    #[error(transparent)]
    StoreRefused(StoreError),
    /// etcd did not answer.
    #[error("{source}; is etcd running at {endpoints}?")]
    StoreUnreachable {
        /// `--etcd-endpoints`, comma-separated.
        endpoints: String,
        /// What the store said.
        #[source]
        source: StoreError,
    },
    /// A bound listener has no local address.
    #[error("{0}")]
    LocalAddr(#[source] std::io::Error),
    /// The gRPC server failed while serving (its causes on the same line).
    #[error("server failed: {}", error_chain(.0))]
    Serve(tonic::transport::Error),
    /// `status` printed nothing useful.
    #[error(transparent)]
    Status(#[from] StatusError),
}

impl ServerError {
    /// The exit code (`docs/reference/exit-codes.md`): 2 usage, 3 store or rendezvous, 1 the
    /// server itself; `status` as [`StatusError::code`].
    pub fn code(&self) -> u8 {
        match self {
            ServerError::EtcdAccess(_)
            | ServerError::Tls(_)
            | ServerError::TokenFile(_)
            | ServerError::Token(_)
            | ServerError::Address { .. }
            | ServerError::NoEtcdEndpoints
            | ServerError::Listen { .. }
            | ServerError::Metrics { .. } => 2,
            ServerError::StoreRefused(_) | ServerError::StoreUnreachable { .. } => 3,
            ServerError::LocalAddr(_) | ServerError::Serve(_) => 1,
            ServerError::Status(e) => e.code(),
        }
    }

    /// The error of opening etcd at `endpoints`: a refusal as etcd worded it, anything else
    /// with the question whether etcd runs there.
    pub fn store(endpoints: &[String], e: StoreError) -> ServerError {
        match e {
            StoreError::Refused { .. } => ServerError::StoreRefused(e),
            source => ServerError::StoreUnreachable {
                endpoints: endpoints.join(","),
                source,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_says_its_exit_code() {
        let unavailable = StoreError::Unavailable {
            endpoint: "127.0.0.1:1".into(),
            reason: "connection refused".into(),
        };
        let e = ServerError::store(&["a:1".into(), "b:2".into()], unavailable);
        assert_eq!(e.code(), 3);
        assert!(
            e.to_string().ends_with("; is etcd running at a:1,b:2?"),
            "{e}"
        );
        let refused = StoreError::Refused {
            endpoint: "a:1".into(),
            reason: "bad password".into(),
        };
        let e = ServerError::store(&["a:1".into()], refused.clone());
        assert_eq!((e.code(), e.to_string()), (3, refused.to_string()));
        let bad = "x".parse::<SocketAddr>().unwrap_err();
        let e = ServerError::Address {
            flag: "--listen",
            value: "x".into(),
            source: bad,
        };
        assert_eq!(e.code(), 2);
        assert!(
            e.to_string().starts_with("invalid --listen 'x': ")
                && e.to_string().ends_with(" (expected HOST:PORT)"),
            "{e}"
        );
        assert_eq!(ServerError::NoEtcdEndpoints.code(), 2);
        assert_eq!(ServerError::Status(StatusError::NoRunId).code(), 2);
        assert_eq!(
            ServerError::Status(StatusError::UnknownRun("r".into())).code(),
            3
        );
        let io = std::io::Error::other("gone");
        assert_eq!(ServerError::LocalAddr(io).code(), 1);
    }
}
