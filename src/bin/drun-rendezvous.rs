//! `drun-rendezvous`: the multi-node rendezvous server and its admin commands.

use drun_launcher::error::error_chain;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use drun_launcher::status::{Source, StatusQuery};
use drun_rendezvous::etcd::access::EtcdAccess;
use drun_rendezvous::service::{serve_with_tls, RendezvousService};
use drun_rendezvous::shared_lease::SharedLeases;
use drun_rendezvous::{EtcdStore, MemoryStore, Store};

/// drun's rendezvous server: forms multi-node groups for `drun` agents.
#[derive(Debug, Parser)]
#[command(name = "drun-rendezvous", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The server's log records: `human` lines or `json`, one object per line with `run` and
    /// `node` as fields where a record concerns one.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "DRUN_LOG_FORMAT",
        default_value_t = drun_launcher::LogFormat::Human
    )]
    log_format: drun_launcher::LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// State in this process only (single server, no HA).
    Memory,
    /// State in etcd v3; run several replicas against the same etcd for HA.
    Etcd,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the drun.v1 rendezvous protocol until SIGTERM/SIGINT.
    Serve {
        /// Address to listen on (`HOST:PORT`; port 0 picks a free one, printed at start).
        #[arg(long, env = "DRUN_RDZV_LISTEN", default_value = "0.0.0.0:29400")]
        listen: String,
        /// Where the state lives.
        #[arg(long, value_enum, default_value = "memory")]
        store: StoreKind,
        /// etcd client endpoints, comma-separated (with --store etcd).
        #[arg(
            long = "etcd-endpoints",
            env = "DRUN_ETCD_ENDPOINTS",
            value_delimiter = ','
        )]
        etcd_endpoints: Vec<String>,
        /// Serve Prometheus metrics at `http://HOST:PORT/metrics` (OpenMetrics text per run:
        /// sessions, waiting agents (standbys), generation, members and world size, re-forms by
        /// cause; lease keep-alive failures, etcd request errors). Port 0 picks a free one, printed at start.
        /// Off by default.
        #[arg(long, env = "DRUN_RDZV_METRICS_ADDR", value_name = "HOST:PORT")]
        metrics_addr: Option<String>,
        /// Accept only agents sending a token listed in PATH (repeatable): one `TOKEN` (any run)
        /// or `RUN_ID TOKEN` (that run only) per line, `#` comments. Looked at again at most
        /// once a second and read again when changed, so tokens rotate without a restart. Without it the control plane is open.
        #[arg(long = "token-file", value_name = "PATH")]
        token_files: Vec<std::path::PathBuf>,
        /// Serve over TLS with this PEM certificate (chain); needs --tls-key.
        #[arg(long = "tls-cert", value_name = "PATH", requires = "tls_key")]
        tls_cert: Option<std::path::PathBuf>,
        /// The PEM private key of --tls-cert.
        #[arg(long = "tls-key", value_name = "PATH", requires = "tls_cert")]
        tls_key: Option<std::path::PathBuf>,
        /// Require client certificates signed by this PEM CA (mutual TLS); needs --tls-cert.
        #[arg(long = "tls-client-ca", value_name = "PATH", requires = "tls_cert")]
        tls_client_ca: Option<std::path::PathBuf>,
        /// TLS and credentials to etcd (with --store etcd).
        #[command(flatten)]
        etcd: drun_launcher::cli::EtcdArgs,
        /// Serve at most N runs at once (a run counts while any of its agents holds a
        /// session); an agent of a new run past it is refused with RESOURCE_EXHAUSTED.
        #[arg(long = "max-runs", env = "DRUN_RDZV_MAX_RUNS", value_name = "N", default_value_t = drun_rendezvous::run_limit::DEFAULT_MAX_RUNS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        max_runs: usize,
    },
    /// Print a run's state: members, generation, ranks, each node's state, standbys, restarts by
    /// cause, the last formation and its duration, the latest checkpoint and the work the last
    /// re-form lost. Read from etcd (--etcd-endpoints) or asked of a running server
    /// (--endpoint). Exit 2: bad flags; 3: store or server unreachable or refusing these
    /// credentials, or no such run.
    #[command(group(
        clap::ArgGroup::new("source")
            .required(true)
            .args(["etcd_endpoints", "endpoint"])
    ))]
    Status {
        /// The run id (the agents' --rdzv-id).
        run: String,
        /// etcd client endpoints, comma-separated `HOST:PORT`, read directly.
        #[arg(
            long = "etcd-endpoints",
            env = "DRUN_ETCD_ENDPOINTS",
            value_delimiter = ','
        )]
        etcd_endpoints: Vec<String>,
        /// Ask a running drun-rendezvous server (or the agent hosting a c10d/embedded
        /// rendezvous) instead, `HOST:PORT`; comma-separated replicas are tried in turn. The
        /// only way to read a server with `--store memory`.
        #[arg(long, conflicts_with = "etcd_endpoints", value_delimiter = ',')]
        endpoint: Vec<String>,
        /// Print one JSON document (a stable superset of the fields the human view shows)
        /// instead of the human view; with --watch, one compact document per line per refresh.
        #[arg(long)]
        json: bool,
        /// File whose first line is the token sent to --endpoint (else DRUN_RDZV_TOKEN).
        #[arg(
            long = "rdzv-token-file",
            env = "DRUN_RDZV_TOKEN_FILE",
            value_name = "PATH"
        )]
        rdzv_token_file: Option<std::path::PathBuf>,
        /// Reach --endpoint over TLS, trusting this PEM CA.
        #[arg(long = "rdzv-tls-ca", value_name = "PATH")]
        rdzv_tls_ca: Option<std::path::PathBuf>,
        /// Client certificate (PEM) for a server requiring mutual TLS; needs --rdzv-tls-key.
        #[arg(long = "rdzv-tls-cert", value_name = "PATH", requires = "rdzv_tls_key")]
        rdzv_tls_cert: Option<std::path::PathBuf>,
        /// The PEM private key of --rdzv-tls-cert.
        #[arg(long = "rdzv-tls-key", value_name = "PATH", requires = "rdzv_tls_cert")]
        rdzv_tls_key: Option<std::path::PathBuf>,
        /// TLS and credentials to etcd (with --etcd-endpoints).
        #[command(flatten)]
        etcd: drun_launcher::cli::EtcdArgs,
        /// Redraw every INTERVAL until Ctrl-C: seconds (`5`, `0.5`) or `500ms`/`2s`/`1m`,
        /// from 50 ms to 1 day; `--watch` alone: 2 s.
        #[arg(
            long,
            value_name = "INTERVAL",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "2",
            value_parser = drun_launcher::status::parse_interval
        )]
        watch: Option<std::time::Duration>,
    },
}

