//! The `drun.v1.Rendezvous` gRPC service: one [`crate::session`] actor per agent stream.
//!
//! The service holds no state of its own; every decision is a store transaction taken by the
//! session actors, so any number of replicas may serve the same etcd and a killed replica loses
//! nothing: its agents reconnect elsewhere with `Hello.resume`. A server-side session renews the
//! agent's lease only when the agent sends a keep-alive, so a dead agent's lease expires.
//!
//! Every RPC and stream is authenticated by [`crate::server::auth::Auth`] (open by default): a session
//! before its Hello is read and again for the run its Hello names; `Status` for the run asked
//! about. A refused request touches nothing in the store.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drun_proto::v1 as pb;
use drun_proto::v1::rendezvous_server::{Rendezvous, RendezvousServer};
use drun_proto::PROTOCOL_VERSION;
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request as GrpcRequest, Response, Status, Streaming};

use crate::clock::now_ms;
use crate::error::ServiceError;
use crate::server::auth::Auth;
use crate::server::wire::{event_to_wire, request_from_wire};
use crate::session::{spawn_server_session, Emit, Event, Request, SessionConfig};
pub use crate::status::status_json;
use crate::{RoundConfig, Store};

/// The service over one store.
#[derive(Clone)]
pub struct RendezvousService {
    store: Arc<dyn Store>,
    sessions: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
    run_on_records: bool,
    auth: Arc<Auth>,
    runs: Arc<crate::server::run_limit::RunTable>,
}

impl RendezvousService {
    /// A service deciding through `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            sessions: Arc::new(AtomicUsize::new(0)),
            opened: Arc::new(AtomicUsize::new(0)),
            run_on_records: false,
            auth: Arc::new(Auth::open()),
            runs: crate::server::run_limit::RunTable::new(
                crate::server::run_limit::DEFAULT_MAX_RUNS,
            ),
        }
    }

    /// Requires the tokens of `auth` on every RPC and stream.
    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.auth = Arc::new(auth);
        self
    }

    /// Serves at most `max` runs at once ([`crate::server::run_limit`]; default
    /// [`crate::server::run_limit::DEFAULT_MAX_RUNS`]).
    pub fn with_max_runs(mut self, max: usize) -> Self {
        self.runs = crate::server::run_limit::RunTable::new(max);
        self
    }

    /// Every log record of an agent's session names the run as well as the node (`on`: for
    /// JSON logs, where each record stands alone). Off, a session's human lines name its node
    /// (`session: ... node=n2`) and the run only where the record itself does.
    pub fn with_run_on_records(mut self, on: bool) -> Self {
        self.run_on_records = on;
        self
    }

    /// Ends run `run` as `end` unless it has ended ([`crate::store::run_state::RunState::end`]); true
    /// if this call ended it. For the agent that hosts a run's in-memory rendezvous and is
    /// stopping: the run cannot outlive it.
    ///
    /// # Errors
    /// The store's.
    pub async fn end_run(
        &self,
        run: &str,
        end: &crate::session::RunEnd,
    ) -> Result<bool, crate::StoreError> {
        crate::store::run_state::RunState::new(self.store.clone(), run)
            .end(end)
            .await
    }

    /// Agent sessions currently open on this replica.
    pub fn active_sessions(&self) -> usize {
        self.sessions.load(Ordering::SeqCst)
    }

    /// Agent sessions opened on this replica since it started (a reconnect counts again).
    pub fn sessions_opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    /// The tonic server wrapper.
    pub fn into_server(self) -> RendezvousServer<Self> {
        RendezvousServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }
}

/// Largest gRPC message a server takes or sends, in bytes (4 MiB: tonic's default for
/// decoding, set here for both directions). A plan is cut to the agent's own entry before it is
/// sent ([`crate::Plan::for_node`]), so no message of a well-behaved run comes near it.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Most streams (agent sessions and status calls) open at once on one client connection; an
/// agent uses one session. Past it the server refuses new streams (HTTP/2 `REFUSED_STREAM`).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// Serves `service` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: RendezvousService,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with_tls(listener, service, None, shutdown).await
}

/// [`serve`] over TLS when `tls` is given ([`crate::server::tls`]).
///
/// # Errors
/// A TLS configuration rustls refuses (a key that does not match, a bad PEM), or a failed
/// listener.
pub async fn serve_with_tls(
    listener: tokio::net::TcpListener,
    service: RendezvousService,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    // Small messages go out at once: without TCP_NODELAY a request-response pair waits for
    // the peer's delayed ACK (~40 ms on Linux) behind Nagle's algorithm.
    let incoming = TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            let _ = s.set_nodelay(true);
        }
        s
    });
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .http2_keepalive_interval(Some(Duration::from_secs(2)))
        .http2_keepalive_timeout(Some(Duration::from_secs(4)))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

