//! `LaunchConfig`: the validated launch, built from [`crate::Args`] (or directly by tests).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::ckpt::CkptConfig;
use crate::command::{EntryKind, Entrypoint};
use crate::slurm::{self, OnPreempt, SlurmJob, SlurmMode};
use crate::std_spec::StdSpec;
use crate::{Args, ConfigError};

/// How this node finds its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousMode {
    /// One-node group on the in-process rendezvous (embedded in-memory store). MASTER_ADDR is
    /// `master_addr`; MASTER_PORT is reserved per generation unless `fixed_port` is given.
    Embedded {
        /// Address workers use to reach rank 0's store.
        master_addr: String,
        /// `--master-port` of a one-node static launch; `None` = a fresh free port per generation.
        fixed_port: Option<u16>,
    },
    /// torchrun's static backend across several nodes: no rendezvous at all.
    Static {
        /// `--node-rank`.
        node_rank: u32,
        /// `--master-addr`.
        master_addr: String,
        /// `--master-port` (default 29500).
        master_port: u16,
    },
    /// `drun-rendezvous` replicas (`--rdzv-backend drun`), `host:port` each.
    Server {
        /// Replica endpoints, tried in order on failure.
        endpoints: Vec<String>,
    },
    /// torchrun's c10d backend: the agent that can bind `endpoint` hosts an embedded server.
    C10d {
        /// `host:port`.
        endpoint: String,
        /// `--rdzv-conf is_host=`: force (true) or forbid (false) hosting.
        is_host: Option<bool>,
    },
    /// Every agent runs the rendezvous directly on etcd v3 (`--rdzv-backend etcd`/`etcd-v2`).
    Etcd {
        /// etcd client endpoints.
        endpoints: Vec<String>,
    },
}

impl std::fmt::Display for RendezvousMode {
    /// As printed at start: the backend in the README's words.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RendezvousMode::Embedded { .. } => write!(f, "embedded (this agent, in memory)"),
            RendezvousMode::Static {
                master_addr,
                master_port,
                ..
            } => write!(f, "static (master {master_addr}:{master_port})"),
            RendezvousMode::Server { endpoints } => {
                write!(f, "drun servers {}", endpoints.join(","))
            }
            RendezvousMode::C10d {
                endpoint,
                is_host: Some(true),
            } => write!(f, "embedded on {endpoint}, hosted by this agent"),
            RendezvousMode::C10d {
                endpoint,
                is_host: Some(false),
            } => write!(f, "embedded on {endpoint}, hosted by another agent"),
            RendezvousMode::C10d { endpoint, .. } => {
                write!(
                    f,
                    "c10d on {endpoint} (hosted by the agent that can bind it)"
                )
            }
            RendezvousMode::Etcd { endpoints } => write!(f, "etcd {}", endpoints.join(",")),
        }
    }
}

fn rendezvous_is_static(m: &RendezvousMode) -> bool {
    matches!(
        m,
        RendezvousMode::Static { .. }
            | RendezvousMode::Embedded {
                fixed_port: Some(_),
                ..
            }
    )
}

/// The `--rdzv-conf` keys drun reads; others are reported once at start.
pub const RDZV_CONF_KEYS: [&str; 6] = [
    "join_timeout",
    "last_call_timeout",
    "lease_ttl",
    "keep_alive_interval",
    "reform_settle",
    "is_host",
];

/// Rendezvous timing, from `--rdzv-conf` (seconds) with torchrun's defaults where it has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Give up below MIN nodes after this long (`join_timeout`, default 600 s).
    pub join_timeout: Duration,
    /// Last-call window once MIN nodes joined (`last_call_timeout`, default 30 s).
    pub last_call: Duration,
    /// Lease TTL (`lease_ttl`, default 10 s).
    pub lease_ttl: Duration,
    /// Keep-alive period (`keep_alive_interval`, default lease_ttl / 3).
    pub keep_alive_interval: Duration,
    /// Settle window of a re-form whose surviving members all rejoined (`reform_settle`,
    /// default 1 s; never longer than the last call).
    pub settle: Duration,
}

