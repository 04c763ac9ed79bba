//! Error types of the launcher. Each maps to one documented exit code ([`crate::AgentExit`]).

use std::path::PathBuf;

use crate::AgentExit;

pub use drun_rendezvous::error::{error_chain, status_chain};

/// Bad flags or configuration: one readable line, exit 2, nothing started.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag value is out of range or malformed.
    #[error("invalid {flag} '{value}': {why}")]
    Invalid {
        /// Flag as spelled by torchrun (e.g. `--nnodes`).
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong and what would be accepted.
        why: String,
    },
    /// A flag the launch needs was not given.
    #[error("{flag} is missing: {why}")]
    Missing {
        /// The flag.
        flag: &'static str,
        /// Why it is needed and what to pass.
        why: String,
    },
    /// A flag was given an empty value.
    #[error("{flag} is empty: {why}")]
    Empty {
        /// The flag.
        flag: &'static str,
        /// What to pass instead.
        why: String,
    },
    /// The etcd access flags (`--etcd-cacert`, `--etcd-user`, ...) are incomplete or name a
    /// file that cannot be read: one line naming the flag, never the password.
    #[error(transparent)]
    EtcdAccess(#[from] drun_rendezvous::store::etcd::access::EtcdAccessError),
    /// A TLS file for the rendezvous (`--rdzv-tls-*`, `--rdzv-host-tls-*`) that cannot be
    /// read, is not the PEM it should be or holds a key of another certificate
    /// ([`drun_rendezvous::server::pem_check`]): one line naming the file and its flag, never a key.
    #[error(transparent)]
    Tls(#[from] drun_rendezvous::server::tls::TlsError),
    /// A `DRUN_RDZV_TOKEN` that gRPC metadata cannot carry: one line naming the variable, never
    /// the token.
    #[error(transparent)]
    Token(#[from] drun_rendezvous::client::token::TokenError),
    /// A torchrun flag drun does not implement yet.
    #[error("{flag} is a torchrun flag drun does not implement yet; remove it ({why})")]
    Unsupported {
        /// The flag.
        flag: &'static str,
        /// Extra context.
        why: String,
    },
    /// The training script (or executable) does not exist.
    #[error("training script {path} not found{hint}")]
    MissingScript {
        /// Path as given.
        path: PathBuf,
        /// e.g. " in the current directory /x" or " on PATH".
        hint: String,
    },
    /// The training script (or executable) is a directory (without a `__main__.py`).
    #[error("{} is a directory, not a script or program; name the file in it", .0.display())]
    Directory(PathBuf),
    /// The training script exists but is not a regular file (a FIFO, `<(...)`, a device).
    #[error("{path} is {kind}, not a regular file: every rank reads the script (and drun hashes it for the job's fingerprint), so save it to a file and pass that", path = .0.display(), kind = .1)]
    NotAFile(PathBuf, &'static str),
    /// `--no-python` names a file that cannot be executed.
    #[error("{} is not executable; chmod +x it or drop --no-python", .0.display())]
    NotExecutable(PathBuf),
    /// Two flags that exclude each other.
    #[error("{0} cannot be combined with {1}")]
    Conflict(&'static str, &'static str),
    /// A flag that looks like drun's but came where the training script should be, with the
    /// nearest of drun's flags when one is near.
    #[error(
        "unknown flag '{flag}'{} (drun's own flags go before the training script; see drun --help)",
        .nearest.as_ref().map(|n| format!("; did you mean {n}?")).unwrap_or_default()
    )]
    UnknownFlag {
        /// The flag as given.
        flag: String,
        /// The nearest of drun's flags (`--nnodes` for `--nnodse`).
        nearest: Option<String>,
    },
    /// A path drun must create or write (e.g. --log-dir) is not usable.
    #[error("cannot use {what} {}: {source}", path.display())]
    Path {
        /// What the path is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A directory drun must keep private is not (the worker API socket's, under `TMPDIR`):
    /// the line names it and the fix ([`crate::os::private_dir`]).
    #[error("{0}")]
    UnsafeDir(String),
    /// No Python interpreter could be found.
    #[error("python interpreter '{python}'{} not found; {}", .from.origin(), .from.fix())]
    MissingPython {
        /// The interpreter as asked for.
        python: String,
        /// Where it was asked for.
        from: crate::command::PythonSource,
    },
}

/// Anything that ends the agent with a non-zero code other than a worker failure.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Configuration error (exit 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Rendezvous failure (exit 3).
    #[error("rendezvous failed: {0}")]
    Rendezvous(#[from] drun_rendezvous::RendezvousError),
    /// The rendezvous reported a terminal error (exit 3), one line.
    #[error("rendezvous failed: {0}")]
    RendezvousFailed(String),
    /// The run id belongs to a run that already ended (exit 3).
    #[error(
        "run {run} already finished at {at} ({outcome}); start a new run with a new --rdzv-id"
    )]
    RunFinished {
        /// Run id.
        run: String,
        /// When it ended (local time).
        at: String,
        /// "succeeded" or "failed: ...".
        outcome: String,
    },
    /// The store underneath failed (exit 3).
    #[error("rendezvous store failed: {0}")]
    Store(#[from] drun_rendezvous::StoreError),
    /// A worker's program could not be started (exit 1, after the job-wide decision): why, in
    /// words (see [`crate::os::exec_error`]).
    #[error("cannot start worker: {0}")]
    WorkerStart(String),
    /// A GPU of this node failed its health check in a run of a fixed size (exit 6): the GPUs and
    /// reasons, one line.
    #[error("{0}")]
    GpuUnhealthy(String),
    /// An OS-level failure while setting up the agent or spawning workers (exit 1).
    #[error("{what}: {source}")]
    Os {
        /// What drun was doing.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl LaunchError {
    /// Wraps an I/O error with what drun was doing.
    pub fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        LaunchError::Os {
            what: what.into(),
            source,
        }
    }

    /// The exit code this error ends the agent with.
    pub fn exit(&self) -> AgentExit {
        match self {
            LaunchError::Config(_) => AgentExit::Usage,
            // The nodes' configs or environments do not match (`--env-check`): a usage error
            // on every node, as a bad flag on one would be.
            LaunchError::Rendezvous(_) | LaunchError::RendezvousFailed(_)
                if drun_rendezvous::decisions::envcheck::is_refusal(&self.to_string()) =>
            {
                AgentExit::Usage
            }
            LaunchError::Rendezvous(_)
            | LaunchError::RendezvousFailed(_)
            | LaunchError::RunFinished { .. }
            | LaunchError::Store(_) => AgentExit::Rendezvous,
            LaunchError::Os { .. } | LaunchError::WorkerStart(_) => AgentExit::WorkerFailure,
            LaunchError::GpuUnhealthy(_) => AgentExit::GpuUnhealthy,
        }
    }
}