fn session_config(h: &pb::Hello) -> SessionConfig {
    use crate::decisions::ckpt_interval::{IntervalConfig, IntervalMode};
    let ttl = Duration::from_millis(h.lease_ttl_ms.max(1000));
    SessionConfig {
        run_id: h.run_id.clone(),
        node_id: h.node_id.clone(),
        round: RoundConfig {
            min_nodes: h.min_nodes.max(1) as usize,
            max_nodes: h.max_nodes.max(h.min_nodes).max(1) as usize,
            last_call: Duration::from_millis(h.last_call_ms),
            join_timeout: Duration::from_millis(h.join_timeout_ms),
            settle: h.reform_settle_ms.map_or(
                crate::decisions::core::DEFAULT_SETTLE,
                Duration::from_millis,
            ),
        },
        lease_ttl: ttl,
        keep_alive_interval: ttl / 3,
        max_restarts: h.max_restarts,
        auto_keep_alive: false,
        scale_up_save: (h.scale_up_save_timeout_ms > 0)
            .then(|| Duration::from_millis(h.scale_up_save_timeout_ms)),
        ckpt_interval: IntervalConfig {
            mode: IntervalMode::parse(&h.ckpt_interval).unwrap_or_default(),
            expected_mtbf: if h.expected_mtbf_ms > 0 {
                Duration::from_millis(h.expected_mtbf_ms)
            } else {
                IntervalConfig::default().expected_mtbf
            },
        },
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ServerEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Rendezvous for RendezvousService {
    type SessionStream = EventStream;

    async fn session(
        &self,
        request: GrpcRequest<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let peer: Option<SocketAddr> = request.remote_addr();
        self.auth
            .check(request.metadata(), None)
            .map_err(|e| refused(&e, None, peer))?;
        let metadata = request.metadata().clone();
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await?.and_then(|m| m.kind) {
            Some(pb::agent_message::Kind::Hello(h)) => h,
            _ => {
                return Err(ServiceError::InvalidRequest(
                    "the first message of a session must be Hello".into(),
                )
                .to_status())
            }
        };
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err(ServiceError::Incompatible(format!(
                "protocol mismatch: the agent speaks drun.v{} but this server speaks drun.v{PROTOCOL_VERSION}; \
                 run the same drun release on agents and servers",
                hello.protocol_version
            ))
            .to_status());
        }
        if let Err(why) = crate::server::validate::hello(&hello) {
            return Err(ServiceError::InvalidRequest(format!("invalid Hello: {why}")).to_status());
        }
        self.auth
            .check(&metadata, Some(&hello.run_id))
            .map_err(|e| refused(&e, Some(&hello.run_id), peer))?;
        let seat = self.runs.enter(&hello.run_id).map_err(|e| {
            let why = ServiceError::Exhausted(e.to_string());
            refused(&why, Some(&hello.run_id), peer)
        })?;
        let cfg = session_config(&hello);
        tracing::info!(
            run = %cfg.run_id,
            node = %cfg.node_id,
            peer = %peer.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
            resume = hello.resume.is_some(),
            "agent session opened"
        );
        // The session's records name its node (and its run, for JSON logs).
        let span = if self.run_on_records {
            tracing::info_span!("session", run = %cfg.run_id, node = %cfg.node_id)
        } else {
            tracing::info_span!("session", node = %cfg.node_id)
        };
        let run_heard = self.runs.contact(&cfg.run_id);
        let waiting = Waiting::new(&cfg.run_id);
        // One channel to the agent's stream for the session's events and the keep-alive
        // answers, each turned into its wire message as it is sent.
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let emit: Emit = {
            let (tx, node, waiting) = (out_tx.clone(), cfg.node_id.clone(), waiting.clone());
            Arc::new(move |ev| {
                let msg = match ev {
                    Event::Formed(plan) => {
                        crate::server::metrics::global().formed(&plan);
                        waiting.set(false);
                        event_to_wire(&Event::Formed(plan.for_node(&node)))
                    }
                    ev => event_to_wire(&ev),
                };
                let _ = tx.send(Outgoing::Message(Box::new(msg)));
            })
        };
        let ended = {
            let tx = out_tx.clone();
            move || {
                let _ = tx.send(Outgoing::Ended);
            }
        };
        let req_tx = span.in_scope(|| {
            spawn_server_session(
                self.store.clone(),
                cfg.clone(),
                hello.resume.map(Into::into),
                Some(run_heard),
                emit,
                ended,
            )
        });
        let sessions = self.sessions.clone();
        sessions.fetch_add(1, Ordering::SeqCst);
        self.opened.fetch_add(1, Ordering::SeqCst);
        crate::server::metrics::global().session(&cfg.run_id, 1);
        let ack_tx = out_tx;
        let joined = waiting.clone();
        tokio::spawn(async move {
            loop {
                let m = match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(s) => {
                        // A message past MAX_MESSAGE, or one that does not decode: one line to
                        // the agent (a transport error has no one left to read it).
                        if matches!(
                            s.code(),
                            tonic::Code::ResourceExhausted
                                | tonic::Code::OutOfRange
                                | tonic::Code::InvalidArgument
                                | tonic::Code::Internal
                        ) {
                            tracing::warn!(run = %cfg.run_id, node = %cfg.node_id, "refused a message: {}", s.message());
                            let _ = ack_tx.send(Outgoing::Message(Box::new(event_to_wire(
                                &Event::Error(format!(
                                    "the rendezvous server refused a message: {}",
                                    s.message()
                                )),
                            ))));
                        }
                        break;
                    }
                };
                let Some(mut req) = request_from_wire(m) else {
                    continue;
                };
                if let Err(why) = crate::server::validate::request(&req, &cfg.node_id) {
                    // One line to the agent, and the session ends: a well-behaved agent never
                    // sends this, so nothing it asks for next can be trusted.
                    tracing::warn!(run = %cfg.run_id, node = %cfg.node_id, "refused an invalid request: {why}");
                    let _ = ack_tx.send(Outgoing::Message(Box::new(event_to_wire(&Event::Error(
                        format!("the rendezvous server refused an invalid request: {why}"),
                    )))));
                    break;
                }
                if let Request::Join(j, _) = &mut req {
                    if j.candidate.advertise_addr.is_empty() {
                        if let Some(p) = peer {
                            j.candidate.advertise_addr = p.ip().to_string();
                        }
                    }
                }
                if matches!(req, Request::Join(..)) {
                    joined.set(true);
                }
                let leave = req == Request::Leave;
                let keep_alive = req == Request::KeepAlive;
                if req_tx.send(req).is_err() || leave {
                    break;
                }
                if keep_alive {
                    let _ = ack_tx.send(Outgoing::Message(Box::new(pb::ServerEvent {
                        kind: Some(pb::server_event::Kind::KeptAlive(now_ms())),
                    })));
                }
            }
            drop(seat);
            sessions.fetch_sub(1, Ordering::SeqCst);
            crate::server::metrics::global().session(&cfg.run_id, -1);
            joined.set(false);
            tracing::info!(run = %cfg.run_id, node = %cfg.node_id, "agent session closed");
        });
        Ok(Response::new(Box::pin(Outbound {
            rx: out_rx,
            ended: false,
        })))
    }

    async fn status(
        &self,
        request: GrpcRequest<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let peer = request.remote_addr();
        let run = request.get_ref().run_id.clone();
        self.auth
            .check(request.metadata(), Some(&run))
            .map_err(|e| refused(&e, Some(&run), peer))?;
        let json = status_json(&self.store, &run)
            .await
            .map_err(|e| ServiceError::Unavailable(e.to_string()).to_status())?;
        Ok(Response::new(pb::StatusResponse {
            json: json.to_string(),
        }))
    }
}

