//! `drun-rendezvous serve`: opens the store, binds the listener (and the metrics endpoint),
//! serves the drun.v1 protocol with its TLS and tokens, and stops on SIGTERM/SIGINT after a
//! bounded drain.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::args::{ServeConfig, StoreKind};
use super::ServerError;
use crate::server::auth::Auth;
use crate::server::service::{serve_with_tls, RendezvousService};
use crate::server::tls::ServerTlsFiles;
use crate::store::etcd::access::EtcdAccess;
use crate::store::shared_lease::SharedLeases;
use crate::{EtcdStore, LogFormat, MemoryStore, Store};

/// How long a stopping server (SIGTERM, Ctrl-C) lets open sessions run before it closes them:
/// well inside Kubernetes' default 30 s grace period and systemd's 90 s stop timeout.
pub const DRAIN: Duration = Duration::from_secs(2);

/// The target of the server's own records (not a session's): the binary's crate name, as when
/// the binary wrote them, so `DRUN_LOG` filters and JSON readers see them unchanged.
const TARGET: &str = "drun_rendezvous";

/// Serves `config` until SIGTERM or SIGINT (then [`DRAIN`], or a second signal), printing
/// the bound address (and the metrics URL) on stdout. With `log_format` JSON a session's
/// records carry its run as a field.
///
/// # Errors
/// A bad flag or file, an address that cannot be bound ([`ServerError::code`] 2), etcd
/// unreachable or refusing (3), the server failing while it serves (1).
pub async fn serve(config: ServeConfig, log_format: LogFormat) -> Result<(), ServerError> {
    let access = super::args::etcd_access(&config.etcd)?;
    let tls = match (config.tls_cert, config.tls_key) {
        (Some(cert), Some(key)) => Some(
            ServerTlsFiles {
                cert,
                key,
                client_ca: config.tls_client_ca,
            }
            .load()
            .map_err(ServerError::Tls)?,
        ),
        _ => None,
    };
    let auth = Auth::from_files(&config.token_files).map_err(ServerError::TokenFile)?;
    let addr = parse_addr("--listen", &config.listen)?;
    let metrics = match &config.metrics_addr {
        Some(m) => Some(bind_metrics(m).await?),
        None => None,
    };
    let store = open_store(config.store, &config.etcd_endpoints, &access).await?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })?;
    let local = listener.local_addr().map_err(ServerError::LocalAddr)?;
    println!(
        "drun-rendezvous listening on {local} (store: {})",
        store.name()
    );
    if auth.is_open() {
        // A log record, so that JSON logs stay one object per line.
        tracing::warn!(
            target: TARGET,
            "no --token-file: the control plane is open; anyone who can reach {local} can join, read or stop any run"
        );
    }
    if let Some(listener) = metrics {
        let at = listener.local_addr().map_err(ServerError::LocalAddr)?;
        // Whoever reads the first line only may have closed stdout since: never panic.
        let _ = writeln!(
            std::io::stdout(),
            "drun-rendezvous: metrics at http://{at}/metrics"
        );
        crate::server::metrics::http::spawn(
            listener,
            Arc::new(|| crate::server::metrics::global().render()),
        );
    }
    let (stopping_tx, stopping) = tokio::sync::oneshot::channel();
    let shutdown = async move {
        let sig = stop_signal().await;
        tracing::info!(
            target: TARGET,
            "{sig}: no new connections; open sessions close within {} s (agents reconnect or wait for the server)",
            DRAIN.as_secs()
        );
        let _ = stopping_tx.send(());
    };
    let serve = serve_with_tls(
        listener,
        RendezvousService::new(store)
            .with_run_on_records(log_format == LogFormat::Json)
            .with_auth(auth)
            .with_max_runs(config.max_runs),
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
            sig = stop_signal() => tracing::info!(target: TARGET, "{sig} again: closing now"),
        }
    };
    tokio::select! {
        r = serve => r.map_err(ServerError::Serve),
        () = drained => Ok(()),
    }
}

/// The next SIGTERM or SIGINT, by name.
async fn stop_signal() -> &'static str {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler can be installed in a tokio runtime");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}

/// `value` of `flag` as `HOST:PORT`.
fn parse_addr(flag: &'static str, value: &str) -> Result<SocketAddr, ServerError> {
    value.parse().map_err(|source| ServerError::Address {
        flag,
        value: value.to_string(),
        source,
    })
}

/// The listener of `--metrics-addr`.
async fn bind_metrics(value: &str) -> Result<TcpListener, ServerError> {
    let addr = parse_addr("--metrics-addr", value)?;
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Metrics { addr, source })
}

/// The store of `kind`. Agents' leases in etcd live in this server on a few shared etcd
/// leases ([`SharedLeases`]): etcd sees no per-agent keep-alives.
async fn open_store(
    kind: StoreKind,
    endpoints: &[String],
    access: &EtcdAccess,
) -> Result<Arc<dyn Store>, ServerError> {
    match kind {
        StoreKind::Memory => Ok(Arc::new(MemoryStore::new())),
        StoreKind::Etcd => {
            if endpoints.is_empty() {
                return Err(ServerError::NoEtcdEndpoints);
            }
            let etcd = EtcdStore::connect_with(endpoints, access)
                .await
                .map_err(|e| ServerError::store(endpoints, e))?;
            Ok(Arc::new(SharedLeases::new(Arc::new(etcd))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::etcd::args::EtcdArgs;

    fn config() -> ServeConfig {
        ServeConfig {
            listen: "127.0.0.1:0".into(),
            store: StoreKind::Memory,
            etcd_endpoints: Vec::new(),
            metrics_addr: None,
            token_files: Vec::new(),
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            etcd: EtcdArgs::default(),
            max_runs: crate::server::run_limit::DEFAULT_MAX_RUNS,
        }
    }

    #[tokio::test]
    async fn bad_flags_end_it_before_it_serves_with_exit_2() {
        let etcd_without_endpoints = ServeConfig {
            store: StoreKind::Etcd,
            ..config()
        };
        let e = serve(etcd_without_endpoints, LogFormat::Human)
            .await
            .unwrap_err();
        assert!(matches!(e, ServerError::NoEtcdEndpoints), "{e}");
        let bad_metrics = ServeConfig {
            metrics_addr: Some("nowhere".into()),
            ..config()
        };
        let e = serve(bad_metrics, LogFormat::Human).await.unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(
            e.to_string()
                .starts_with("invalid --metrics-addr 'nowhere': "),
            "{e}"
        );
    }
}
