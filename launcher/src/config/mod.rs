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
//! for the checkpoint flags, the entrypoint and the torchrun flags drun refuses.

mod backend;
mod ckpt;
mod entry;
pub mod host;
pub mod local_addr;
pub mod parse;
mod python;
pub mod rendezvous;
mod target;
pub mod timing;
mod unsupported;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_rendezvous;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use drun_rendezvous::session::SessionConfig;
use drun_rendezvous::RoundConfig;
use nix::sys::signal::Signal;

pub use crate::cli::Args;
pub use host::{cpu_count, gpu_count, prepare, Host};
pub use parse::{parse_nnodes, parse_nproc, parse_signals};
pub use rendezvous::RendezvousMode;
pub use target::{slurm_status_token, status_target};
pub use timing::{parse_rdzv_conf, Timing, RDZV_CONF_KEYS};
pub use validate::validate;

/// How an agent hosting a c10d rendezvous over TLS names its server's cert, key and client CA
/// files in messages.
pub const HOST_TLS_FLAGS: [&str; 3] = [
    "--rdzv-host-tls-cert",
    "--rdzv-host-tls-key",
    "--rdzv-tls-ca",
];

use crate::ckpt::CkptConfig;
use crate::command::Entrypoint;
use crate::slurm::{OnPreempt, SlurmJob};
use crate::std_spec::StdSpec;
use crate::ConfigError;