/// Logs a refused request (without its token) and turns the refusal into its status.
fn refused(e: &ServiceError, run: Option<&str>, peer: Option<SocketAddr>) -> Status {
    let what = match e {
        ServiceError::Unauthenticated(_) => "an unauthenticated request",
        _ => "a session",
    };
    tracing::warn!(
        run = run.unwrap_or("?"),
        peer = %peer.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        "refused {what}: {e}"
    );
    e.to_status()
}

/// What goes to an agent's stream.
enum Outgoing {
    /// A message (boxed: a channel holds room for 32 items from the start, and a server holds
    /// a stream per agent).
    Message(Box<pb::ServerEvent>),
    /// The session ended: the stream ends (what was sent before it still goes out).
    Ended,
}

/// The messages of one session's stream to its agent: the session's events (a large plan cut
/// to the agent's own entry, [`crate::Plan::for_node`]) and the keep-alive answers, until the
/// session ends. Polled by the stream itself: no task of its own per session.
struct Outbound {
    rx: mpsc::UnboundedReceiver<Outgoing>,
    ended: bool,
}

impl Stream for Outbound {
    type Item = Result<pb::ServerEvent, Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.ended {
            return std::task::Poll::Ready(None);
        }
        self.rx.poll_recv(cx).map(|out| match out {
            Some(Outgoing::Message(m)) => Some(Ok(*m)),
            Some(Outgoing::Ended) | None => {
                self.ended = true;
                None
            }
        })
    }
}

