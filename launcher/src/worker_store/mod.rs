//! The worker store: torch's c10d TCPStore served by the agent of node rank 0, as torchrun does.
//!
//! # Theory of operation
//!
//! Workers find their store at MASTER_ADDR:MASTER_PORT. With `--worker-store agent` (the
//! default) drun sets `TORCHELASTIC_USE_AGENT_STORE=True`, so every worker, rank 0 included,
//! connects as a client (torch's `_create_c10d_store` in `torch/distributed/rendezvous.py`),
//! and the agent that is node rank 0 of the generation serves the protocol ([`codec`],
//! [`state`], [`server`]): on the port it reserved for the generation (it starts listening on
//! the reserved socket, so no other process can take the port in between) or on the
//! `--master-port` the user fixed. Each generation gets a new, empty server; it lives until the
//! agent leaves that generation (after the run ended, on a re-form, or when the agent exits),
//! so a worker that exits early, rank 0 included, never takes the store away from its peers.
//! torch 2.15's workers use no key prefix of their own under the agent store ("a new TCPStore
//! for every retry"); the fresh server per generation gives them the fresh key space they
//! expect.
//!
//! With `--worker-store rank0`, drun keeps `TORCHELASTIC_USE_AGENT_STORE=False` and only holds
//! the port reserved: worker rank 0 hosts the store, as drun did before.

pub mod codec;
#[cfg(test)]
mod codec_tests;
pub mod server;
pub mod state;
#[cfg(test)]
mod state_tests;

use std::time::Duration;

use drun_rendezvous::Plan;

use crate::os::ports::{self, ReservedPort};
use crate::LaunchError;

pub use server::WorkerStore;

/// Who hosts the workers' c10d store (`--worker-store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerStoreMode {
    /// The agent of node rank 0 (`TORCHELASTIC_USE_AGENT_STORE=True`, as torchrun).
    #[default]
    Agent,
    /// Worker rank 0 (`TORCHELASTIC_USE_AGENT_STORE=False`).
    Rank0,
}

impl WorkerStoreMode {
    /// Parses `agent` or `rank0`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "agent" => Some(Self::Agent),
            "rank0" => Some(Self::Rank0),
            _ => None,
        }
    }

    /// The value of TORCHELASTIC_USE_AGENT_STORE: `True` or `False`, spelt as Python prints it.
    pub fn use_agent_store(self) -> &'static str {
        match self {
            Self::Agent => "True",
            Self::Rank0 => "False",
        }
    }
}

/// How long binding a fixed MASTER_PORT is retried while the previous generation's server on
/// it is still closing.
const FIXED_PORT_RETRY: Duration = Duration::from_secs(5);

/// Starts the worker store of generation `plan` when this agent hosts it (`mode` is agent and
/// `node_id` is node rank 0): on `reserved` (taken) when it is the plan's MASTER_PORT, else on
/// the plan's fixed port. `None` when another agent, or worker rank 0, hosts it.
///
/// # Errors
/// [`crate::ConfigError::Invalid`] (exit 2) when another process listens on a fixed
/// `--master-port`; an OS error when the port cannot be listened on otherwise.
pub async fn host(
    mode: WorkerStoreMode,
    plan: &Plan,
    node_id: &str,
    reserved: &mut Option<ReservedPort>,
) -> Result<Option<WorkerStore>, LaunchError> {
    let first = plan.member(node_id).is_some_and(|m| m.node_rank == 0);
    if mode != WorkerStoreMode::Agent || !first {
        return Ok(None);
    }
    let port = plan.master_port;
    let what = || format!("cannot serve the worker store on MASTER_PORT {port}");
    let listener = match reserved.take_if(|r| r.port() == port) {
        Some(r) => r.into_listener().map_err(|e| LaunchError::os(what(), e))?,
        None => {
            let deadline = tokio::time::Instant::now() + FIXED_PORT_RETRY;
            loop {
                match ports::bind_listener(port) {
                    Ok(l) => break l,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AddrInUse
                            && tokio::time::Instant::now() < deadline =>
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                        return Err(LaunchError::Config(crate::ConfigError::Invalid {
                            flag: "--master-port",
                            value: port.to_string(),
                            why: "another process listens on that port, and node rank 0's agent serves the workers' store there: choose a free port, or pass --worker-store rank0 to let worker rank 0 bind it".into(),
                        }));
                    }
                    Err(e) => return Err(LaunchError::os(what(), e)),
                }
            }
        }
    };
    let store = WorkerStore::serve(listener).map_err(|e| LaunchError::os(what(), e))?;
    tracing::debug!(
        gen = plan.generation,
        port,
        "serving the worker store (TCPStore protocol)"
    );
    Ok(Some(store))
}
