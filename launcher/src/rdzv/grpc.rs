//! Client of `drun-rendezvous` replicas: one session stream, failover across endpoints.
//!
//! A background task owns the stream. It forwards the agent's [`Request`]s, sends a keep-alive
//! every `keep_alive_interval`, and passes server [`Event`]s back. When the stream breaks it
//! reconnects — to the next endpoint of `--rdzv-endpoint a:p,b:p` — with `Hello.resume` (lease,
//! generation, waiting candidate), so a killed replica disturbs nothing. If no replica answers for
//! a whole lease TTL the lease must be considered expired: the task reports [`Event::Fenced`].
//! The first connection waits up to the join timeout (the server may start after this node);
//! when to give up is decided by [`super::reach::Reach`], what to replay by [`super::track::Track`].

use crate::error::error_chain;
use std::time::Duration;

use drun_proto::v1 as pb;
use drun_proto::v1::rendezvous_client::RendezvousClient;
use drun_proto::PROTOCOL_VERSION;
use drun_rendezvous::server::auth::Secret;
use drun_rendezvous::server::wire::{event_from_wire, request_to_wire};
use drun_rendezvous::session::{Event, Request, Resume, SessionConfig};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::reach::{explain, short_reason, Limits, Reach};
use super::track::Track;
use super::LEAVE_WAIT;
use crate::peers::{PeerHealth, Verdict};

/// How long an HTTP/2 keep-alive ping (sent every 2 s) may go unanswered before the stream is
/// given up; the server was not heard for at least that long when it is.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(4);

/// How the fence this link declares itself begins: no server could be reached for a whole
/// lease TTL. Unlike a fence the server declares (the lease expired while this agent was
/// stopped), the rendezvous is gone, so a worker failure stays the primary error.
pub const UNREACHABLE: &str = "no rendezvous server reachable";
/// How the fence of a node cut off from its peers as well as the server begins (then the
/// group went on without it: a failure it was reporting is moot, it joins again).
pub const CUT_OFF: &str = "cut off: no peer answers this node's probes either";

/// Connects to the replicas `endpoints` (`host:port`) for the session described by `cfg`.
/// How the agent proves who it is and what it trusts: its token (sent with every session, see
/// `drun_rendezvous::server::auth`) and its TLS settings (`drun_rendezvous::server::tls`).
#[derive(Debug, Clone, Default)]
pub struct Creds {
    /// `--rdzv-token-file` / `DRUN_RDZV_TOKEN`.
    pub token: Option<Secret>,
    /// `--rdzv-tls-ca` (and the mTLS identity).
    pub tls: Option<drun_rendezvous::server::tls::ClientTls>,
}

impl Creds {
    /// The credentials of a prepared launch config.
    pub fn of(cfg: &crate::LaunchConfig) -> Self {
        Creds {
            token: cfg.security.rdzv_token.clone(),
            tls: cfg.security.rdzv_tls.clone(),
        }
    }
}

/// The link's task: it ends once what the agent sent up to its Leave reached the server (or
/// the link gave up), which the agent waits for before it exits.
pub struct Task {
    /// The task itself.
    pub join: tokio::task::JoinHandle<()>,
    /// Told when the agent leaves: a link that never had a session has nothing to carry to a
    /// server, and stops trying (and saying that it waits) at once.
    leaving: tokio::sync::watch::Sender<bool>,
}

impl Task {
    /// The agent leaves (its Leave is queued).
    pub fn leaving(&self) {
        let _ = self.leaving.send(true);
    }
}

/// The link's task is returned too (see [`Task`]).
pub fn connect(
    endpoints: Vec<String>,
    cfg: SessionConfig,
    creds: Creds,
    peers: Option<PeerHealth>,
) -> (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
    Task,
) {
    let (req_tx, req_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let (leaving, leaving_rx) = tokio::sync::watch::channel(false);
    let join = tokio::spawn(tracing::Instrument::in_current_span(run(
        endpoints, cfg, creds, peers, req_rx, ev_tx, leaving_rx,
    )));
    (req_tx, ev_rx, Task { join, leaving })
}

fn hello(cfg: &SessionConfig, t: &Track) -> pb::AgentMessage {
    let resume = t.lease.map(|lease| Resume {
        lease,
        generation: t.generation,
        waiting: t.waiting.clone(),
    });
    pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Hello(pb::Hello {
            protocol_version: PROTOCOL_VERSION,
            run_id: cfg.run_id.clone(),
            node_id: cfg.node_id.clone(),
            min_nodes: cfg.round.min_nodes as u32,
            max_nodes: cfg.round.max_nodes as u32,
            last_call_ms: cfg.round.last_call.as_millis() as u64,
            join_timeout_ms: cfg.round.join_timeout.as_millis() as u64,
            lease_ttl_ms: cfg.lease_ttl.as_millis() as u64,
            max_restarts: cfg.max_restarts,
            resume: resume.as_ref().map(Into::into),
            scale_up_save_timeout_ms: cfg.scale_up_save.map_or(0, |d| d.as_millis() as u64),
            ckpt_interval: cfg.ckpt_interval.mode.to_arg(),
            expected_mtbf_ms: cfg.ckpt_interval.expected_mtbf.as_millis() as u64,
            reform_settle_ms: Some(cfg.round.settle.as_millis() as u64),
        })),
    }
}