impl Timing {
    /// Reads the knobs from a parsed `--rdzv-conf`.
    ///
    /// # Errors
    /// A value that is not a non-negative number of seconds, or a keep-alive not below the TTL.
    pub fn from_conf(conf: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let secs = |key: &str, default: f64| -> Result<Duration, ConfigError> {
            match conf.get(key) {
                None => Ok(Duration::from_secs_f64(default)),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && (0.0..=MAX_SECONDS).contains(s))
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        invalid(
                            "--rdzv-conf",
                            format!("{key}={v}"),
                            "expected seconds from 0 to 2592000 (30 days)",
                        )
                    }),
            }
        };
        let lease_ttl = secs("lease_ttl", 10.0)?.max(Duration::from_secs(1));
        let keep_alive_interval = match conf.get("keep_alive_interval") {
            Some(_) => secs("keep_alive_interval", 0.0)?,
            None => lease_ttl / 3,
        };
        if keep_alive_interval.is_zero() || keep_alive_interval >= lease_ttl {
            return Err(invalid(
                "--rdzv-conf",
                format!("keep_alive_interval={}", keep_alive_interval.as_secs_f64()),
                "must be > 0 and below lease_ttl",
            ));
        }
        Ok(Timing {
            join_timeout: secs("join_timeout", 600.0)?,
            last_call: secs("last_call_timeout", 30.0)?,
            lease_ttl,
            keep_alive_interval,
            settle: secs(
                "reform_settle",
                drun_rendezvous::core::DEFAULT_SETTLE.as_secs_f64(),
            )?,
        })
    }
}

