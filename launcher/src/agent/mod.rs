//! The agent: rendezvous → spawn → supervise → restart or exit, as an explicit state machine.
//!
//! * [`state`] — the state ([`state::Machine`], [`state::Phase`]), its inputs and effects;
//! * [`mod@step`] (with `supervise`, `failure`, `progress` and the `moves` they share) — the
//!   transitions, a pure function of (state, input, now);
//! * `driver` — the one loop that `select!`s over the inputs (session events, SIGCHLD,
//!   signals, worker API requests, deadlines) and carries out the effects;
//! * `world` — what the effects touch: candidate, announcement, teardown sweep, summary;
//! * [`rank_table`] — the rank table node rank 0 prints at each formation (pure);
//!
//! The state diagram is in the crate's theory of operation ([`crate`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::ckpt::api::{ApiCall, ApiServer};
use crate::metrics::AgentMetrics;
use crate::os::guard::Guard;
use crate::os::spawn::{self, Spawner};
use crate::os::{LinuxOs, Os};
use crate::warm::WarmPool;
use crate::{AgentExit, LaunchConfig, LaunchError};

mod driver;
mod failure;
pub mod hang;
mod log_dir;
mod moves;
mod observe;
mod preflight;
mod progress;
pub mod rank_table;
pub mod state;
pub mod step;
pub mod straggler;
mod supervise;
#[cfg(test)]
mod tests;
mod world;

pub use state::{Effect, Input, Machine, Phase};
pub use step::step;

use state::{JOB_CONTROL, RELAYED};

/// Runs a validated launch to its end and returns the exit status. Errors are printed as one
/// line on stderr.
pub async fn run(cfg: LaunchConfig) -> AgentExit {
    use tracing::Instrument as _;
    // In a multi-node run every agent line names its node (`node=n2`); every JSON record
    // names the run, the node and (once formed) the generation.
    let span = if cfg.log_format == crate::LogFormat::Json {
        tracing::info_span!("agent", run = %cfg.run_id, node = %cfg.node_id, gen = tracing::field::Empty)
    } else if cfg.rdzv.max_nodes > 1 {
        tracing::info_span!("agent", node = %cfg.node_id)
    } else {
        tracing::Span::none()
    };
    run_agent(cfg).instrument(span).await
}

async fn run_agent(cfg: LaunchConfig) -> AgentExit {
    let end = Termination {
        path: cfg.scheduler.termination_log.clone(),
        run_id: cfg.run_id.clone(),
        restarts: cfg.scheduler.container_restarts,
    };
    let mut agent = match Agent::new(cfg).await {
        Ok(a) => a,
        Err(e) => {
            crate::say!("drun: error: {e}");
            end.write(e.exit(), &e.to_string());
            return e.exit();
        }
    };
    let exit = match agent.run().await {
        Ok(exit) => exit,
        Err(e) => {
            crate::say!("drun: error: {e}");
            agent.cause.get_or_insert_with(|| e.to_string());
            e.exit()
        }
    };
    agent.close(exit).await;
    let reason = match (exit, agent.cause.take()) {
        (_, Some(cause)) => cause,
        (AgentExit::Signal(n), None) => format!(
            "stopped by {} (pod deleted, evicted or preempted); the workers were stopped first",
            Signal::try_from(n).map_or("a signal", |s| s.as_str())
        ),
        (AgentExit::Success, None) => "all workers succeeded".into(),
        (e, None) => format!("exit {}", e.code()),
    };
    end.write(exit, &reason);
    exit
}

/// Where and what the termination message says, known before the agent starts.
struct Termination {
    path: Option<PathBuf>,
    run_id: String,
    restarts: Option<u64>,
}

impl Termination {
    fn write(&self, exit: AgentExit, reason: &str) {
        let message = crate::container::termination_json(&crate::container::Termination {
            exit,
            reason,
            run_id: Some(&self.run_id),
            restarts: self.restarts,
        });
        crate::container::write_termination_log(self.path.as_deref(), &message);
    }
}

struct Agent {
    cfg: LaunchConfig,
    os: Arc<dyn Os>,
    guard: Option<Mutex<Guard>>,
    agent_id: String,
    hostname: String,
    inherited: BTreeMap<OsString, OsString>,
    run_log_dir: PathBuf,
    temp_log_dir: bool,
    signals: mpsc::UnboundedReceiver<Signal>,
    sigchld: tokio::signal::unix::Signal,
    /// Secondary problems, printed as "also: ..." after the primary error.
    also: Vec<String>,
    /// The root cause in one line, for the termination message.
    cause: Option<String>,
    /// The worker API socket (`DRUN_AGENT_SOCK`); `None` if it could not be opened.
    api: Option<ApiServer>,
    /// Worker API requests.
    api_rx: mpsc::UnboundedReceiver<ApiCall>,
    /// Why the `--ckpt-resume-from` checkpoint could not be read at the last join, if it could
    /// not.
    adoption_failed: Option<String>,
    /// This node's environment fingerprint, sent with every Join (collected once at start;
    /// empty for a one-node group, which has nobody to compare with).
    fingerprint: drun_rendezvous::decisions::envcheck::Fingerprint,
    /// `--metrics-port`: what the loop records, served at `/metrics`.
    metrics: Option<Arc<AgentMetrics>>,
    /// `--preflight`: the installed check script, when the check can run here.
    preflight: Option<PathBuf>,
    /// The peer probes of a multi-node run (`crate::peers`), started with the rendezvous link.
    peers: Option<crate::peers::Prober>,
    /// `--ckpt-replicas`: the TCP listener on the probe port's number where the ring
    /// predecessor's replicas arrive; taken by the staging driver.
    replica_listener: Option<std::net::TcpListener>,
    /// The warm interpreters for the next generation's workers (`crate::warm`).
    warm: Mutex<WarmPool>,
}