/// The outcome of one connection attempt.
enum Conn {
    /// A channel, and the address it reaches (`IP:PORT`, or the URL as given).
    Ready(tonic::transport::Channel, String),
    /// Not reachable now: try the next endpoint after the backoff.
    Retry,
    /// Reported to the agent as an error: the task ends.
    Fatal,
}

/// Why the stream loop ended.
enum Next {
    /// Connect again (the stream broke).
    Reconnect,
    /// The agent left, the run ended or the link gave up: the task ends.
    End,
}

/// The link task's state across reconnects.
struct Client {
    endpoints: Vec<String>,
    cfg: SessionConfig,
    creds: Creds,
    events: mpsc::UnboundedSender<Event>,
    t: Track,
    reach: Reach,
    /// What the peer probes say, if they run.
    peers: Option<PeerHealth>,
    attempt: usize,
    backoff: Duration,
    /// Whether the wait for a name to resolve was announced.
    said_dns: bool,
    /// Whether the agent leaves ([`Task::leaving`]).
    leaving: tokio::sync::watch::Receiver<bool>,
}

async fn run(
    endpoints: Vec<String>,
    cfg: SessionConfig,
    creds: Creds,
    peers: Option<PeerHealth>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    events: mpsc::UnboundedSender<Event>,
    leaving: tokio::sync::watch::Receiver<bool>,
) {
    let mut c = Client {
        endpoints,
        cfg,
        creds,
        events,
        t: Track::default(),
        reach: Reach::new(Instant::now()),
        peers,
        attempt: 0,
        backoff: Duration::from_millis(100),
        said_dns: false,
        leaving,
    };
    loop {
        let endpoint = c.endpoints[c.attempt % c.endpoints.len()].clone();
        c.attempt += 1;
        if c.give_up() {
            return;
        }
        let (channel, target) = match c.connect(&endpoint).await {
            Conn::Ready(channel, target) => (channel, target),
            Conn::Retry => continue,
            Conn::Fatal => return,
        };
        let (out_tx, inbound) = match c.open(&endpoint, &target, channel).await {
            Some(Opened::Stream(tx, rx)) => (tx, rx),
            Some(Opened::Refused) => return,
            None => continue,
        };
        if let Next::End = c.pump(&endpoint, &mut requests, out_tx, inbound).await {
            return;
        }
    }
}

impl Client {
    /// Declares the fence after a whole lease TTL without a server, logs the wait for a first
    /// connection, and gives up (true) when no server answered within the join timeout, at
    /// first or later (see [`Reach::check`]).
    fn give_up(&mut self) -> bool {
        let leaving = *self.leaving.borrow();
        if leaving && self.t.lease.is_none() {
            // No session was ever opened (or its lease is gone): nothing to leave.
            return true;
        }
        let limits = Limits {
            lease_ttl: self.cfg.lease_ttl,
            join_timeout: self.cfg.round.join_timeout,
        };
        let all = self.endpoints.join(", ");
        let now = Instant::now();
        let v = self
            .reach
            .check(now, self.t.lease.is_some(), self.vouched(now), limits, &all);
        if let Some(line) = v.fence {
            // Cut off from its peers too: the group went on without this node (its session gave
            // it up), so a failure it was reporting is moot and it joins again, like any node
            // the rendezvous fenced; only a rendezvous gone while the peers answer leaves a
            // failure undecided (`agent/failure.rs`, `fenced`).
            let line = match self.silent_peers(now) {
                Some((_, true)) => format!("{CUT_OFF}: {line}"),
                Some((ranks, false)) => {
                    line + &super::reach::silent_peers_note(&ranks, self.t.generation)
                }
                None => line,
            };
            let _ = self.events.send(Event::Fenced(line));
            self.t = Track::default();
        }
        if let (Some(line), false) = (v.progress, leaving) {
            tracing::info!("{line}");
        }
        if let Some(line) = v.give_up {
            let _ = self.events.send(Event::Error(line));
            return true;
        }
        false
    }

