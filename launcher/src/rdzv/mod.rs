//! The agent's link to its rendezvous, whatever the backend.
//!
//! Every backend yields the same pair of channels: [`Request`]s from the agent, [`Event`]s to it
//! (see `drun_rendezvous::session`). So the agent loop is written once:
//!
//! | backend | what answers |
//! |---|---|
//! | embedded (`--standalone`, one node) | a session actor in the agent on an in-memory store |
//! | `drun` (default with `--rdzv-endpoint`) | `drun-rendezvous` replicas over gRPC ([`grpc`]) |
//! | `c10d` | the agent that can bind the endpoint hosts an embedded server (memory store); all connect to it |
//! | `etcd`, `etcd-v2` | a session actor in every agent, directly on etcd v3 (every agent is a replica) |
//! | `static` | no rendezvous: ranks from `--node-rank`, `--master-addr`, `--master-port` ([`static_link`]) |

mod etcd_reach;
pub(crate) use drun_rendezvous::client::foreign;
pub mod grpc;
pub mod reach;
pub mod static_link;
mod track;

/// The token an agent sends (in the rendezvous crate, which `drun-rendezvous status` shares).
pub use drun_rendezvous::client::token;

use std::net::SocketAddr;
use std::sync::Arc;

use drun_rendezvous::server::service::RendezvousService;
use drun_rendezvous::session::{spawn_session, Event, Request, SessionConfig};
use drun_rendezvous::{MemoryStore, Store};
use tokio::sync::mpsc;

use crate::{ConfigError, LaunchConfig, LaunchError, RendezvousMode};

/// The two channels to the rendezvous, plus whatever must live as long as they do.
pub struct Link {
    /// Requests to the rendezvous.
    pub tx: mpsc::UnboundedSender<Request>,
    /// Events from it.
    pub rx: mpsc::UnboundedReceiver<Event>,
    /// The embedded c10d-style server this agent hosts, if any.
    pub hosted: Option<HostedServer>,
    /// The task that writes the requests to a server (gRPC links): it may outlive the events,
    /// which close at the run's end.
    task: Option<grpc::Task>,
}

/// How long an exiting agent waits for its Leave (and what it sent before) to be carried out.
pub(crate) const LEAVE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Link {
    fn new(
        (tx, rx): (
            mpsc::UnboundedSender<Request>,
            mpsc::UnboundedReceiver<Event>,
        ),
        hosted: Option<HostedServer>,
    ) -> Self {
        Link {
            tx,
            rx,
            hosted,
            task: None,
        }
    }

    /// Leaves the run and waits, at most [`LEAVE_WAIT`], until the rendezvous has carried out
    /// everything sent before the Leave: the requests the agent sends without waiting for an
    /// answer (reports, flight recorder dumps) would otherwise die with the process. Every
    /// backend carries out a session's requests in order and ends the session after a Leave.
    /// False when the wait ran out.
    pub async fn leave(&mut self) -> bool {
        let _ = self.tx.send(Request::Leave);
        if let Some(t) = &self.task {
            t.leaving();
        }
        let (rx, task) = (&mut self.rx, &mut self.task);
        tokio::time::timeout(LEAVE_WAIT, async {
            while rx.recv().await.is_some() {}
            if let Some(t) = task.as_mut() {
                let _ = (&mut t.join).await;
            }
        })
        .await
        .is_ok()
    }
}

/// An embedded rendezvous server run by this agent (`--rdzv-backend c10d` host).
pub struct HostedServer {
    /// Where it listens.
    pub addr: SocketAddr,
    service: RendezvousService,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a c10d host keeps serving after its own end, for the other agents to see the end.
const HOST_LINGER: std::time::Duration = std::time::Duration::from_secs(30);

impl HostedServer {
    /// Ends run `run` for every agent of it, as failed but retryable
    /// ([`drun_rendezvous::session::RunEnd::retryable`]: they stop their workers and exit 3),
    /// unless it ended already. Called by a host that is stopping for any reason but the run's
    /// own end: the run's state lives in this agent's memory, so the other agents cannot go on
    /// without it, and re-forming around a server that is about to go only left them waiting
    /// for it until the join timeout.
    pub async fn end_run(&self, run: &str, reason: String) {
        self.end(run, reason, false).await;
    }

    /// Ends run `run` for every agent of it because this node cannot take part and the run's
    /// size is fixed ([`drun_rendezvous::session::RunEnd::unfit`]: they end with exit 6 and
    /// `reason`), unless it ended already.
    pub async fn end_run_unfit(&self, run: &str, reason: String) {
        self.end(run, reason, true).await;
    }

