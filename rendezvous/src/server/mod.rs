//! The `drun-rendezvous` program as a library: its subcommands ([`Command`]), serving
//! ([`serve`]: the store, the service with its TLS and tokens, the metrics endpoint, the stop on
//! a signal), `status` ([`status`]), and the one error type that knows its exit code
//! ([`ServerError`]). The binary parses the command line, installs logging and calls [`run`].

mod args;
pub mod auth;
mod error;
pub mod metrics;
pub mod pem_check;
pub mod run_limit;
mod serve;
pub mod service;
mod status;
pub mod tls;
pub mod validate;
pub mod wire;

pub use args::{Command, ServeConfig, StatusArgs, StoreKind};
pub use error::ServerError;
pub use serve::{serve, DRAIN};
pub use status::status;

use crate::LogFormat;

/// Runs `command` to its end: serving until SIGTERM/SIGINT, or printing a run's state.
/// `log_format` is the one the binary installed (JSON: a session's records name its run).
///
/// # Errors
/// [`ServerError`]; its [`ServerError::code`] is the exit code.
pub async fn run(command: Command, log_format: LogFormat) -> Result<(), ServerError> {
    match command {
        Command::Serve(config) => serve(config, log_format).await,
        Command::Status(args) => status(args).await,
    }
}