#[path = "common/logging.rs"]
mod logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::install("info", cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli.command, cli.log_format)) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            drun_launcher::say!("drun-rendezvous: error: {msg}");
            ExitCode::from(code)
        }
    }
}

/// How long a stopping server (SIGTERM, Ctrl-C) lets open sessions run before it closes them:
/// well inside Kubernetes' default 30 s grace period and systemd's 90 s stop timeout.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The next SIGTERM or SIGINT, by name.
async fn stop_signal() -> &'static str {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}

/// The etcd access of `args`, the password read from its file or `DRUN_ETCD_PASSWORD` (exit 2
/// when the flags are incomplete or a file cannot be read).
fn etcd_access(args: &drun_launcher::cli::EtcdArgs) -> Result<EtcdAccess, (u8, String)> {
    let env = std::env::var(drun_rendezvous::etcd::access::PASSWORD_VAR).ok();
    args.files().load(env.as_deref()).map_err(|e| (2, e))
}

async fn open_store(
    kind: StoreKind,
    endpoints: &[String],
    access: &EtcdAccess,
) -> Result<Arc<dyn Store>, (u8, String)> {
    match kind {
        StoreKind::Memory => Ok(Arc::new(MemoryStore::new())),
        StoreKind::Etcd => {
            if endpoints.is_empty() {
                return Err((
                    2,
                    "--store etcd needs --etcd-endpoints HOST:PORT[,...]".into(),
                ));
            }
            EtcdStore::connect_with(endpoints, access)
                .await
                .map(|s| Arc::new(s) as Arc<dyn Store>)
                .map_err(|e| match e {
                    drun_rendezvous::StoreError::Refused { .. } => (3, e.to_string()),
                    e => (
                        3,
                        format!("{e}; is etcd running at {}?", endpoints.join(",")),
                    ),
                })
        }
    }
}

/// The listener of `--metrics-addr` (exit 2 when it is not `HOST:PORT` or cannot be bound).
async fn bind_metrics(addr: &str) -> Result<tokio::net::TcpListener, (u8, String)> {
    let parsed: SocketAddr = addr.parse().map_err(|e| {
        (
            2,
            format!("invalid --metrics-addr '{addr}': {e} (expected HOST:PORT)"),
        )
    })?;
    tokio::net::TcpListener::bind(parsed)
        .await
        .map_err(|e| (2, format!("cannot serve metrics on {parsed}: {e}")))
}