    /// Whether no peer of this node's generation answers its probes (there is at least one):
    /// this node is the one cut off.
    fn cut_off(&self, now: Instant) -> bool {
        self.silent_peers(now).is_some_and(|(_, all)| all)
    }

    /// The node ranks of this node's generation that do not answer its probes, if any, and
    /// whether they are all of its peers.
    fn silent_peers(&self, now: Instant) -> Option<(Vec<u32>, bool)> {
        let p = self.peers.as_ref()?;
        match p.verdict(now) {
            Verdict::Silent(ranks) => {
                let all = ranks.len() == p.peer_count();
                Some((ranks, all))
            }
            _ => None,
        }
    }

    /// The generation this agent's workers train, or whose failure it reports, when every peer
    /// of it answers its probes now: this node is not cut off, so it holds on (see
    /// [`Reach::check`]). Either the rendezvous is gone for everyone and the generation goes on,
    /// or it is gone for this node alone and the peers went on without it: then the server
    /// says so when it answers again (a replayed failure report of a closed generation), and
    /// the node joins again. Not while the node waits for any other answer
    /// ([`Track::training`], [`Track::reporting_failure`]): a join gets none from a server that
    /// is gone, while a failure report is replayed when one answers (the workers are stopped,
    /// so waiting cannot make a second world).
    fn vouched(&self, now: Instant) -> Option<u64> {
        let g = self.t.generation;
        let peers = self.peers.as_ref()?;
        // The agent's word counts for a failure report the link has not taken yet: sent while
        // no server answered, it waits in the queue (a trial's host, cut off from the server
        // alone, exited 3 at the TTL for want of it, though its peers answered).
        let keeps = (self.t.training() && peers.keeps_generation()) || self.t.reporting_failure();
        (keeps && peers.generation() == g && peers.verdict(now) == Verdict::AllAnswer).then_some(g)
    }

    /// How this link connects (TLS or not, with a client certificate or not).
    fn tls(&self) -> drun_rendezvous::server::tls::Mode {
        drun_rendezvous::server::tls::Mode::of(self.creds.tls.as_ref())
    }

    /// What listens on `target` after a plaintext handshake failure (`chain`) before the first
    /// session ([`super::foreign`]): `Err` ends the link with that line, `Ok(Some)` is the
    /// reason to show instead of the transport error.
    async fn identify(
        &self,
        target: &str,
        endpoint: &str,
        chain: &str,
    ) -> Result<Option<String>, drun_rendezvous::client::foreign::ForeignServer> {
        let plain = drun_rendezvous::server::tls::Mode::Plain;
        if self.tls() != plain
            || self.reach.ever_connected()
            || drun_rendezvous::server::tls::hint(chain, plain).is_none()
        {
            return Ok(None);
        }
        match super::foreign::probe(target).await {
            Some(answer) => super::foreign::verdict(&answer, endpoint),
            None => Ok(None),
        }
    }

    /// Waits the backoff, then doubles it (at most 2 s).
    async fn back_off(&mut self) {
        // A leave cuts the wait short when there is no session to carry it to: the next
        // attempt's check ends the link.
        let no_session = self.t.lease.is_none();
        let leaving = &mut self.leaving;
        let left = async {
            if !no_session || leaving.wait_for(|l| *l).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let _ = tokio::time::timeout(self.backoff, left).await;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(2));
    }

