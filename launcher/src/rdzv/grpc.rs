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

#[derive(Default)]
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

async fn run(
    endpoints: Vec<String>,
    cfg: SessionConfig,
    mut requests: mpsc::UnboundedReceiver<Request>,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut t = Track::default();
    let started = Instant::now();
    let mut ever_connected = false;
    let mut said_waiting = false;
    let mut last_contact = Instant::now();
    let mut attempt = 0usize;
    let mut backoff = Duration::from_millis(100);
    loop {
        let endpoint = &endpoints[attempt % endpoints.len()];
        attempt += 1;
        if t.lease.is_some() && last_contact.elapsed() > cfg.lease_ttl {
            let _ = events.send(Event::Fenced(format!(
                "{UNREACHABLE} for {} (TTL {}; tried {})",
                human(last_contact.elapsed()),
                human(cfg.lease_ttl),
                endpoints.join(", ")
            )));
            t = Track::default();
        }
        if !ever_connected && started.elapsed() > FIRST_CONNECT_WINDOW {
            let _ = events.send(Event::Error(format!(
                "cannot reach the rendezvous at {} for {}; is `drun-rendezvous serve` (or, with the c10d/embedded backend, the hosting agent) running there?",
                endpoints.join(", "),
                human(FIRST_CONNECT_WINDOW)
            )));
            return;
        }
        // A server gone for good must not keep the agent retrying forever: past the join
        // timeout (the longest this node would wait for a group anyway) it is an error.
        if ever_connected && last_contact.elapsed() > cfg.round.join_timeout.max(cfg.lease_ttl) {
            let _ = events.send(Event::Error(format!(
                "lost the rendezvous server ({}) for {}; giving up",
                endpoints.join(", "),
                human(last_contact.elapsed())
            )));
            return;
        }
        let channel = match tonic::transport::Endpoint::from_shared(
            drun_rendezvous::error::endpoint_url(endpoint),
        ) {
            Ok(e) => e
                .connect_timeout(Duration::from_secs(2))
                .http2_keep_alive_interval(Duration::from_secs(2))
                .keep_alive_timeout(Duration::from_secs(4)),
            Err(e) => {
                let _ = events.send(Event::Error(format!(
                    "invalid rendezvous endpoint '{endpoint}': {e}"
                )));
                return;
            }
        };
        let channel = match channel.connect().await {
            Ok(c) => c,
            Err(e) => {
                let why = error_chain(&e);
                if ever_connected {
                    tracing::warn!(
                        "rendezvous server {endpoint} unreachable ({why}); trying again"
                    );
                } else if !said_waiting && started.elapsed() >= QUIET_FIRST_CONNECT {
                    // At start the host (embedded/c10d) or the server may simply not be up yet.
                    tracing::info!("waiting for the rendezvous at {endpoint} to come up ({why})");
                    said_waiting = true;
                } else {
                    tracing::debug!("rendezvous at {endpoint} not reachable yet ({why})");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let _ = out_tx.send(hello(&cfg, &t));
        if let Some(c) = t.waiting.clone().filter(|_| t.lease.is_none()) {
            let _ = out_tx.send(request_to_wire(&Request::Join(c, t.after)));
        }
        let mut client = RendezvousClient::new(channel);
        let mut inbound = match client.session(UnboundedReceiverStream::new(out_rx)).await {
            Ok(r) => r.into_inner(),
            Err(s) if drun_rendezvous::error::ServiceError::from_status(&s).is_refusal() => {
                let _ = events.send(Event::Error(format!(
                    "rendezvous server {endpoint} refused the session: {}",
                    s.message()
                )));
                return;
            }
            Err(s) => {
                tracing::warn!(%endpoint, error = %s, "rendezvous session failed; trying again");
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        if ever_connected {
            tracing::info!(%endpoint, "reconnected to the rendezvous");
        }
        ever_connected = true;
        backoff = Duration::from_millis(100);
        last_contact = Instant::now();
        if let (Some(g), Some(_)) = (t.succeeded, t.lease) {
            let _ = out_tx.send(request_to_wire(&Request::Succeeded(g)));
        }
        // Commits whose answer the broken stream lost: recording them again is idempotent.
        if t.lease.is_some() {
            for c in &t.commits {
                let _ = out_tx.send(request_to_wire(c));
            }
        }
        let mut tick = tokio::time::interval(cfg.keep_alive_interval);
        loop {
            tokio::select! {
                req = requests.recv() => {
                    let Some(req) = req else { return };
                    match &req {
                        Request::Join(c, after) => { t.waiting = Some(c.clone()); t.after = *after; t.generation = 0; t.succeeded = None; }
                        Request::Succeeded(g) => t.succeeded = Some(*g),
                        Request::Commit { .. } => t.commits.push(req.clone()),
                        _ => {}
                    }
                    let leave = req == Request::Leave;
                    if out_tx.send(request_to_wire(&req)).is_err() {
                        break;
                    }
                    if leave {
                        // Give the server a moment to revoke the lease, then end.
                        let _ = tokio::time::timeout(Duration::from_secs(2), inbound.message()).await;
                        return;
                    }
                }
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => {
                        last_contact = Instant::now();
                        let Some(ev) = event_from_wire(m) else { continue };
                        let end = matches!(ev, Event::Finished(_) | Event::Error(_));
                        match &ev {
                            Event::Opened { lease } => t.lease = Some(*lease),
                            Event::Formed(p) => { t.generation = p.generation; t.waiting = None; }
                            Event::Reform { .. } => { t.generation = 0; t.commits.clear(); }
                            Event::Committed { generation, step, .. } => t.commits.retain(|c| !matches!(c, Request::Commit { commit, .. } if commit.generation == *generation && commit.step == *step)),
                            Event::Fenced(_) => t = Track::default(),
                            _ => {}
                        }
                        if events.send(ev).is_err() || end {
                            // The run ended (or the server refused us): the server closes the
                            // session next; nothing to reconnect for.
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        // HTTP/2 keep-alive pings (2 s) vouch for the stream until now.
                        last_contact = Instant::now();
                        tracing::warn!(%endpoint, "lost the rendezvous server; reconnecting");
                        break;
                    }
                },
                _ = tick.tick() => {
                    let _ = out_tx.send(request_to_wire(&Request::KeepAlive));
                }
            }
        }
    }
}