async fn run(cmd: Command, log_format: drun_launcher::LogFormat) -> Result<(), (u8, String)> {
    match cmd {
        Command::Serve {
            listen,
            store,
            etcd_endpoints,
            metrics_addr,
            token_files,
            tls_cert,
            tls_key,
            tls_client_ca,
            etcd,
            max_runs,
        } => {
            let access = etcd_access(&etcd)?;
            let tls = match (tls_cert, tls_key) {
                (Some(cert), Some(key)) => Some(
                    drun_rendezvous::tls::ServerTlsFiles {
                        cert,
                        key,
                        client_ca: tls_client_ca,
                    }
                    .load()
                    .map_err(|e| (2, e))?,
                ),
                _ => None,
            };
            let auth = drun_rendezvous::auth::Auth::from_files(&token_files)
                .map_err(|e| (2, format!("{e} (--token-file)")))?;
            let addr: SocketAddr = listen.parse().map_err(|e| {
                (
                    2,
                    format!("invalid --listen '{listen}': {e} (expected HOST:PORT)"),
                )
            })?;
            let metrics = match metrics_addr {
                Some(m) => Some(bind_metrics(&m).await?),
                None => None,
            };
            let store = match open_store(store, &etcd_endpoints, &access).await? {
                // Agents' leases live in this server on a few shared etcd leases
                // (`drun_rendezvous::shared_lease`): etcd sees no per-agent keep-alives.
                s if store == StoreKind::Etcd => Arc::new(SharedLeases::new(s)) as Arc<dyn Store>,
                s => s,
            };
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| (2, format!("cannot listen on {addr}: {e}")))?;
            let local = listener.local_addr().map_err(|e| (1, e.to_string()))?;
            println!(
                "drun-rendezvous listening on {local} (store: {})",
                store.name()
            );
            if auth.is_open() {
                // A log record, so that JSON logs stay one object per line.
                tracing::warn!(
                    "no --token-file: the control plane is open; anyone who can reach {local} can join, read or stop any run"
                );
            }
            if let Some(listener) = metrics {
                let at = listener.local_addr().map_err(|e| (1, e.to_string()))?;
                // Whoever reads the first line only may have closed stdout since: never panic.
                let _ = writeln!(
                    std::io::stdout(),
                    "drun-rendezvous: metrics at http://{at}/metrics"
                );
                drun_rendezvous::metrics::http::spawn(
                    listener,
                    Arc::new(|| drun_rendezvous::metrics::global().render()),
                );
            }
            let (stopping_tx, stopping) = tokio::sync::oneshot::channel();
            let shutdown = async move {
                let sig = stop_signal().await;
                tracing::info!(
                    "{sig}: no new connections; open sessions close within {} s (agents reconnect or wait for the server)",
                    DRAIN.as_secs()
                );
                let _ = stopping_tx.send(());
            };
            let serve = serve_with_tls(
                listener,
                RendezvousService::new(store)
                    .with_run_on_records(log_format == drun_launcher::LogFormat::Json)
                    .with_auth(auth)
                    .with_max_runs(max_runs),
                tls,
                shutdown,
            );
            // tonic's graceful shutdown waits for every connection to end, and an agent's
            // session never ends on its own: the drain is bounded, a second signal ends it.
            let drained = async {
                if stopping.await.is_err() {
                    return std::future::pending().await;
                }
                tokio::select! {
                    _ = tokio::time::sleep(DRAIN) => {}
                    sig = stop_signal() => tracing::info!("{sig} again: closing now"),
                }
            };
            tokio::select! {
                r = serve => r.map_err(|e| (1, format!("server failed: {}", error_chain(&e)))),
                () = drained => Ok(()),
            }
        }
        Command::Status {
            run,
            etcd_endpoints,
            endpoint,
            json,
            watch,
            rdzv_token_file,
            rdzv_tls_ca,
            rdzv_tls_cert,
            rdzv_tls_key,
            etcd,
        } => {
            let etcd = etcd_access(&etcd)?;
            let tls = rdzv_tls_ca
                .map(|ca| {
                    drun_rendezvous::tls::ClientTls::from_files(
                        &ca,
                        rdzv_tls_cert.as_deref(),
                        rdzv_tls_key.as_deref(),
                    )
                })
                .transpose()
                .map_err(|e| (2, e))?;
            let token = drun_launcher::rdzv::token::resolve(
                rdzv_token_file.as_deref(),
                std::env::var(drun_launcher::rdzv::token::TOKEN_VAR)
                    .ok()
                    .as_deref(),
            )
            .map_err(|e| (2, e))?;
            let source = if endpoint.is_empty() {
                Source::Etcd(etcd_endpoints)
            } else {
                Source::Server(endpoint)
            };
            let query = StatusQuery {
                run,
                source,
                json,
                watch,
                token,
                tls,
                etcd,
            };
            drun_launcher::status::show(&query)
                .await
                .map_err(|e| (e.code(), e.to_string()))
        }
    }
}