    /// A failed end: retryable (the host stops), or `unfit`.
    async fn end(&self, run: &str, reason: String, unfit: bool) {
        let end = drun_rendezvous::session::RunEnd {
            success: false,
            reason,
            at_ms: drun_rendezvous::clock::now_ms(),
            root_cause: None,
            retryable: !unfit,
            unfit,
        };
        match self.service.end_run(run, &end).await {
            // An unfit node's own error line says why.
            Ok(true) if end.unfit => tracing::info!(run = %run, "ended the run for every agent"),
            Ok(true) => tracing::info!(run = %run, "ended the run for every agent: {}", end.reason),
            Ok(false) => {}
            Err(e) => tracing::warn!(run = %run, "could not end the run for the other agents: {e}"),
        }
    }

    /// Stops serving once at least `nodes` sessions have opened (this agent's own included) and
    /// the other agents have closed theirs, at most [`HOST_LINGER`] after the call. `nodes` > 1
    /// keeps an ended run's server up for agents that have not connected yet, so that they
    /// learn the end instead of waiting for the join timeout. `own_open`: whether this agent's
    /// own session may still be open (its leave was not confirmed).
    pub async fn shutdown(mut self, nodes: usize, own_open: bool) {
        let own = usize::from(own_open);
        let deadline = tokio::time::Instant::now() + HOST_LINGER;
        if self.service.sessions_opened() < nodes {
            tracing::info!(
                "the run has ended; serving it up to {} more so that the nodes not connected yet learn it ({} of {nodes} sessions opened)",
                drun_rendezvous::human::duration(HOST_LINGER),
                self.service.sessions_opened()
            );
        }
        while (self.service.active_sessions() > own || self.service.sessions_opened() < nodes)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), &mut self.task).await;
    }
}

/// Default port of an endpoint given without one.
fn with_port(endpoint: &str, default: u16) -> String {
    let e = endpoint.trim();
    let has_port = if let Some(rest) = e.strip_prefix('[') {
        rest.contains("]:")
    } else {
        e.contains(':')
    };
    if has_port {
        e.to_string()
    } else {
        format!("{e}:{default}")
    }
}

/// Splits `a:p,b:p`, fills in `default` ports and checks each `host:port`.
///
/// # Errors
/// A missing host or a port that is not 1–65535 (as torchrun's `parse_rendezvous_endpoint`).
pub fn endpoints(list: &str, default: u16) -> Result<Vec<String>, ConfigError> {
    let out: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|e| with_port(e, default))
        .collect();
    for e in &out {
        let (host, port) = e.rsplit_once(':').expect("with_port adds a port");
        let bad = |why: &str| ConfigError::Invalid {
            flag: "--rdzv-endpoint",
            value: list.to_string(),
            why: why.to_string(),
        };
        let bare = host
            .split_once("://")
            .map_or(host, |(_, h)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        if bare.is_empty() {
            return Err(bad("missing host; expected HOST:PORT"));
        }
        if bare.contains(':') && !host.ends_with(']') {
            return Err(bad(&format!(
                "'{host}' is not a host: a host name holds no ':', and an IPv6 address goes in brackets ([::1]:29400)"
            )));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(bad(&format!("port '{port}' must be an integer in 1-65535"))),
        }
    }
    if out.is_empty() {
        return Err(ConfigError::Invalid {
            flag: "--rdzv-endpoint",
            value: list.to_string(),
            why: "expected HOST:PORT[,HOST:PORT...]".into(),
        });
    }
    Ok(out)
}

/// Opens the link described by `cfg`.
///
/// # Errors
/// [`LaunchError::RendezvousFailed`] when etcd does not answer within the join timeout, or a
/// c10d host cannot serve.
/// `peers`: what the peer probes say (the gRPC link keeps a generation through a rendezvous
/// outage while every peer answers).
pub async fn open(
    cfg: &LaunchConfig,
    session: SessionConfig,
    peers: Option<crate::peers::PeerHealth>,
) -> Result<Link, LaunchError> {
    match &cfg.rdzv.mode {
        RendezvousMode::Embedded { .. } => {
            let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
            Ok(Link::new(spawn_session(store, session, None), None))
        }
        RendezvousMode::Static { .. } => Ok(Link::new(static_link::spawn(cfg, session), None)),
        RendezvousMode::Server { endpoints } => {
            let (tx, rx, task) =
                grpc::connect(endpoints.clone(), session, grpc::Creds::of(cfg), peers);
            Ok(Link {
                task: Some(task),
                ..Link::new((tx, rx), None)
            })
        }
        RendezvousMode::Etcd { endpoints } => {
            let store: Arc<dyn Store> = Arc::new(
                etcd_reach::connect(
                    endpoints,
                    &cfg.security.etcd_access,
                    session.round.join_timeout,
                )
                .await?,
            );
            Ok(Link::new(spawn_session(store, session, None), None))
        }
        RendezvousMode::C10d { endpoint, is_host } => {
            let hosted = if *is_host != Some(false) {
                let at = host_addr(endpoint, *is_host, cfg.rdzv.timing.join_timeout).await?;
                let json = cfg.log_format == crate::LogFormat::Json;
                let tls = match cfg
                    .security
                    .rdzv_host_tls
                    .as_ref()
                    .map(|f| f.load_named(crate::config::HOST_TLS_FLAGS))
                    .transpose()
                {
                    Ok(t) => t,
                    Err(why) => return Err(LaunchError::RendezvousFailed(why.to_string())),
                };
                match host(at, json, cfg.security.rdzv_token.clone(), tls).await {
                    Ok(h) => Some(h),
                    Err(e) if *is_host == Some(true) => {
                        return Err(LaunchError::RendezvousFailed(format!(
                            "this agent must host the rendezvous but cannot serve it on {endpoint}: {e} (another job may hold the port; give every node --rdzv-endpoint HOST:PORT with a free port)"
                        )));
                    }
                    Err(e) => {
                        tracing::debug!(%endpoint, error = %e, "not the c10d host; connecting as a client");
                        None
                    }
                }
            } else {
                None
            };
            let (tx, rx, task) =
                grpc::connect(vec![endpoint.clone()], session, grpc::Creds::of(cfg), peers);
            Ok(Link {
                task: Some(task),
                ..Link::new((tx, rx), hosted)
            })
        }
    }
}