/// Whether one session's agent waits for a plan (counted in `drun_rdzv_waiting{run}`): set by
/// its Join, cleared by its plan or the session's end.
#[derive(Clone)]
struct Waiting {
    run: Arc<str>,
    on: Arc<std::sync::atomic::AtomicBool>,
}

impl Waiting {
    fn new(run: &str) -> Self {
        Self {
            run: run.into(),
            on: Arc::default(),
        }
    }

    fn set(&self, on: bool) {
        if self.on.swap(on, Ordering::SeqCst) != on {
            crate::server::metrics::global().waiting(&self.run, if on { 1 } else { -1 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use drun_proto::v1::rendezvous_client::RendezvousClient;

    #[test]
    fn the_checkpoint_interval_travels_in_the_hello() {
        use crate::decisions::ckpt_interval::{IntervalConfig, IntervalMode};
        let h = pb::Hello {
            ckpt_interval: "auto".into(),
            expected_mtbf_ms: 600_000,
            ..Default::default()
        };
        assert_eq!(
            session_config(&h).ckpt_interval,
            IntervalConfig {
                mode: IntervalMode::Auto,
                expected_mtbf: Duration::from_secs(600),
            }
        );
        // An older agent sends neither: off, with the default prior.
        let old = session_config(&pb::Hello::default()).ckpt_interval;
        assert_eq!(old, IntervalConfig::default());
    }

    #[tokio::test]
    async fn a_sessions_stream_sends_what_came_before_its_end_then_ends_though_the_reader_lives() {
        let (tx, rx) = mpsc::unbounded_channel();
        let kept = |at| {
            Outgoing::Message(Box::new(pb::ServerEvent {
                kind: Some(pb::server_event::Kind::KeptAlive(at)),
            }))
        };
        tx.send(kept(1)).unwrap();
        tx.send(kept(2)).unwrap();
        tx.send(Outgoing::Ended).unwrap();
        // The reader answers once more after the session ended: never sent.
        tx.send(kept(3)).unwrap();
        // `tx` (the stream's reader) lives on: the stream ends at the session's end anyway.
        let out: Vec<_> = tokio::time::timeout(
            Duration::from_secs(5),
            Outbound { rx, ended: false }
                .map(|m| m.unwrap().kind)
                .collect(),
        )
        .await
        .expect("the stream ends at the session's end");
        use pb::server_event::Kind::KeptAlive;
        assert_eq!(out, vec![Some(KeptAlive(1)), Some(KeptAlive(2))]);
        drop(tx);
    }

    async fn hello_with_version(version: u32) -> Result<(), Status> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        tokio::spawn(serve(
            listener,
            RendezvousService::new(store),
            std::future::pending(),
        ));
        let mut client = RendezvousClient::connect(crate::error::endpoint_url(&addr.to_string()))
            .await
            .unwrap();
        let hello = pb::AgentMessage {
            kind: Some(pb::agent_message::Kind::Hello(pb::Hello {
                protocol_version: version,
                run_id: "r".into(),
                node_id: "n".into(),
                min_nodes: 1,
                max_nodes: 1,
                lease_ttl_ms: 10_000,
                join_timeout_ms: 1_000,
                ..Default::default()
            })),
        };
        let mut events = client
            .session(tokio_stream::iter(vec![hello]))
            .await?
            .into_inner();
        // A session that opened announces its lease.
        let first = events.message().await?.and_then(|e| e.kind);
        assert!(
            matches!(first, Some(pb::server_event::Kind::OpenedLease(_))),
            "{first:?}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn mismatched_protocol_version_is_refused_with_a_clear_error() {
        hello_with_version(PROTOCOL_VERSION)
            .await
            .expect("v1 accepted");
        let err = hello_with_version(PROTOCOL_VERSION + 1).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains("drun.v2"), "{}", err.message());
        assert!(
            err.message().contains("same drun release"),
            "{}",
            err.message()
        );
    }
}