    /// A channel to `endpoint`, its name resolved afresh ([`crate::dns`]: a pod recreated
    /// elsewhere has a new IP; a name not in DNS yet is waited for); `Retry` after the backoff;
    /// `Fatal` for an invalid endpoint.
    async fn connect(&mut self, endpoint: &str) -> Conn {
        let target = if endpoint.contains("://") {
            endpoint.to_string()
        } else {
            match crate::dns::resolve(endpoint).await {
                Ok(addr) => addr.to_string(),
                Err(why) => {
                    if !self.said_dns {
                        self.said_dns = true;
                        tracing::info!(
                            "waiting for the rendezvous name to resolve: {why} (pods start at different times; retrying until the join timeout)"
                        );
                    }
                    self.reach.failed_because(why.to_string());
                    self.back_off().await;
                    return Conn::Retry;
                }
            }
        };
        // TLS checks the certificate against the name the user gave, not the resolved address.
        let name = endpoint
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'));
        let channel =
            match drun_rendezvous::server::tls::endpoint(&target, self.creds.tls.as_ref(), name) {
                Ok(e) => e
                    .connect_timeout(Duration::from_secs(2))
                    .http2_keep_alive_interval(Duration::from_secs(2))
                    .keep_alive_timeout(H2_PING_TIMEOUT),
                Err(e) => {
                    let _ = self.events.send(Event::Error(format!(
                        "invalid rendezvous endpoint '{endpoint}': {e}"
                    )));
                    return Conn::Fatal;
                }
            };
        match channel.connect().await {
            Ok(c) => Conn::Ready(c, target),
            Err(e) => {
                let why = error_chain(&e);
                // At start the host (embedded/c10d) or the server may simply not be up yet;
                // later the lost stream was said once: `Reach::check` says either every 10 s.
                tracing::debug!("rendezvous at {endpoint} not reachable ({why})");
                let why = match self.identify(&target, endpoint, &why).await {
                    Ok(Some(found)) => found,
                    Ok(None) => explain(short_reason(&why), &why, self.tls()),
                    Err(line) => {
                        let _ = self.events.send(Event::Error(line.to_string()));
                        return Conn::Fatal;
                    }
                };
                self.reach.failed_because(why);
                tokio::time::sleep(self.backoff).await;
                self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
                Conn::Retry
            }
        }
    }