/// Chooses the rendezvous mode and run id following torchrun's rules, plus drun's refusals
/// (no silent localhost fallback, no shared default run id across nodes).
fn rendezvous_mode(
    a: &Args,
    min_nodes: u32,
    max_nodes: u32,
    conf: &BTreeMap<String, String>,
    slurm: Option<&SlurmJob>,
    notes: &mut Vec<String>,
) -> Result<(RendezvousMode, String), ConfigError> {
    let backend = match a.rdzv_backend.as_deref() {
        Some(b) => b,
        None if a.rdzv_endpoint.is_empty() => "static",
        None => "drun",
    };
    if !matches!(
        backend,
        "static" | "c10d" | "embedded" | "etcd" | "etcd-v2" | "drun"
    ) {
        return Err(invalid(
            "--rdzv-backend",
            backend,
            "expected drun, c10d, embedded, etcd, etcd-v2 or static",
        ));
    }
    let local_master = || a.local_addr.clone().unwrap_or_else(|| "127.0.0.1".into());
    // torchrun run(): static + no endpoint + no --master-port + one node = standalone.
    let implicit_standalone = backend == "static"
        && a.rdzv_endpoint.is_empty()
        && a.master_port.is_none()
        && max_nodes == 1;
    if a.standalone || implicit_standalone {
        if max_nodes > 1 {
            return Err(invalid(
                "--nnodes",
                a.nnodes.clone(),
                "--standalone runs one node; drop --standalone or use --nnodes 1",
            ));
        }
        if a.standalone && (!a.rdzv_endpoint.is_empty() || a.rdzv_backend.is_some()) {
            notes.push(
                "--standalone: ignoring the explicit --rdzv-endpoint/--rdzv-backend, as torchrun does"
                    .into(),
            );
        }
        let mode = RendezvousMode::Embedded {
            master_addr: local_master(),
            fixed_port: None,
        };
        // torchrun draws a random run id; an explicit --rdzv-id is kept so that a later launch
        // with the same id resumes this run's checkpoints (from --ckpt-dir).
        let run_id = if a.rdzv_id != "none" {
            a.rdzv_id.clone()
        } else {
            uuid::Uuid::new_v4().to_string()
        };
        return Ok((mode, run_id));
    }
    if backend == "static" {
        let run_id = if a.rdzv_id != "none" {
            a.rdzv_id.clone()
        } else {
            std::env::var("SLURM_JOB_ID")
                .ok()
                .filter(|j| !j.is_empty())
                .unwrap_or_else(|| a.rdzv_id.clone())
        };
        // torchrun: a static launch's endpoint, when given, is the master address and port.
        let (master_addr, master_port) = if a.rdzv_endpoint.trim().is_empty() {
            (a.master_addr.clone(), a.master_port.unwrap_or(29500))
        } else {
            let ep =
                crate::rdzv::endpoints(&a.rdzv_endpoint, a.master_port.unwrap_or(29500))?.remove(0);
            let (host, port) = ep.rsplit_once(':').expect("endpoints() adds a port");
            (
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
                port.parse().expect("endpoints() validated the port"),
            )
        };
        if max_nodes == 1 {
            let mode = RendezvousMode::Embedded {
                master_addr,
                fixed_port: Some(master_port),
            };
            return Ok((mode, run_id));
        }
        if min_nodes != max_nodes {
            return Err(invalid(
                "--nnodes",
                a.nnodes.clone(),
                "the static backend needs a fixed node count; use --rdzv-endpoint for MIN:MAX",
            ));
        }
        let node_rank = a.node_rank.ok_or_else(|| {
            invalid(
                "--nnodes",
                a.nnodes.clone(),
                "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (dynamic rendezvous), or --node-rank with --master-addr/--master-port on every node (static); drun never assumes localhost",
            )
        })?;
        if node_rank >= max_nodes {
            return Err(invalid(
                "--node-rank",
                node_rank.to_string(),
                format!("must be below --nnodes {max_nodes}"),
            ));
        }
        let mode = RendezvousMode::Static {
            node_rank,
            master_addr,
            master_port,
        };
        return Ok((mode, run_id));
    }
    let run_id = if a.rdzv_id != "none" {
        a.rdzv_id.clone()
    } else if let Some(job) = std::env::var("SLURM_JOB_ID").ok().filter(|j| !j.is_empty()) {
        job
    } else if max_nodes > 1 {
        return Err(invalid(
            "--rdzv-id",
            "none",
            "multi-node runs need a run id shared by all nodes (e.g. --rdzv-id myjob-42); the default would mix jobs",
        ));
    } else {
        a.rdzv_id.clone()
    };
    if a.rdzv_endpoint.trim().is_empty() {
        return Err(invalid(
            "--rdzv-endpoint",
            "(missing)",
            format!(
                "--rdzv-backend {backend} needs --rdzv-endpoint HOST:PORT (a drun-rendezvous server, the c10d host, or etcd); drun never falls back to localhost"
            ),
        ));
    }
    if a.master_port.is_some() {
        notes.push("--master-port only applies to the static backend; MASTER_PORT comes from the rendezvous".into());
    }
    let mode = match backend {
        "drun" => RendezvousMode::Server {
            endpoints: crate::rdzv::endpoints(&a.rdzv_endpoint, 29400)?,
        },
        "embedded" => {
            // The agent on the endpoint's host serves the rendezvous (Slurm: the first node).
            let endpoint = crate::rdzv::endpoints(&a.rdzv_endpoint, 29400)?.remove(0);
            let is_host = slurm.map(SlurmJob::hosts_rendezvous);
            RendezvousMode::C10d { endpoint, is_host }
        }
        "c10d" => {
            let is_host = match conf.get("is_host").map(|v| v.trim().to_ascii_lowercase()) {
                None => None,
                Some(v) if matches!(v.as_str(), "1" | "true" | "yes" | "on") => Some(true),
                Some(v) if matches!(v.as_str(), "0" | "false" | "no" | "off") => Some(false),
                Some(v) => {
                    return Err(invalid(
                        "--rdzv-conf",
                        format!("is_host={v}"),
                        "expected 1 or 0",
                    ))
                }
            };
            let endpoint = crate::rdzv::endpoints(&a.rdzv_endpoint, 29400)?.remove(0);
            RendezvousMode::C10d { endpoint, is_host }
        }
        _ => RendezvousMode::Etcd {
            endpoints: crate::rdzv::endpoints(&a.rdzv_endpoint, 2379)?,
        },
    };
    Ok((mode, run_id))
}

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
    /// Worker-failure restart budget.
    pub max_restarts: u32,
    /// Poll interval of worker state.
    pub monitor_interval: Duration,
    /// ROLE_NAME.
    pub role: String,
    /// The worker command.
    pub entrypoint: Entrypoint,
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
    /// `--stdin-rank`: the local rank that reads drun's stdin; the others read `/dev/null`.
    pub stdin_rank: Option<u32>,
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
    /// `--on-preempt`.
    pub on_preempt: OnPreempt,
    /// `--preempt-signal`.
    pub preempt_signal: Signal,
    /// `--requeue`.
    pub requeue: bool,
}

