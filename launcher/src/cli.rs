//! Command line: torchrun's flags with torchrun's spellings, defaults and `PET_*` fallbacks.
//!
//! Follows `torch/distributed/run.py` (`get_args_parser`) of PyTorch 2.15: every multi-word flag
//! also accepts its underscore spelling, every flag but `--logs-specs`, `--numa-binding` and
//! `--print-completion` reads `PET_<DEST>` when absent from the command line (Kubeflow injects
//! these), and everything after the training script is handed to it untouched. [`Args`] is the
//! raw parse; [`crate::config::validate`] validates it. As with argparse, a repeated flag
//! takes its last value, and boolean `PET_*` variables take `1`/`0` (also `true`/`false`).

mod ckpt;
mod container;
mod env_source;
mod host_tls;
mod observe;

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser};

pub use ckpt::CkptArgs;
pub use container::ContainerArgs;
pub use drun_rendezvous::store::etcd::args::EtcdArgs;
pub use env_source::{env_source, flag_env_source};
pub use host_tls::HostTlsArgs;
pub use observe::ObserveArgs;

use crate::exit::EXIT_CODES_HELP;
use crate::LogFormat;

/// `drun [OPTIONS] TRAINING_SCRIPT [ARGS]...` — the raw, unvalidated command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "drun",
    version,
    about = "Elastic, torchrun-compatible launcher for distributed training",
    after_help = EXIT_CODES_HELP,
    args_override_self = true,
    // torchrun's argparse takes any unambiguous prefix of a flag (`--stand`).
    infer_long_args = true
)]
pub struct Args {
    /// Number of nodes: `N` or `MIN:MAX` (elastic), with 0 < MIN <= MAX.
    #[arg(
        long,
        env = "PET_NNODES",
        default_value = "1:1",
        value_name = "N|MIN:MAX",
        help_heading = "Worker group"
    )]
    pub nnodes: String,

    /// Workers on this node: an integer ≥ 1, `cpu` (usable cores), `gpu` (NVIDIA devices, error if
    /// none), or `auto` (GPUs if any, else cores).
    #[arg(
        long = "nproc-per-node",
        visible_alias = "nproc_per_node",
        env = "PET_NPROC_PER_NODE",
        default_value = "1",
        help_heading = "Worker group"
    )]
    pub nproc_per_node: String,

    /// Single-node run with an in-process rendezvous (embedded in-memory store), an ephemeral
    /// MASTER_PORT and a random run id. Explicit rendezvous flags are ignored, as in torchrun.
    #[arg(long, env = "PET_STANDALONE",
        value_parser = BoolishValueParser::new(), help_heading = "Rendezvous")]
    pub standalone: bool,

    /// Rendezvous backend: `drun` (drun-rendezvous servers; the default with --rdzv-endpoint),
    /// `c10d` (one agent hosts it), `embedded` (the agent on the endpoint's host serves it from
    /// memory; the Slurm default), `etcd`/`etcd-v2` (agents use etcd v3 directly), `static`
    /// (the default without an endpoint).
    #[arg(
        long = "rdzv-backend",
        visible_alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND",
        help_heading = "Rendezvous"
    )]
    pub rdzv_backend: Option<String>,

    /// Rendezvous endpoint `host[:port]` (IPv6 in brackets); several `a:p,b:p` for drun replicas
    /// or an etcd cluster. Default ports: 29400 (drun, c10d), 2379 (etcd).
    #[arg(
        long = "rdzv-endpoint",
        visible_alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT",
        help_heading = "Rendezvous"
    )]
    pub rdzv_endpoint: Option<String>,

    /// Run id shared by every node of the job (becomes TORCHELASTIC_RUN_ID).
    #[arg(
        long = "rdzv-id",
        visible_alias = "rdzv_id",
        env = "PET_RDZV_ID",
        default_value = "none",
        help_heading = "Rendezvous"
    )]
    pub rdzv_id: String,

    /// Extra rendezvous settings `key=value,...`: `join_timeout` (s, default 600),
    /// `last_call_timeout` (s, 30), `lease_ttl` (s, 10), `keep_alive_interval` (s, lease_ttl/3),
    /// `reform_settle` (s, 1: a re-form whose surviving members all rejoined with newcomers
    /// forms this long after MIN instead of waiting out the last call; without newcomers it
    /// forms at once), `is_host` (c10d: 1 hosts, 0 never hosts).
    #[arg(
        long = "rdzv-conf",
        visible_alias = "rdzv_conf",
        env = "PET_RDZV_CONF",
        default_value = "",
        help_heading = "Rendezvous"
    )]
    pub rdzv_conf: String,

    /// Worker-failure restarts of the group before giving up (≥ 0).
    #[arg(
        long = "max-restarts",
        visible_alias = "max_restarts",
        env = "PET_MAX_RESTARTS",
        default_value_t = 0,
        help_heading = "Supervision"
    )]
    pub max_restarts: u32,

    /// Seconds between polls of worker state (> 0). drun also reacts to SIGCHLD at once.
    #[arg(
        long = "monitor-interval",
        visible_alias = "monitor_interval",
        env = "PET_MONITOR_INTERVAL",
        default_value_t = 0.1,
        help_heading = "Supervision"
    )]
    pub monitor_interval: f64,

    /// Multiprocessing start method; only meaningful for function entrypoints, as in torchrun.
    #[arg(long = "start-method", visible_alias = "start_method", env = "PET_START_METHOD", default_value = "spawn", value_parser = ["spawn", "fork", "forkserver"], help_heading = "Supervision")]
    pub start_method: String,

    /// Role name (ROLE_NAME, and the default log prefix of tee'd lines).
    #[arg(
        long,
        env = "PET_ROLE",
        default_value = "default",
        help_heading = "Worker group"
    )]
    pub role: String,

    /// Run the script as a Python module (`python -u -m MODULE`).
    #[arg(short = 'm', long, env = "PET_MODULE",
        value_parser = BoolishValueParser::new(), help_heading = "Entrypoint")]
    pub module: bool,

    /// Execute the training script directly instead of through Python.
    #[arg(
        long = "no-python",
        visible_alias = "no_python",
        env = "PET_NO_PYTHON",
        value_parser = BoolishValueParser::new(),
        help_heading = "Entrypoint"
    )]
    pub no_python: bool,

    /// Run the script with `runpy.run_path` (torchrun's function entrypoint); wins over --no-python.
    #[arg(
        long = "run-path",
        visible_alias = "run_path",
        env = "PET_RUN_PATH",
        value_parser = BoolishValueParser::new(),
        help_heading = "Entrypoint"
    )]
    pub run_path: bool,

    /// Python interpreter for workers (default: $DRUN_PYTHON, then $PYTHON_EXEC, then `python3` on PATH).
    // DRUN_PYTHON is read (and checked) by `config::validate`, which can then name the source.
    #[arg(long, help_heading = "Entrypoint")]
    pub python: Option<PathBuf>,

    /// Base directory for `<run>_<rand>/attempt_<n>/<local_rank>/{stdout,stderr}.log,error.json`.
    #[arg(
        long = "log-dir",
        visible_alias = "log_dir",
        env = "PET_LOG_DIR",
        help_heading = "Logs"
    )]
    pub log_dir: Option<PathBuf>,

    /// Streams sent to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or `local_rank:N,...`.
    #[arg(
        short = 'r',
        long,
        env = "PET_REDIRECTS",
        default_value = "0",
        help_heading = "Logs"
    )]
    pub redirects: String,

    /// Streams written to log files and the console; same format as --redirects.
    #[arg(
        short = 't',
        long,
        env = "PET_TEE",
        default_value = "0",
        help_heading = "Logs"
    )]
    pub tee: String,

    /// Comma-separated local ranks whose output reaches the console (log files keep everything).
    #[arg(
        long = "local-ranks-filter",
        visible_alias = "local_ranks_filter",
        env = "PET_LOCAL_RANKS_FILTER",
        default_value = "",
        help_heading = "Logs"
    )]
    pub local_ranks_filter: String,

    /// Prefix of console lines: `${role_name}`, `${local_rank}`, `${rank}`, `${hostname}`
    /// (default `[rank${rank}]:`; an empty value prints lines bare). Also read from
    /// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
    #[arg(
        long = "log-line-prefix-template",
        visible_alias = "log_line_prefix_template",
        env = "PET_LOG_LINE_PREFIX_TEMPLATE",
        help_heading = "Logs"
    )]
    pub log_line_prefix_template: Option<String>,

    /// This node's rank: required by a multi-node static launch; with a dynamic backend a pin
    /// that orders the nodes (pinned first, in pin order; gaps left by lost nodes close up).
    #[arg(
        long = "node-rank",
        visible_alias = "node_rank",
        env = "PET_NODE_RANK",
        help_heading = "Rendezvous"
    )]
    pub node_rank: Option<u32>,

    /// Address of node rank 0 for the static backend.
    #[arg(
        long = "master-addr",
        visible_alias = "master_addr",
        env = "PET_MASTER_ADDR",
        default_value = "127.0.0.1",
        help_heading = "Static rendezvous"
    )]
    pub master_addr: String,

    /// Port of node rank 0 for the static backend (torchrun default 29500).
    #[arg(
        long = "master-port",
        visible_alias = "master_port",
        env = "PET_MASTER_PORT",
        help_heading = "Static rendezvous"
    )]
    pub master_port: Option<u16>,

    /// This node's address/identity in the rendezvous (rank sort key; MASTER_ADDR on node rank 0).
    #[arg(
        long = "local-addr",
        visible_alias = "local_addr",
        env = "PET_LOCAL_ADDR",
        help_heading = "Rendezvous"
    )]
    pub local_addr: Option<String>,

    /// File whose first line is the token sent to the rendezvous server (drun, c10d backends);
    /// the token itself may instead be in the environment variable DRUN_RDZV_TOKEN (the file
    /// wins). Never given on the command line, so `ps` does not show it; removed from the
    /// workers' environment.
    #[arg(
        long = "rdzv-token-file",
        env = "DRUN_RDZV_TOKEN_FILE",
        value_name = "PATH",
        help_heading = "Rendezvous"
    )]
    pub rdzv_token_file: Option<PathBuf>,

    /// Reach the rendezvous server (drun backend) over TLS, trusting this PEM CA.
    #[arg(
        long = "rdzv-tls-ca",
        env = "DRUN_RDZV_TLS_CA",
        value_name = "PATH",
        help_heading = "Rendezvous"
    )]
    pub rdzv_tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for a server requiring mutual TLS; with --rdzv-tls-key.
    #[arg(
        long = "rdzv-tls-cert",
        env = "DRUN_RDZV_TLS_CERT",
        value_name = "PATH",
        help_heading = "Rendezvous"
    )]
    pub rdzv_tls_cert: Option<PathBuf>,

    /// The PEM private key of --rdzv-tls-cert.
    #[arg(
        long = "rdzv-tls-key",
        env = "DRUN_RDZV_TLS_KEY",
        value_name = "PATH",
        help_heading = "Rendezvous"
    )]
    pub rdzv_tls_key: Option<PathBuf>,

    /// Signals forwarded to every worker before teardown (SIGUSR1/SIGUSR2 are always relayed
    /// without teardown).
    #[arg(
        long = "signals-to-handle",
        visible_alias = "signals_to_handle",
        env = "PET_SIGNALS_TO_HANDLE",
        default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        help_heading = "Supervision"
    )]
    pub signals_to_handle: String,

    /// Seconds between the termination signal and SIGKILL (default: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30).
    #[arg(
        long = "shutdown-timeout",
        visible_alias = "shutdown_timeout",
        env = "PET_SHUTDOWN_TIMEOUT",
        help_heading = "Supervision"
    )]
    pub shutdown_timeout: Option<f64>,

    /// Seconds a partial success may last: once some workers (or nodes) finished with exit 0,
    /// the rest must finish within this long, else the generation counts as failed (default
    /// 300, torchrun's exit-barrier timeout).
    #[arg(
        long = "peer-exit-wait",
        visible_alias = "peer_exit_wait",
        env = "DRUN_PEER_EXIT_WAIT",
        default_value_t = 300.0,
        help_heading = "Supervision"
    )]
    pub peer_exit_wait: f64,

    /// Hang detection from step beacons (`drun.progress(step)`): when a rank sends no beacon
    /// for this long (seconds, or with a suffix `s`, `m`, `h`), drun dumps its Python stacks
    /// (`py-spy dump` when on PATH, else faulthandler on SIGUSR1), names the stuck ranks and
    /// fails the group (one restart of `--max-restarts`). A rank that never sent a beacon is
    /// never judged. `off` (default) disables it; `auto`: 10 × the median step time once a rank
    /// sent 10 beacons, at least 60 s.
    #[arg(
        long = "hang-timeout",
        visible_alias = "hang_timeout",
        env = "DRUN_HANG_TIMEOUT",
        value_name = "SECONDS|auto|off",
        default_value = "off",
        help_heading = "Supervision"
    )]
    pub hang_timeout: String,

    /// The local rank that reads drun's stdin (for `pdb`/`breakpoint()` at a terminal). Every
    /// other worker, and every worker without this flag, reads `/dev/null` (end-of-file at
    /// once), so a stray `input()` cannot hang the job on the terminal.
    #[arg(
        long = "stdin-rank",
        visible_alias = "stdin_rank",
        env = "DRUN_STDIN_RANK",
        value_name = "LOCAL_RANK",
        help_heading = "Supervision"
    )]
    pub stdin_rank: Option<u32>,

    /// `on`: while a generation trains, keep one more interpreter per local rank that has
    /// imported torch and waits, so a restarted worker (after a worker failure or a node loss)
    /// skips interpreter start and `import torch`. Only for `python script.py` entrypoints;
    /// none on one node once its restarts are spent (no generation can follow). `off`: every worker starts a new interpreter (for scripts that
    /// need a fresh interpreter at import, or to save the memory of the waiting interpreters).
    #[arg(
        long = "warm-workers",
        visible_alias = "warm_workers",
        value_enum,
        env = "DRUN_WARM_WORKERS",
        default_value = "on",
        help_heading = "Supervision"
    )]
    pub warm_workers: crate::warm::WarmWorkers,

    /// Who hosts the workers' c10d store on MASTER_PORT: `agent` (the agent of node rank 0
    /// serves torch's TCPStore protocol and outlives every worker, as torchrun;
    /// TORCHELASTIC_USE_AGENT_STORE=True) or `rank0` (worker rank 0 hosts it;
    /// TORCHELASTIC_USE_AGENT_STORE=False).
    #[arg(
        long = "worker-store",
        visible_alias = "worker_store",
        env = "DRUN_WORKER_STORE",
        default_value = "agent",
        value_parser = ["agent", "rank0"],
        help_heading = "Rendezvous"
    )]
    pub worker_store: String,

    /// What differences between the nodes' environments do at formation: `warn` prints one
    /// table of the differing keys (drun, torch, CUDA, NCCL, cuDNN, Python, OS, GPUs, NCCL_*/
    /// TORCH_*/GLOO_* variables, --fingerprint-cmd output, launch config) per node on every
    /// agent; `strict` refuses to form (exit 2 on every node, naming the nodes and keys); `off`
    /// prints nothing. The strictest setting among the nodes wins. Different --nnodes or a
    /// different Python script (SHA-256) are refused whatever the setting (exit 2).
    #[arg(
        long = "env-check",
        env = "DRUN_ENV_CHECK",
        default_value = "warn",
        value_parser = ["off", "warn", "strict"],
        help_heading = "Environment check"
    )]
    pub env_check: String,

    /// A shell command whose output (trimmed) joins this node's environment fingerprint, e.g.
    /// the container image digest; run once at start with `sh -c`. It may take up to 10 s; past
    /// that its process group is killed and its value is "(timed out after 10 s)" (which then
    /// differs from the nodes where it answered). Default: none.
    #[arg(
        long = "fingerprint-cmd",
        env = "DRUN_FINGERPRINT_CMD",
        value_name = "CMD",
        help_heading = "Environment check"
    )]
    pub fingerprint_cmd: Option<String>,

    /// Metrics and detection: `--metrics-port`, `--straggler-factor`, `--preflight`.
    #[command(flatten)]
    pub observe: ObserveArgs,

    /// etcd TLS and credentials (`--rdzv-backend etcd`, `--status` read from etcd).
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Checkpoint ledger flags: `--ckpt-*`, `--on-scale-up`, `--expected-mtbf`.
    #[command(flatten)]
    pub ckpt: CkptArgs,

    /// A c10d host's TLS identity: `--rdzv-host-tls-cert`, `--rdzv-host-tls-key`.
    #[command(flatten)]
    pub host_tls: HostTlsArgs,

    /// Inside a Slurm job (SLURM_JOB_ID set): `auto` takes the run id, --nnodes, node rank,
    /// node address and an embedded rendezvous on the first node from SLURM_* (explicit flags
    /// win; what was taken is printed at start); `off` ignores Slurm.
    #[arg(
        long,
        value_enum,
        env = "DRUN_SLURM",
        default_value = "auto",
        help_heading = "Slurm and preemption"
    )]
    pub slurm: crate::slurm::SlurmMode,

    /// Inside a Kubernetes training job (Kubeflow PyTorchJob or TrainJob, JobSet, Indexed Job,
    /// Volcano): `auto` takes nnodes, node rank, master or an embedded rendezvous on the
    /// index-0 pod, and the run id from what the operator injected (explicit flags and PET_*
    /// win; what was taken is printed at start; `drun doctor` shows every source); `off`
    /// ignores it.
    #[arg(
        long,
        value_enum,
        env = "DRUN_KUBERNETES",
        default_value = "auto",
        help_heading = "Kubernetes"
    )]
    pub kubernetes: crate::k8s::K8sMode,

    /// The container's records: `--termination-log`, `--state-dir`.
    #[command(flatten)]
    pub container: ContainerArgs,

    /// What a preemption warning (--preempt-signal, e.g. from `sbatch --signal=USR1@60` or
    /// `scancel --signal=USR1`) does: `relay` passes it to the workers; `checkpoint` instead asks
    /// every rank of the job for a coordinated checkpoint (`should_save` turns true), waits until
    /// it is sealed, stops the workers and exits 5 ("requeue me").
    #[arg(
        long = "on-preempt",
        value_enum,
        default_value = "relay",
        help_heading = "Slurm and preemption"
    )]
    pub on_preempt: crate::slurm::OnPreempt,

    /// The preemption warning signal (default SIGUSR1).
    #[arg(
        long = "preempt-signal",
        default_value = "SIGUSR1",
        help_heading = "Slurm and preemption"
    )]
    pub preempt_signal: String,

    /// With --on-preempt checkpoint inside Slurm: after the seal, the agent of node rank 0 runs
    /// `scontrol requeue $SLURM_JOB_ID` (the job restarts with the same id and resumes).
    #[arg(long, help_heading = "Slurm and preemption")]
    pub requeue: bool,

    /// More agent log output (-v debug, -vv trace). RUST_LOG / DRUN_LOG override.
    #[arg(short = 'v', long, action = ArgAction::Count, help_heading = "Agent logs")]
    pub verbose: u8,

    /// Only warnings and errors from the agent itself.
    #[arg(short = 'q', long, help_heading = "Agent logs")]
    pub quiet: bool,

    /// The agent's log records: `human` lines or `json`, one object per line with `run`, `gen`,
    /// `node` (and `rank` where one is meant) as fields. Worker output is never reformatted.
    #[arg(
        long,
        value_enum,
        env = "DRUN_LOG_FORMAT",
        default_value_t = LogFormat::Human,
        help_heading = "Agent logs"
    )]
    pub log_format: LogFormat,

    /// Print the state of the run this agent's rendezvous flags name (--rdzv-backend,
    /// --rdzv-endpoint, --rdzv-id, or their PET_*/Slurm values) and exit instead of launching:
    /// members, generation, ranks, each node's state, standbys, restarts, the last formation,
    /// the latest checkpoint. Asks the drun-rendezvous server or the c10d/embedded host (its
    /// Status RPC), or reads etcd; a --standalone or static run has nothing to ask (exit 2).
    /// Exit 3: unreachable rendezvous or unknown run.
    #[arg(long, help_heading = "Run status")]
    pub status: bool,

    /// With --status: print one JSON document (`drun-rendezvous status --json`) instead of the
    /// human view; with --watch, one compact document per line per refresh.
    #[arg(long, requires = "status", help_heading = "Run status")]
    pub json: bool,

    /// With --status: redraw every INTERVAL until Ctrl-C. INTERVAL is seconds (`5`, `0.5`) or
    /// `500ms`/`2s`/`1m`, from 50 ms to 1 day; `--watch` alone: 2 s.
    #[arg(
        long,
        requires = "status",
        value_name = "INTERVAL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "2",
        value_parser = crate::status::parse_interval,
        help_heading = "Run status"
    )]
    pub watch: Option<std::time::Duration>,

    /// Bind each worker to the CPUs near its GPU (the GPU whose index is its local rank):
    /// node, socket, exclusive or core-complex, as torchrun's modes.
    #[arg(
        long = "numa-binding",
        alias = "numa_binding",
        value_name = "MODE",
        value_parser = ["node", "socket", "exclusive", "core-complex"],
        help_heading = "Supervision"
    )]
    pub numa_binding: Option<String>,
    /// torchrun flag not implemented by drun (rejected).
    #[arg(long = "logs-specs", alias = "logs_specs", hide = true)]
    pub logs_specs: Option<String>,
    /// Each worker sees only its own GPU, as device 0: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES
    /// set to the agent's entry at its local rank (as torchrun).
    #[arg(
        long = "virtual-local-rank",
        alias = "virtual_local_rank",
        env = "PET_VIRTUAL_LOCAL_RANK",
        value_parser = BoolishValueParser::new(),
        help_heading = "Supervision"
    )]
    pub virtual_local_rank: bool,
    /// torchrun flag not implemented by drun (rejected).
    #[arg(
        long = "duplicate-stdout-filters",
        alias = "duplicate_stdout_filters",
        env = "PET_DUPLICATE_STDOUT_FILTERS",
        hide = true
    )]
    pub duplicate_stdout_filters: Option<String>,
    /// torchrun flag not implemented by drun (rejected).
    #[arg(
        long = "duplicate-stderr-filters",
        alias = "duplicate_stderr_filters",
        env = "PET_DUPLICATE_STDERR_FILTERS",
        hide = true
    )]
    pub duplicate_stderr_filters: Option<String>,
    /// torchrun flag: only `null` (the default) is accepted.
    #[arg(
        long = "event-log-handler",
        alias = "event_log_handler",
        env = "PET_EVENT_LOG_HANDLER",
        hide = true
    )]
    pub event_log_handler: Option<String>,
    /// torchrun flag not implemented by drun (rejected).
    #[arg(long = "print-completion", alias = "print_completion", hide = true)]
    pub print_completion: Option<String>,

    /// The training script (or module with -m, or executable with --no-python) and its arguments,
    /// passed through untouched; `${local_rank}` in them is replaced by the worker's local rank.
    #[arg(
        required_unless_present_any = ["status", "print_completion"],
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "TRAINING_SCRIPT [ARGS]"
    )]
    pub script_and_args: Vec<String>,
}