/// Where a would-be c10d host binds. `is_host` unknown: whoever can bind the endpoint's
/// address hosts, so its name is waited for (up to the join timeout, progress every 10 s) and
/// resolved afresh. `Some(true)` (Slurm's first node, the index-0 pod): its own name may not be
/// in DNS yet (a headless Service publishes a pod once it runs), so the port is bound on every
/// interface when the name does not resolve.
async fn host_addr(
    endpoint: &str,
    is_host: Option<bool>,
    join_timeout: std::time::Duration,
) -> Result<SocketAddr, LaunchError> {
    use tokio::time::Instant;
    let (_, port) =
        crate::dns::split(endpoint).map_err(|e| LaunchError::RendezvousFailed(e.to_string()))?;
    if is_host == Some(true) {
        return Ok(crate::dns::resolve(endpoint).await.unwrap_or_else(|why| {
            tracing::info!("{why}: hosting the rendezvous on every interface, port {port}");
            SocketAddr::from(([0, 0, 0, 0], port))
        }));
    }
    let mut reach = reach::Reach::new(Instant::now());
    let limits = reach::Limits {
        lease_ttl: join_timeout,
        join_timeout,
    };
    let mut delay = std::time::Duration::from_millis(100);
    loop {
        match crate::dns::resolve(endpoint).await {
            Ok(addr) => return Ok(addr),
            Err(why) => {
                if delay == std::time::Duration::from_millis(100) {
                    tracing::info!(
                        "waiting for the rendezvous name to resolve: {why} (pods start at different times; retrying until the join timeout)"
                    );
                }
                reach.failed_because(why.to_string());
            }
        }
        let v = reach.check(Instant::now(), false, None, limits, endpoint);
        if let Some(line) = v.progress {
            tracing::info!("{line}");
        }
        if let Some(line) = v.give_up {
            return Err(LaunchError::RendezvousFailed(line));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(2));
    }
}

/// Serves the job's rendezvous on `at` (`json`: its sessions' records name the run),
/// accepting only `token` when the agent has one, over `tls` when given.
async fn host(
    at: SocketAddr,
    json: bool,
    token: Option<drun_rendezvous::server::auth::Secret>,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> std::io::Result<HostedServer> {
    let listener = tokio::net::TcpListener::bind(at).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, tls = tls.is_some(), "hosting the rendezvous for this job (in-memory store)");
    if token.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "no --rdzv-token-file: this job's rendezvous is open to anyone who can reach {addr}");
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let service = RendezvousService::new(store)
        .with_run_on_records(json)
        .with_auth(drun_rendezvous::server::auth::Auth::fixed(token));
    let served = service.clone();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stop_rx.await;
        };
        if let Err(e) =
            drun_rendezvous::server::service::serve_with_tls(listener, served, tls, shutdown).await
        {
            tracing::error!(error = %e, "embedded rendezvous server failed");
        }
    });
    Ok(HostedServer {
        addr,
        service,
        stop: Some(stop_tx),
        task,
    })
}

#[cfg(test)]
mod exit_tests;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_default_ports() {
        assert_eq!(
            endpoints("a,b:1, [::1] ,[::1]:5", 29400).unwrap(),
            ["a:29400", "b:1", "[::1]:29400", "[::1]:5"]
        );
        assert!(endpoints("host:notaport", 1).is_err());
        assert!(endpoints("host:99999", 1).is_err());
        assert!(endpoints(":5", 1).is_err());
    }
}