fn invalid(flag: &'static str, value: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.into(),
        why: why.into(),
    }
}

/// Parses `--nnodes`: `N` or `MIN:MAX` with `0 < MIN <= MAX` (torchrun `parse_min_max_nnodes`).
///
/// ```
/// use drun_launcher::launch::parse_nnodes;
/// assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
/// assert_eq!(parse_nnodes("1:4").unwrap(), (1, 4));
/// assert!(parse_nnodes("3:2").is_err());
/// ```
pub fn parse_nnodes(v: &str) -> Result<(u32, u32), ConfigError> {
    let bad = |why: &str| invalid("--nnodes", v, why);
    let parse = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| bad("expected N or MIN:MAX with integers"))
    };
    let (min, max) = match v.split_once(':') {
        None => {
            let n = parse(v)?;
            (n, n)
        }
        Some((a, b)) => (parse(a)?, parse(b)?),
    };
    if min == 0 || min > max {
        return Err(bad("need 0 < MIN <= MAX"));
    }
    Ok((min, max))
}

/// Parses `--nproc-per-node`: an integer ≥ 1, `cpu`, `gpu` or `auto`.
pub fn parse_nproc(v: &str) -> Result<u32, ConfigError> {
    match v.trim() {
        "cpu" => Ok(cpu_count()),
        "gpu" => match gpu_count() {
            0 => Err(invalid(
                "--nproc-per-node",
                v,
                "no NVIDIA GPU is visible; use an integer or `cpu`",
            )),
            n => Ok(n),
        },
        "auto" => Ok(match gpu_count() {
            0 => cpu_count(),
            n => n,
        }),
        "xpu" => Err(invalid(
            "--nproc-per-node",
            v,
            "Intel XPUs are not supported; use an integer, cpu, gpu or auto",
        )),
        s => match s.parse::<u32>() {
            Ok(0) => Err(invalid("--nproc-per-node", v, "must be at least 1")),
            Ok(n) => Ok(n),
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Err(invalid(
                "--nproc-per-node",
                v,
                "far more workers than one node can run",
            )),
            Err(_) => Err(invalid(
                "--nproc-per-node",
                v,
                "expected an integer >= 1, cpu, gpu or auto",
            )),
        },
    }
}

/// Usable CPU cores (affinity- and cgroup-aware, like `os.sched_getaffinity`).
pub fn cpu_count() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// NVIDIA devices the workers would see: the driver's device list, narrowed by
/// `CUDA_VISIBLE_DEVICES` when set (like `torch.cuda.device_count()`).
pub fn gpu_count() -> u32 {
    let physical = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|d| d.count() as u32)
        .unwrap_or(0);
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => (v.split(',').filter(|s| !s.trim().is_empty()).count() as u32).min(physical),
        Err(_) => physical,
    }
}

/// Parses `SIGTERM,SIGINT,...` (names with or without `SIG`, or numbers).
pub fn parse_signals(v: &str) -> Result<Vec<Signal>, ConfigError> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let upper = s.to_ascii_uppercase();
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            name.parse::<Signal>()
                .or_else(|_| {
                    s.parse::<i32>()
                        .map_err(|_| ())
                        .and_then(|n| Signal::try_from(n).map_err(|_| ()))
                })
                .map_err(|_| invalid("--signals-to-handle", v, format!("unknown signal {s}")))
        })
        .collect()
}

/// Parses `--rdzv-conf k=v,k2=v2` (keys stripped; a key without `=value` is an error).
pub fn parse_rdzv_conf(v: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut m = BTreeMap::new();
    for part in v.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, val) = part.split_once('=').ok_or_else(|| {
            invalid(
                "--rdzv-conf",
                v,
                format!("'{part}' has no value; use key=value"),
            )
        })?;
        m.insert(k.trim().to_string(), val.to_string());
    }
    Ok(m)
}

/// The longest duration a seconds flag accepts: 30 days.
const MAX_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