/// A validated launch.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// `--nnodes` MIN.
    pub min_nodes: u32,
    /// `--nnodes` MAX.
    pub max_nodes: u32,
    /// Workers on this node (LOCAL_WORLD_SIZE), ≥ 1.
    pub nproc_per_node: u32,
    /// How the group forms.
    pub rendezvous: RendezvousMode,
    /// Run id (TORCHELASTIC_RUN_ID, DRUN_RUN_ID).
    pub run_id: String,
    /// Identity of this node in the rendezvous.
    pub node_id: String,
    /// `--log-format`: JSON records carry the run and the node on every line.
    pub log_format: crate::LogFormat,
    /// Worker-failure restart budget.
    pub max_restarts: u32,
    /// Poll interval of worker state.
    pub monitor_interval: Duration,
    /// ROLE_NAME.
    pub role: String,
    /// The worker command (program resolved by [`prepare`]).
    pub entrypoint: Entrypoint,
    /// `--python`, `DRUN_PYTHON` or `PYTHON_EXEC`, as given (resolved into the entrypoint by
    /// [`prepare`]); `None`: `python3` on PATH.
    pub python: Option<PathBuf>,
    /// Where `python` came from (for the message when it does not exist).
    pub python_source: crate::command::PythonSource,
    /// `--log-dir` base, or `None` for a temporary directory.
    pub log_dir: Option<PathBuf>,
    /// Streams sent only to files.
    pub redirects: StdSpec,
    /// Streams sent to files and the console.
    pub tee: StdSpec,
    /// Local ranks whose output reaches the console; `None` = all.
    pub local_ranks_filter: Option<BTreeSet<u32>>,
    /// Console line prefix template; `None` = `[rank${rank}]:`.
    pub prefix_template: Option<String>,
    /// Signals that trigger forward + teardown.
    pub signals: Vec<Signal>,
    /// `--signals-to-handle` as given (exported as TORCHELASTIC_SIGNALS_TO_HANDLE).
    pub signals_to_handle: String,
    /// Grace between the termination signal and SIGKILL.
    pub shutdown_timeout: Duration,
    /// How long a partial success may last before it counts as a failure.
    pub peer_exit_wait: Duration,
    /// `--hang-timeout`: how long a rank that sent step beacons may send none; `None`: off.
    pub hang_timeout: Option<crate::agent::hang::Timeout>,
    /// `--stdin-rank`: the local rank that reads drun's stdin; the others read `/dev/null`.
    pub stdin_rank: Option<u32>,
    /// `--warm-workers`: restarted workers start on a pre-started interpreter.
    pub warm_workers: crate::warm::WarmWorkers,
    /// `--numa-binding`: each local rank's CPUs near its GPU; `None`: workers are not bound.
    pub numa: Option<crate::numa::Binding>,
    /// `--virtual-local-rank`: each worker sees its own GPU only, as device 0.
    pub virtual_local_rank: bool,
    /// Who hosts the workers' c10d store (`--worker-store`).
    pub worker_store: crate::worker_store::WorkerStoreMode,
    /// Parsed `--rdzv-conf`.
    pub rdzv_conf: BTreeMap<String, String>,
    /// Rendezvous timing knobs.
    pub timing: Timing,
    /// `--node-rank` pinned for a dynamic rendezvous.
    pub requested_node_rank: Option<u32>,
    /// `--local-addr`: address other nodes use to reach this one (else chosen per backend).
    pub advertise_addr: Option<String>,
    /// Notes about ignored or defaulted flags, printed once at start.
    pub notes: Vec<String>,
    /// Checkpoint ledger settings.
    pub ckpt: CkptConfig,
    /// The Slurm job drun runs in, if any.
    pub slurm: Option<SlurmJob>,
    /// What was taken from Slurm, one line (printed at start).
    pub slurm_line: Option<String>,
    /// The Kubernetes job drun runs in, if one was recognized.
    pub k8s: Option<crate::k8s::K8sJob>,
    /// What was taken from it, one line (printed at start).
    pub k8s_line: Option<String>,
    /// `--termination-log`.
    pub termination_log: Option<PathBuf>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
    /// This container's start count on `--state-dir` (0: first start), counted by [`prepare`].
    pub container_restarts: Option<u64>,
    /// `--on-preempt`.
    pub on_preempt: OnPreempt,
    /// `--preempt-signal`.
    pub preempt_signal: Signal,
    /// `--requeue`.
    pub requeue: bool,
    /// `--env-check`.
    pub env_check: drun_rendezvous::envcheck::EnvCheck,
    /// `--fingerprint-cmd`.
    pub fingerprint_cmd: Option<String>,
    /// `--metrics-port` (0: any free port); `None`: no metrics endpoint.
    pub metrics_port: Option<u16>,
    /// `--straggler-factor`: 0 (off) or > 1.
    pub straggler_factor: f64,
    /// `--preflight`, with its `--preflight-min-gbps` (Gbit/s); `None`: no check.
    pub preflight: Option<Preflight>,
    /// `--rdzv-token-file`, read by [`prepare`] into `rdzv_token`.
    pub rdzv_token_file: Option<std::path::PathBuf>,
    /// The token sent to the rendezvous server: `DRUN_RDZV_TOKEN`, or the file's once prepared.
    pub rdzv_token: Option<drun_rendezvous::auth::Secret>,
    /// `--rdzv-tls-ca`, `--rdzv-tls-cert`, `--rdzv-tls-key` (read by [`prepare`] into `rdzv_tls`).
    pub rdzv_tls_files: Option<(PathBuf, Option<PathBuf>, Option<PathBuf>)>,
    /// TLS to the rendezvous server, once prepared.
    pub rdzv_tls: Option<drun_rendezvous::tls::ClientTls>,
    /// `--rdzv-host-tls-cert`/`-key` (c10d only): the identity this agent serves the
    /// rendezvous with when it hosts it, and the CA it requires of clients for mTLS.
    pub rdzv_host_tls: Option<drun_rendezvous::tls::ServerTlsFiles>,
    /// Under Slurm, the file of the secret the rendezvous token is derived from when none is
    /// given (`DRUN_SLURM_SECRET`, else `$HOME/.drun/slurm-secret`; `None`: off or no home).
    pub slurm_secret: Option<PathBuf>,
    /// `--etcd-cacert`, `--etcd-cert`, `--etcd-key`, `--etcd-user`, `--etcd-password-file`,
    /// read by [`prepare`] into `etcd_access`.
    pub etcd_access_files: drun_rendezvous::etcd::access::EtcdAccessFiles,
    /// How the `etcd` backend reaches etcd (TLS, user), once prepared; holds the password
    /// (from the file or `DRUN_ETCD_PASSWORD`), never printed.
    pub etcd_access: drun_rendezvous::etcd::access::EtcdAccess,
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
        let t = self.timing;
        SessionConfig {
            run_id: self.run_id.clone(),
            node_id: self.node_id.clone(),
            round: RoundConfig {
                min_nodes: self.min_nodes as usize,
                max_nodes: self.max_nodes as usize,
                last_call: if self.min_nodes == self.max_nodes {
                    Duration::ZERO
                } else {
                    t.last_call
                },
                join_timeout: t.join_timeout,
                settle: t.settle,
            },
            lease_ttl: t.lease_ttl,
            keep_alive_interval: t.keep_alive_interval,
            max_restarts: self.max_restarts,
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