    /// Opens the session stream on `channel` (Hello, then what a reconnect must replay).
    /// None: try again (or, on a refusal, the error was reported and the next attempt ends).
    async fn open(
        &mut self,
        endpoint: &str,
        target: &str,
        channel: tonic::transport::Channel,
    ) -> Option<Opened> {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let _ = out_tx.send(hello(&self.cfg, &self.t));
        for req in self.t.replay() {
            let _ = out_tx.send(request_to_wire(&req));
        }
        let mut client = RendezvousClient::new(channel);
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(out_rx));
        drun_rendezvous::server::auth::attach(&mut request, self.creds.token.as_ref());
        match client.session(request).await {
            // Counted as contact only once the server says something (its first answer to a
            // keep-alive comes at once): an HTTP/2 endpoint that is not a drun server (a proxy,
            // an ingress without a route) accepts the stream and ends it.
            Ok(r) => Some(Opened::Stream(out_tx, Box::new(r.into_inner()))),
            Err(s) if drun_rendezvous::error::ServiceError::from_status(&s).is_refusal() => {
                let _ = self.events.send(Event::Error(format!(
                    "rendezvous server {endpoint} refused the session: {}",
                    s.message()
                )));
                Some(Opened::Refused)
            }
            // A gRPC server without drun.v1 (etcd, most often: the backend flag forgotten)
            // cannot become a rendezvous by waiting: the link ends at once, with the fix.
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                let _ = self.events.send(Event::Error(format!(
                    "rendezvous endpoint {endpoint}: {}",
                    not_a_session(&s)
                )));
                Some(Opened::Refused)
            }
            Err(s) => {
                let chain = error_chain(&s);
                let why = match self.identify(target, endpoint, &chain).await {
                    Ok(Some(found)) => found,
                    Ok(None) => explain(not_a_session(&s), &chain, self.tls()),
                    Err(line) => {
                        let _ = self.events.send(Event::Error(line.to_string()));
                        return Some(Opened::Refused);
                    }
                };
                tracing::debug!(%endpoint, "rendezvous session failed ({why}); trying again");
                self.reach.failed_because(why);
                self.back_off().await;
                None
            }
        }
    }

    /// Forwards requests (and keep-alives) and events over one stream until it breaks.
    async fn pump(
        &mut self,
        endpoint: &str,
        requests: &mut mpsc::UnboundedReceiver<Request>,
        out_tx: mpsc::UnboundedSender<pb::AgentMessage>,
        mut inbound: Box<tonic::Streaming<pb::ServerEvent>>,
    ) -> Next {
        let mut tick = tokio::time::interval(self.cfg.keep_alive_interval);
        // Whether this stream brought anything from the server yet.
        let mut heard = false;
        // Whether the run ended (or the server refused the session): nothing to reconnect for.
        let mut ended = false;
        loop {
            tokio::select! {
                req = requests.recv() => {
                    let Some(req) = req else { return Next::End };
                    self.t.sent(&req);
                    let leave = req == Request::Leave;
                    if out_tx.send(request_to_wire(&req)).is_err() {
                        return if ended { Next::End } else { Next::Reconnect };
                    }
                    if leave {
                        // The server carries out the requests in order: its session ends (and
                        // with it this stream) once it has taken everything sent before the
                        // Leave and revoked the lease.
                        let _ = tokio::time::timeout(LEAVE_WAIT, async {
                            while let Ok(Some(_)) = inbound.message().await {}
                        })
                        .await;
                        return Next::End;
                    }
                }
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => {
                        if !heard {
                            heard = true;
                            if self.reach.ever_connected() {
                                tracing::info!(%endpoint, "reconnected to the rendezvous");
                            }
                            if let Some((g, lasted)) = self.reach.take_outage(Instant::now()) {
                                // Counted from the last word heard (the cut came after it): an upper bound.
                                tracing::info!("the control plane was away for up to {} (nothing heard from it for that long); this node held on to generation {g} through it", drun_rendezvous::human::duration(lasted));
                                let _ = out_tx.send(request_to_wire(&Request::Report {
                                    kind: drun_rendezvous::store::reports::ReportKind::Outage,
                                    json: serde_json::json!({
                                        "generation": g,
                                        "seconds": lasted.as_secs_f64(),
                                        "ended_at_ms": drun_rendezvous::clock::now_ms(),
                                    })
                                    .to_string(),
                                }));
                            }
                            self.backoff = Duration::from_millis(100);
                        }
                        self.reach.contact(Instant::now());
                        let Some(ev) = event_from_wire(m) else { continue };
                        if ev == Event::Ping {
                            // A peer does not hear this node: answer at once, or the session
                            // gives the node up (`drun_rendezvous::session` silence rule).
                            let _ = out_tx.send(request_to_wire(&Request::KeepAlive));
                            continue;
                        }
                        let end = matches!(ev, Event::Finished(_) | Event::Error(_));
                        self.t.received(&ev);
                        if self.events.send(ev).is_err() {
                            return Next::End;
                        }
                        if end {
                            // The run ended (or the server refused us). The agent hears the
                            // link close after the end, as from every backend; the stream
                            // still carries what the agent sends until it leaves (a report
                            // of its last moments races the end, seen in CI).
                            let (closed, _) = mpsc::unbounded_channel();
                            self.events = closed;
                            ended = true;
                        }
                    }
                    Ok(None) | Err(_) if ended => return Next::End,
                    Ok(None) | Err(_) if !heard => {
                        // Ended before the server said anything: not a working session.
                        let why = match msg {
                            Err(s) => explain(not_a_session(&s), &error_chain(&s), self.tls()),
                            _ => "the session ended at once".to_string(),
                        };
                        tracing::debug!(%endpoint, "rendezvous session failed ({why}); trying again");
                        self.reach.failed_because(why);
                        self.back_off().await;
                        return Next::Reconnect;
                    }
                    Ok(None) | Err(_) => {
                        // HTTP/2 keep-alive pings (2 s) vouch for the stream until they went
                        // unanswered.
                        // Unanswered since before the break only when this node is the one cut
                        // off (no peer answers either); an agent that was itself stopped (its
                        // pings were never sent) keeps the stream's word until now.
                        let unanswered = if self.cut_off(Instant::now()) {
                            H2_PING_TIMEOUT
                        } else {
                            Duration::ZERO
                        };
                        self.reach.stream_broke(Instant::now(), unanswered);
                        tracing::warn!(%endpoint, "lost the rendezvous server; reconnecting");
                        return Next::Reconnect;
                    }
                },
                _ = tick.tick() => {
                    let _ = out_tx.send(request_to_wire(&Request::KeepAlive));
                }
            }
        }
    }
}

/// Why a session could not be opened, in words: an endpoint that answers but does not serve
/// drun.v1 (etcd itself, another gRPC service, an HTTP/2 proxy) is named as such.
fn not_a_session(s: &tonic::Status) -> String {
    match s.code() {
        tonic::Code::Unimplemented | tonic::Code::NotFound => format!(
            "it answered, but not as a drun-rendezvous server ({}); for an etcd endpoint use --rdzv-backend etcd",
            s.message().trim()
        ),
        _ => short_reason(s.message()),
    }
}

/// An opened session stream, or a refusal or a listener that is not a drun server (already
/// reported).
enum Opened {
    Stream(
        mpsc::UnboundedSender<pb::AgentMessage>,
        Box<tonic::Streaming<pb::ServerEvent>>,
    ),
    Refused,
}
