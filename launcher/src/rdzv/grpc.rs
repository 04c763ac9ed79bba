//! Client of `drun-rendezvous` replicas: one session stream, failover across endpoints.
//!
//! A background task owns the stream. It forwards the agent's [`Request`]s, sends a keep-alive
//! every `keep_alive_interval`, and passes server [`Event`]s back. When the stream breaks it
//! reconnects — to the next endpoint of `--rdzv-endpoint a:p,b:p` — with `Hello.resume` (lease,
//! generation, waiting candidate), so a killed replica disturbs nothing. If no replica answers for
//! a whole lease TTL the lease must be considered expired: the task reports [`Event::Fenced`].

use drun_rendezvous::human::duration as human;
use std::time::Duration;

use drun_proto::v1 as pb;
use drun_proto::v1::rendezvous_client::RendezvousClient;
use drun_proto::PROTOCOL_VERSION;
use drun_rendezvous::session::{Event, Request, Resume, SessionConfig};
use drun_rendezvous::wire::{event_from_wire, request_to_wire};
use drun_rendezvous::Join;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// How long the first connection may take before the rendezvous is declared unreachable.
const FIRST_CONNECT_WINDOW: Duration = Duration::from_secs(10);
/// How the fence this link declares itself begins: no server could be reached for a whole
/// lease TTL. Unlike a fence the server declares (the lease expired while this agent was
/// stopped), the rendezvous is gone, so a worker failure stays the primary error.
pub const UNREACHABLE: &str = "no rendezvous server reachable";

/// How long a first connection may fail quietly (peers start at slightly different times).
const QUIET_FIRST_CONNECT: Duration = Duration::from_secs(2);

/// An error with its causes (`transport error: tcp connect error: Connection refused`).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let c_s = c.to_string();
        if !s.ends_with(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        cur = c.source();
    }
    s
}

/// What a reconnect must restore: the session's lease and generation, the pending Join, the
/// success and the commits not answered yet. Updated by [`Track::sent`] and
/// [`Track::received`], pure functions of the traffic.
#[derive(Default, Debug)]
struct Track {
    lease: Option<i64>,
    generation: u64,
    waiting: Option<Join>,
    /// The `after` generation of the pending Join.
    after: u64,
    succeeded: Option<u64>,
    /// Commits sent and not answered yet.
    commits: Vec<Request>,
}

impl Track {
    /// Records a request sent to the server.
    fn sent(&mut self, req: &Request) {
        match req {
            Request::Join(c, after) => {
                self.waiting = Some(c.clone());
                self.after = *after;
                self.generation = 0;
                self.succeeded = None;
            }
            Request::Succeeded(g) => self.succeeded = Some(*g),
            Request::Commit { .. } => self.commits.push(req.clone()),
            _ => {}
        }
    }

    /// Records an event received from the server.
    fn received(&mut self, ev: &Event) {
        match ev {
            Event::Opened { lease } => self.lease = Some(*lease),
            Event::Formed(p) => {
                self.generation = p.generation;
                self.waiting = None;
            }
            Event::Reform { .. } => {
                self.generation = 0;
                self.commits.clear();
            }
            Event::Committed {
                generation, step, ..
            } => self.commits.retain(|c| {
                !matches!(c, Request::Commit { commit, .. }
                    if commit.generation == *generation && commit.step == *step)
            }),
            Event::Fenced(_) => *self = Track::default(),
            _ => {}
        }
    }

    /// What to send on a new stream after the Hello: the pending Join (when there is no lease
    /// to resume it with), the success, and the unanswered commits (recording them again is
    /// idempotent).
    fn replay(&self) -> Vec<Request> {
        let mut out = Vec::new();
        if let Some(c) = self.waiting.clone().filter(|_| self.lease.is_none()) {
            out.push(Request::Join(c, self.after));
        }
        if self.lease.is_some() {
            out.extend(self.succeeded.map(Request::Succeeded));
            out.extend(self.commits.iter().cloned());
        }
        out
    }
}

/// Connects to the replicas `endpoints` (`host:port`) for the session described by `cfg`.
pub fn connect(
    endpoints: Vec<String>,
    cfg: SessionConfig,
) -> (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
) {
    let (req_tx, req_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    tokio::spawn(tracing::Instrument::in_current_span(run(
        endpoints, cfg, req_rx, ev_tx,
    )));
    (req_tx, ev_rx)
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
            reform_settle_ms: Some(cfg.round.settle.as_millis() as u64),
        })),
    }
}

/// The outcome of one connection attempt.
enum Conn {
    Ready(tonic::transport::Channel),
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
    events: mpsc::UnboundedSender<Event>,
    t: Track,
    started: Instant,
    ever_connected: bool,
    said_waiting: bool,
    last_contact: Instant,
    attempt: usize,
    backoff: Duration,
}

