//! The validated launch ([`LaunchConfig`]): pure validation of the command line, then side effects.
//!
//! # Theory of operation
//!
//! [`LaunchConfig::from_args`] is three steps: [`Host::probe`] reads the machine (hostname, core
//! and GPU counts, environment, Slurm's `KillWait`); [`validate`] is a pure function of the
//! [`Args`] and the [`Host`] that checks every flag and chooses the rendezvous; [`prepare`]
//! does the filesystem work (resolving the worker command, creating `--ckpt-dir`, reading the
//! `--ckpt-resume-from` manifest). Each concern lives in one file: [`rendezvous`] (the modes),
//! `backend` (choosing one: endpoints, run id), [`timing`] (`--rdzv-conf` and durations),
//! [`parse`] (single flag values), [`host`] (the machine and [`prepare`]), and private files
//! for the checkpoint flags, the entrypoint and the torchrun flags drun refuses. The groups of
//! [`LaunchConfig`] each have a file with their struct and their small validator: `supervision`
//! ([`SupervisionConfig`]), `output` ([`OutputConfig`]), `observe` ([`ObserveConfig`]) and
//! `security` ([`SecurityConfig`]); [`validate`] calls them in turn.

mod backend;
mod ckpt;
mod entry;
mod gpu;
pub mod host;
pub mod local_addr;
mod observe;
mod output;
pub mod parse;
mod python;
pub mod rendezvous;
mod scheduler;
mod security;
mod supervision;
mod target;
pub mod timing;
mod unsupported;
mod validate;
mod workers;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_rendezvous;

use std::time::Duration;

use drun_rendezvous::session::SessionConfig;
use drun_rendezvous::RoundConfig;

pub use crate::cli::Args;
pub use host::{cpu_count, gpu_count, prepare, Host};
pub use observe::ObserveConfig;
pub use output::OutputConfig;
pub use parse::{parse_nnodes, parse_nproc, parse_signals};
pub use rendezvous::{RdzvConfig, RendezvousMode};
pub use scheduler::SchedulerConfig;
pub use security::SecurityConfig;
pub use supervision::SupervisionConfig;
pub use target::{slurm_status_token, status_target};
pub use timing::{parse_rdzv_conf, Timing, RDZV_CONF_KEYS};
pub use validate::validate;
pub use workers::WorkersConfig;

/// How an agent hosting a c10d rendezvous over TLS names its server's cert, key and client CA
/// files in messages.
pub const HOST_TLS_FLAGS: [&str; 3] = [
    "--rdzv-host-tls-cert",
    "--rdzv-host-tls-key",
    "--rdzv-tls-ca",
];

use crate::ckpt::CkptConfig;
use crate::ConfigError;

/// A validated launch.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// This node's workers: how many, the command, stdin, warm interpreters, CPUs and GPUs.
    pub workers: WorkersConfig,
    /// How the group forms: the node range, the rendezvous mode and its timing, this node's
    /// address and pinned rank, the environment check.
    pub rdzv: RdzvConfig,
    /// Run id (TORCHELASTIC_RUN_ID, DRUN_RUN_ID).
    pub run_id: String,
    /// Identity of this node in the rendezvous.
    pub node_id: String,
    /// `--log-format`: JSON records carry the run and the node on every line.
    pub log_format: crate::LogFormat,
    /// The restart budget, the monitor interval, the signals, the grace periods.
    pub supervision: SupervisionConfig,
    /// Where the workers' output goes: log files, console, rank filter, line prefix.
    pub output: OutputConfig,
    /// How the workers are watched: hangs, stragglers, metrics, the preflight check.
    pub observe: ObserveConfig,
    /// Notes about ignored or defaulted flags, printed once at start.
    pub notes: Vec<String>,
    /// Checkpoint ledger settings.
    pub ckpt: CkptConfig,
    /// The Slurm or Kubernetes job, preemption and requeue, the container's files.
    pub scheduler: SchedulerConfig,
    /// Credentials: the rendezvous token and TLS, the Slurm secret, etcd access.
    pub security: SecurityConfig,
}

/// `--preflight` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preflight {
    /// `--preflight-min-gbps`: links under this many Gbit/s are named slow.
    pub min_gbps: Option<f64>,
}

impl LaunchConfig {
    /// Validates the command line against this machine and prepares the launch:
    /// [`Host::probe`], [`validate`], [`prepare`].
    ///
    /// # Errors
    /// [`ConfigError`] naming the flag and the fix.
    pub fn from_args(a: &Args) -> Result<Self, ConfigError> {
        prepare(validate(a, &Host::probe(a))?)
    }

    /// This node's rendezvous session settings: the round's node counts and timing, the lease,
    /// the restart budget. A fixed-size group has no last call.
    pub fn session_config(&self) -> SessionConfig {
        let t = self.rdzv.timing;
        SessionConfig {
            run_id: self.run_id.clone(),
            node_id: self.node_id.clone(),
            round: RoundConfig {
                min_nodes: self.rdzv.min_nodes as usize,
                max_nodes: self.rdzv.max_nodes as usize,
                last_call: if self.rdzv.min_nodes == self.rdzv.max_nodes {
                    Duration::ZERO
                } else {
                    t.last_call
                },
                join_timeout: t.join_timeout,
                settle: t.settle,
            },
            lease_ttl: t.lease_ttl,
            keep_alive_interval: t.keep_alive_interval,
            max_restarts: self.supervision.max_restarts,
            auto_keep_alive: true,
            scale_up_save: self.ckpt.scale_up_save,
            ckpt_interval: self.ckpt.interval,
        }
    }
}

fn invalid(flag: &'static str, value: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.into(),
        why: why.into(),
    }
}