/// A seconds flag as a [`Duration`]: finite, at most [`MAX_SECONDS`], and (unless `allow_zero`)
/// at least one millisecond, the resolution drun works at.
fn seconds(flag: &'static str, v: f64, allow_zero: bool) -> Result<Duration, ConfigError> {
    let bad = |why: &str| Err(invalid(flag, v.to_string(), why));
    if !v.is_finite() {
        return bad("must be a finite number of seconds");
    }
    if v > MAX_SECONDS {
        return bad("must be at most 2592000 seconds (30 days)");
    }
    if v < 0.0 || (!allow_zero && v < 0.001) {
        let bound = if allow_zero {
            ">= 0 seconds"
        } else {
            "at least 0.001 seconds"
        };
        return bad(&format!("must be {bound}"));
    }
    Ok(Duration::from_secs_f64(v))
}

impl LaunchConfig {
    /// Validates the command line. Reads the environment for torchrun's secondary variables
    /// (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`).
    ///
    /// # Errors
    /// [`ConfigError`] naming the flag and the fix.
    pub fn from_args(a: &Args) -> Result<Self, ConfigError> {
        let slurm = match a.slurm {
            SlurmMode::Auto if !a.standalone => slurm::detect(|k| std::env::var(k).ok())?,
            _ => None,
        };
        let mut filled = a.clone();
        let slurm_line = match &slurm {
            Some(job) => Some(job.fill(&mut filled)?),
            None => None,
        };
        let a = &filled;
        let unsupported = |flag: &'static str, why: &str| ConfigError::Unsupported {
            flag,
            why: why.to_string(),
        };
        if a.numa_binding.is_some() {
            return Err(unsupported(
                "--numa-binding",
                "bind with numactl inside your script",
            ));
        }
        if a.logs_specs.is_some() {
            return Err(unsupported(
                "--logs-specs",
                "use --log-dir, --redirects and --tee",
            ));
        }
        if a.virtual_local_rank {
            return Err(unsupported(
                "--virtual-local-rank",
                "set CUDA_VISIBLE_DEVICES per worker yourself",
            ));
        }
        if a.duplicate_stdout_filters.is_some() || a.duplicate_stderr_filters.is_some() {
            return Err(unsupported(
                "--duplicate-stdout/stderr-filters",
                "grep the --log-dir files",
            ));
        }
        if a.print_completion.is_some() {
            return Err(unsupported("--print-completion", "no shell completion yet"));
        }
        if let Some(h) = a.event_log_handler.as_deref().filter(|h| *h != "null") {
            return Err(ConfigError::Unsupported {
                flag: "--event-log-handler",
                why: format!("only 'null' is accepted, got '{h}'"),
            });
        }
        let (min_nodes, max_nodes) = parse_nnodes(&a.nnodes)?;
        let nproc_per_node = parse_nproc(&a.nproc_per_node)?;
        let monitor_interval = seconds("--monitor-interval", a.monitor_interval, false)?;
        let shutdown = match a.shutdown_timeout {
            Some(s) => s,
            None => match std::env::var("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
                Ok(v) => v.trim().parse::<f64>().map_err(|_| {
                    invalid(
                        "--shutdown-timeout",
                        v.clone(),
                        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT is not a number",
                    )
                })?,
                Err(_) => match slurm.as_ref().and_then(|_| slurm::kill_wait()) {
                    // Stop the workers before Slurm's SIGKILL (KillWait after its SIGTERM).
                    Some(kw) => (kw.as_secs_f64() - 2.0).max(1.0),
                    None => 30.0,
                },
            },
        };
        let shutdown_timeout = seconds("--shutdown-timeout", shutdown, true)?;
        let peer_exit_wait = seconds("--peer-exit-wait", a.peer_exit_wait, true)?;
        if let Some(r) = a.stdin_rank.filter(|r| *r >= nproc_per_node) {
            return Err(invalid(
                "--stdin-rank",
                r.to_string(),
                format!(
                    "this node runs local ranks 0..{} (--nproc-per-node {}); name one of them",
                    nproc_per_node - 1,
                    nproc_per_node
                ),
            ));
        }
        let redirects = StdSpec::parse("--redirects", &a.redirects)?;
        let tee = StdSpec::parse("--tee", &a.tee)?;
        let local_ranks_filter = if a.local_ranks_filter.trim().is_empty() {
            None
        } else {
            Some(
                a.local_ranks_filter
                    .split(',')
                    .map(|s| {
                        s.trim().parse::<u32>().map_err(|_| {
                            invalid(
                                "--local-ranks-filter",
                                &a.local_ranks_filter,
                                "expected comma-separated local ranks",
                            )
                        })
                    })
                    .collect::<Result<BTreeSet<_>, _>>()?,
            )
        };
        let signals = parse_signals(&a.signals_to_handle)?;
        let rdzv_conf = parse_rdzv_conf(&a.rdzv_conf)?;
        // An explicit empty template means "no prefix"; the environment variable only counts
        // when non-empty (torchrun treats it so).
        let prefix_template = a.log_line_prefix_template.clone().or_else(|| {
            std::env::var("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
                .ok()
                .filter(|t| !t.is_empty())
        });

        let mut notes = Vec::new();
        for key in rdzv_conf
            .keys()
            .filter(|k| !RDZV_CONF_KEYS.contains(&k.as_str()))
        {
            // torchrun passes unknown keys to custom handlers; drun has none: say so once.
            notes.push(format!(
                "--rdzv-conf {key} is not used by drun (it reads {})",
                RDZV_CONF_KEYS.join(", ")
            ));
        }
        let timing = Timing::from_conf(&rdzv_conf)?;
        let (rendezvous, run_id) = rendezvous_mode(
            a,
            min_nodes,
            max_nodes,
            &rdzv_conf,
            slurm.as_ref(),
            &mut notes,
        )?;
        let requested_node_rank = a.node_rank.filter(|_| !rendezvous_is_static(&rendezvous));
        if a.start_method != "spawn" {
            notes.push(format!(
                "--start-method {} only affects function entrypoints in torchrun; drun starts processes directly",
                a.start_method
            ));
        }
        let kind = if a.run_path {
            EntryKind::RunPath
        } else if a.no_python {
            if a.module {
                return Err(ConfigError::Conflict("--no-python", "-m/--module"));
            }
            EntryKind::Binary
        } else if a.module {
            EntryKind::Module
        } else {
            EntryKind::Script
        };
        let mut script_and_args = a.script_and_args.clone();
        if script_and_args[0].starts_with('-') && script_and_args[0].len() > 1 {
            return Err(ConfigError::UnknownFlag(script_and_args[0].clone()));
        }
        // argparse's REMAINDER drops one `--` right after the script, so torchrun does too.
        if script_and_args.get(1).is_some_and(|a| a == "--") {
            script_and_args.remove(1);
        }
        let entrypoint = Entrypoint::resolve(kind, &script_and_args, a.python.as_deref())?;
        // Like torchrun's node descriptor (address, pid): unique even for several agents per host,
        // and sorted first by address so ranks follow hosts.
        let host = a.local_addr.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "localhost".into())
        });
        let node_id = format!("{host}_{}", std::process::id());
        if a.ckpt_keep_every > 0 && a.ckpt_keep_last == 0 {
            return Err(invalid(
                "--ckpt-keep-every",
                a.ckpt_keep_every.to_string(),
                "needs --ckpt-keep-last K (without it every checkpoint is kept anyway)",
            ));
        }
        let ckpt_dir = match &a.ckpt_dir {
            None => None,
            Some(d) => {
                let path_err = |source| ConfigError::Path {
                    what: "checkpoint directory (--ckpt-dir)",
                    path: d.clone(),
                    source,
                };
                if d.exists() && !d.is_dir() {
                    return Err(invalid(
                        "--ckpt-dir",
                        d.display().to_string(),
                        "exists and is not a directory",
                    ));
                }
                std::fs::create_dir_all(d).map_err(path_err)?;
                // Checkpoints, manifests and the `latest` pointer are written here: fail now,
                // not at the first commit.
                tempfile::tempfile_in(d).map_err(path_err)?;
                Some(std::fs::canonicalize(d).map_err(path_err)?)
            }
        };
        if a.ckpt_keep_last > 0 && ckpt_dir.is_none() {
            return Err(invalid(
                "--ckpt-keep-last",
                a.ckpt_keep_last.to_string(),
                "needs --ckpt-dir DIR (retention only ever deletes files inside it)",
            ));
        }
        let preempt_signal = parse_signals(&a.preempt_signal)
            .ok()
            .filter(|v| v.len() == 1)
            .map(|v| v[0])
            .ok_or_else(|| {
                invalid(
                    "--preempt-signal",
                    &a.preempt_signal,
                    "expected one signal name, e.g. SIGUSR1",
                )
            })?;
        if a.requeue && a.on_preempt != OnPreempt::Checkpoint {
            return Err(invalid(
                "--requeue",
                "true",
                "needs --on-preempt checkpoint (the job requeues after its checkpoint is sealed)",
            ));
        }
        let store_is_ephemeral = matches!(
            rendezvous,
            RendezvousMode::Embedded { .. } | RendezvousMode::C10d { .. }
        );
        if a.on_preempt == OnPreempt::Checkpoint && store_is_ephemeral && ckpt_dir.is_none() {
            return Err(invalid(
                "--on-preempt",
                "checkpoint",
                "needs --ckpt-dir DIR with an in-memory rendezvous: the restarted job finds the checkpoint through DIR/latest",
            ));
        }
        let resume_from = match &a.ckpt_resume_from {
            None => None,
            Some(p) => {
                let (file, _) = crate::ckpt::read_adoptable(p).map_err(|why| {
                    invalid(
                        "--ckpt-resume-from",
                        p.display().to_string(),
                        why.to_string(),
                    )
                })?;
                Some(std::fs::canonicalize(&file).unwrap_or(file))
            }
        };
        let scale_up_save_timeout =
            seconds("--scale-up-save-timeout", a.scale_up_save_timeout, false)?;
        let ckpt = CkptConfig {
            scale_up_save: (a.on_scale_up == crate::ckpt::OnScaleUp::Checkpoint)
                .then_some(scale_up_save_timeout),
            resume_from,
            dir: ckpt_dir,
            verify: a.ckpt_verify,
            retention: drun_rendezvous::Retention {
                keep_last: a.ckpt_keep_last,
                keep_every: a.ckpt_keep_every,
            },
        };
        Ok(LaunchConfig {
            min_nodes,
            max_nodes,
            nproc_per_node,
            rendezvous,
            run_id,
            node_id,
            max_restarts: a.max_restarts,
            monitor_interval,
            role: a.role.clone(),
            entrypoint,
            log_dir: a.log_dir.clone(),
            redirects,
            tee,
            local_ranks_filter,
            prefix_template,
            signals,
            signals_to_handle: a.signals_to_handle.clone(),
            shutdown_timeout,
            peer_exit_wait,
            stdin_rank: a.stdin_rank,
            worker_store: crate::worker_store::WorkerStoreMode::parse(&a.worker_store).ok_or_else(
                || {
                    invalid(
                        "--worker-store",
                        a.worker_store.clone(),
                        "expected agent or rank0",
                    )
                },
            )?,
            rdzv_conf,
            timing,
            requested_node_rank,
            advertise_addr: a.local_addr.clone(),
            notes,
            ckpt,
            slurm,
            slurm_line,
            on_preempt: a.on_preempt,
            preempt_signal,
            requeue: a.requeue,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnodes_and_nproc_validation() {
        assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("1:4").unwrap(), (1, 4));
        assert!(parse_nnodes("3:2")
            .unwrap_err()
            .to_string()
            .contains("0 < MIN <= MAX"));
        assert!(parse_nnodes("0").is_err());
        assert!(parse_nnodes("a:b").is_err());
        assert_eq!(parse_nproc("4").unwrap(), 4);
        assert!(parse_nproc("0")
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
        assert!(parse_nproc("cpu").unwrap() >= 1);
    }

    #[test]
    fn signals_and_conf() {
        assert_eq!(
            parse_signals("SIGTERM,int, 10").unwrap(),
            [Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR1]
        );
        assert!(parse_signals("SIGNOPE").is_err());
        let c = parse_rdzv_conf(" join_timeout=5,is_host=1").unwrap();
        assert_eq!(c["join_timeout"], "5");
        assert!(parse_rdzv_conf("lonely").is_err());
    }
}