async fn run(
    endpoints: Vec<String>,
    cfg: SessionConfig,
    mut requests: mpsc::UnboundedReceiver<Request>,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut c = Client {
        endpoints,
        cfg,
        events,
        t: Track::default(),
        started: Instant::now(),
        ever_connected: false,
        said_waiting: false,
        last_contact: Instant::now(),
        attempt: 0,
        backoff: Duration::from_millis(100),
    };
    loop {
        let endpoint = c.endpoints[c.attempt % c.endpoints.len()].clone();
        c.attempt += 1;
        if c.give_up() {
            return;
        }
        let channel = match c.connect(&endpoint).await {
            Conn::Ready(channel) => channel,
            Conn::Retry => continue,
            Conn::Fatal => return,
        };
        let (out_tx, inbound) = match c.open(&endpoint, channel).await {
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
    /// Declares the fence after a whole lease TTL without a server, and gives up (true) when no
    /// server answered at first or the server is gone for longer than this node would wait.
    fn give_up(&mut self) -> bool {
        let (cfg, all) = (&self.cfg, self.endpoints.join(", "));
        if self.t.lease.is_some() && self.last_contact.elapsed() > cfg.lease_ttl {
            let _ = self.events.send(Event::Fenced(format!(
                "{UNREACHABLE} for {} (TTL {}; tried {all})",
                human(self.last_contact.elapsed()),
                human(cfg.lease_ttl),
            )));
            self.t = Track::default();
        }
        if !self.ever_connected && self.started.elapsed() > FIRST_CONNECT_WINDOW {
            let _ = self.events.send(Event::Error(format!(
                "cannot reach the rendezvous at {all} for {}; is `drun-rendezvous serve` (or, with the c10d/embedded backend, the hosting agent) running there?",
                human(FIRST_CONNECT_WINDOW)
            )));
            return true;
        }
        // A server gone for good must not keep the agent retrying forever: past the join
        // timeout (the longest this node would wait for a group anyway) it is an error.
        if self.ever_connected
            && self.last_contact.elapsed() > cfg.round.join_timeout.max(cfg.lease_ttl)
        {
            let _ = self.events.send(Event::Error(format!(
                "lost the rendezvous server ({all}) for {}; giving up",
                human(self.last_contact.elapsed())
            )));
            return true;
        }
        false
    }

    /// A channel to `endpoint`; `Retry` after the backoff; `Fatal` for an invalid endpoint.
    async fn connect(&mut self, endpoint: &str) -> Conn {
        let channel = match tonic::transport::Endpoint::from_shared(
            drun_rendezvous::error::endpoint_url(endpoint),
        ) {
            Ok(e) => e
                .connect_timeout(Duration::from_secs(2))
                .http2_keep_alive_interval(Duration::from_secs(2))
                .keep_alive_timeout(Duration::from_secs(4)),
            Err(e) => {
                let _ = self.events.send(Event::Error(format!(
                    "invalid rendezvous endpoint '{endpoint}': {e}"
                )));
                return Conn::Fatal;
            }
        };
        match channel.connect().await {
            Ok(c) => Conn::Ready(c),
            Err(e) => {
                let why = error_chain(&e);
                if self.ever_connected {
                    tracing::warn!(
                        "rendezvous server {endpoint} unreachable ({why}); trying again"
                    );
                } else if !self.said_waiting && self.started.elapsed() >= QUIET_FIRST_CONNECT {
                    // At start the host (embedded/c10d) or the server may simply not be up yet.
                    tracing::info!("waiting for the rendezvous at {endpoint} to come up ({why})");
                    self.said_waiting = true;
                } else {
                    tracing::debug!("rendezvous at {endpoint} not reachable yet ({why})");
                }
                tokio::time::sleep(self.backoff).await;
                self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
                Conn::Retry
            }
        }
    }

    /// Opens the session stream on `channel` (Hello, then what a reconnect must replay).
    /// None: try again (or, on a refusal, the error was reported and the next attempt ends).
    async fn open(&mut self, endpoint: &str, channel: tonic::transport::Channel) -> Option<Opened> {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let _ = out_tx.send(hello(&self.cfg, &self.t));
        for req in self.t.replay() {
            let _ = out_tx.send(request_to_wire(&req));
        }
        let mut client = RendezvousClient::new(channel);
        match client.session(UnboundedReceiverStream::new(out_rx)).await {
            Ok(r) => {
                if self.ever_connected {
                    tracing::info!(%endpoint, "reconnected to the rendezvous");
                }
                self.ever_connected = true;
                self.backoff = Duration::from_millis(100);
                self.last_contact = Instant::now();
                Some(Opened::Stream(out_tx, Box::new(r.into_inner())))
            }
            Err(s) if drun_rendezvous::error::ServiceError::from_status(&s).is_refusal() => {
                let _ = self.events.send(Event::Error(format!(
                    "rendezvous server {endpoint} refused the session: {}",
                    s.message()
                )));
                Some(Opened::Refused)
            }
            Err(s) => {
                tracing::warn!(%endpoint, error = %s, "rendezvous session failed; trying again");
                tokio::time::sleep(self.backoff).await;
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
        loop {
            tokio::select! {
                req = requests.recv() => {
                    let Some(req) = req else { return Next::End };
                    self.t.sent(&req);
                    let leave = req == Request::Leave;
                    if out_tx.send(request_to_wire(&req)).is_err() {
                        return Next::Reconnect;
                    }
                    if leave {
                        // Give the server a moment to revoke the lease, then end.
                        let _ = tokio::time::timeout(Duration::from_secs(2), inbound.message()).await;
                        return Next::End;
                    }
                }
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => {
                        self.last_contact = Instant::now();
                        let Some(ev) = event_from_wire(m) else { continue };
                        let end = matches!(ev, Event::Finished(_) | Event::Error(_));
                        self.t.received(&ev);
                        if self.events.send(ev).is_err() || end {
                            // The run ended (or the server refused us): the server closes the
                            // session next; nothing to reconnect for.
                            return Next::End;
                        }
                    }
                    Ok(None) | Err(_) => {
                        // HTTP/2 keep-alive pings (2 s) vouch for the stream until now.
                        self.last_contact = Instant::now();
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

/// An opened session stream, or a refusal (already reported).
enum Opened {
    Stream(
        mpsc::UnboundedSender<pb::AgentMessage>,
        Box<tonic::Streaming<pb::ServerEvent>>,
    ),
    Refused,
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::ledger::{NodeCommit, Retention};
    use drun_rendezvous::{assign, Candidate};

    fn join(node: &str) -> Join {
        Candidate {
            node_id: node.into(),
            advertise_addr: "127.0.0.1".into(),
            slots: 1,
            requested_node_rank: None,
            master_port: 29500,
        }
        .into()
    }

    fn commit(generation: u64, step: u64) -> Request {
        Request::Commit {
            commit: NodeCommit {
                node_id: "a".into(),
                generation,
                step,
                ranks: vec![0],
                cursor: Default::default(),
                files: vec![],
            },
            retention: Retention::default(),
        }
    }

    fn formed(generation: u64) -> Event {
        let Join { candidate, .. } = join("a");
        Event::Formed(assign("run", generation, &[candidate], 0, 0).unwrap())
    }

    #[test]
    fn a_join_without_a_lease_is_replayed_on_the_next_stream() {
        let mut t = Track::default();
        t.sent(&Request::Join(join("a"), 3));
        assert_eq!(t.replay(), vec![Request::Join(join("a"), 3)]);
    }

    #[test]
    fn with_a_lease_the_join_rides_on_the_hello_not_the_replay() {
        let mut t = Track::default();
        t.received(&Event::Opened { lease: 7 });
        t.sent(&Request::Join(join("a"), 0));
        assert!(t.replay().is_empty());
        assert_eq!(t.waiting, Some(join("a")));
    }

    #[test]
    fn formed_records_the_generation_and_ends_the_wait() {
        let mut t = Track::default();
        t.sent(&Request::Join(join("a"), 0));
        t.received(&formed(4));
        assert_eq!((t.generation, t.waiting.is_none()), (4, true));
    }

    #[test]
    fn success_and_unanswered_commits_are_replayed_under_a_lease() {
        let mut t = Track::default();
        t.received(&Event::Opened { lease: 1 });
        t.sent(&commit(2, 10));
        t.sent(&commit(2, 20));
        t.sent(&Request::Succeeded(2));
        t.received(&Event::Committed {
            generation: 2,
            step: 10,
            result: Err("refused".into()),
        });
        assert_eq!(t.replay(), vec![Request::Succeeded(2), commit(2, 20)]);
    }

    #[test]
    fn a_reform_drops_the_commits_and_the_generation() {
        let mut t = Track::default();
        t.received(&Event::Opened { lease: 1 });
        t.received(&formed(2));
        t.sent(&commit(2, 10));
        t.received(&Event::Reform {
            generation: 2,
            reason: "node b lost".into(),
        });
        assert_eq!((t.generation, t.commits.len()), (0, 0));
    }

    #[test]
    fn a_new_join_forgets_the_last_success() {
        let mut t = Track::default();
        t.received(&Event::Opened { lease: 1 });
        t.sent(&Request::Succeeded(2));
        t.sent(&Request::Join(join("a"), 2));
        assert_eq!(t.succeeded, None);
    }

    #[test]
    fn a_fence_forgets_the_lease_and_everything_with_it() {
        let mut t = Track::default();
        t.received(&Event::Opened { lease: 1 });
        t.received(&formed(3));
        t.sent(&commit(3, 5));
        t.received(&Event::Fenced("lease expired".into()));
        assert_eq!((t.lease, t.generation, t.commits.len()), (None, 0, 0));
    }
}