impl Agent {
    async fn new(cfg: LaunchConfig) -> Result<Self, LaunchError> {
        spawn::become_subreaper()
            .map_err(|e| LaunchError::os("cannot become a child subreaper", e))?;
        let spawner =
            Spawner::start().map_err(|e| LaunchError::os("cannot start the spawner thread", e))?;
        let os: Arc<dyn Os> = Arc::new(LinuxOs::new(spawner.clone()));
        let agent_id = uuid::Uuid::new_v4().to_string();
        let metrics = match cfg.observe.metrics_port {
            Some(port) => Some(serve_metrics(port, &os.hostname()).await?),
            None => None,
        };
        let sigchld =
            signal(SignalKind::child()).map_err(|e| LaunchError::os("cannot watch SIGCHLD", e))?;
        let (tx, signals) = mpsc::unbounded_channel();
        let mut wanted: Vec<Signal> = cfg.supervision.signals.clone();
        wanted.extend(RELAYED);
        wanted.extend(JOB_CONTROL);
        wanted.push(cfg.scheduler.preempt_signal);
        wanted.sort_by_key(|s| *s as i32);
        wanted.dedup();
        // `nohup drun ...`: a signal ignored at start stays ignored, for drun and its workers.
        wanted.retain(|sig| {
            let ignored = spawn::is_ignored(*sig);
            if ignored {
                tracing::debug!(
                    "{} was ignored when drun started (nohup?): it stays ignored for drun and its workers",
                    sig.as_str()
                );
            }
            !ignored
        });
        let handled = wanted.clone();
        for sig in wanted {
            let mut stream = signal(SignalKind::from_raw(sig as i32))
                .map_err(|e| LaunchError::os(format!("cannot handle {}", sig.as_str()), e))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(sig).is_err() {
                        return;
                    }
                }
            });
        }
        // A signal that came while drun was PID 1 without handlers yet (see
        // `spawn::note_early_signals`) is handled now, as if it came just after.
        if let Some(sig) = spawn::take_early_signal().filter(|s| handled.contains(s)) {
            let _ = tx.send(sig);
        }
        let mut guard = Guard::start(&spawner, &agent_id)
            .await
            .map_err(|e| LaunchError::os("cannot start the cleanup guard process", e))?;
        let hostname = os
            .hostname()
            .split('.')
            .next()
            .unwrap_or("localhost")
            .to_string();
        let (base, temp_log_dir) = match &cfg.output.log_dir {
            Some(d) => (d.clone(), false),
            None => (std::env::temp_dir(), true),
        };
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let run_log_dir = base.join(log_dir::name(&cfg.run_id, suffix, temp_log_dir));
        std::fs::create_dir_all(&run_log_dir).map_err(|source| {
            LaunchError::Config(crate::ConfigError::Path {
                what: "log directory",
                path: run_log_dir.clone(),
                source,
            })
        })?;
        if temp_log_dir {
            guard.scratch(&run_log_dir);
        }
        let (api, api_rx) = match ApiServer::start() {
            Ok((server, rx)) => {
                if let Some(dir) = server.path().parent() {
                    guard.scratch(dir);
                }
                (Some(server), rx)
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(crate::ConfigError::UnsafeDir(e.to_string()).into());
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the worker API socket; checkpoint commits are unavailable (DRUN_AGENT_SOCK unset)");
                (None, mpsc::unbounded_channel().1)
            }
        };
        let preflight = cfg
            .observe
            .preflight
            .and_then(|_| preflight::set_up(&cfg, api.as_ref()));
        Ok(Self {
            warm: Mutex::new(WarmPool::new(&cfg, os.clone())),
            preflight,
            peers: None,
            replica_listener: None,
            metrics,
            api,
            api_rx,
            adoption_failed: None,
            fingerprint: Default::default(),
            inherited: std::env::vars_os().collect(),
            cfg,
            os,
            guard: Some(Mutex::new(guard)),
            agent_id,
            hostname,
            run_log_dir,
            temp_log_dir,
            signals,
            sigchld,
            also: Vec::new(),
            cause: None,
        })
    }

    fn guard(&self) -> &Mutex<Guard> {
        self.guard.as_ref().expect("guard lives until close()")
    }
}

/// Serves the agent's metrics on all interfaces at `port` (0: a free one) and prints where.
async fn serve_metrics(port: u16, hostname: &str) -> Result<Arc<AgentMetrics>, LaunchError> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|e| {
            LaunchError::Config(crate::ConfigError::Invalid {
                flag: "--metrics-port",
                value: port.to_string(),
                why: format!("cannot listen on 0.0.0.0:{port}: {e}"),
            })
        })?;
    let bound = listener
        .local_addr()
        .map_err(|e| LaunchError::os("cannot read the metrics address", e))?;
    let metrics = AgentMetrics::new();
    let shared = metrics.clone();
    drun_rendezvous::server::metrics::http::spawn(listener, Arc::new(move || shared.render()));
    crate::say!(
        "drun: metrics at http://{hostname}:{}/metrics",
        bound.port()
    );
    Ok(metrics)
}
