//! A worker failure in a multi-node generation, through real sessions on the memory store: when
//! every other member's agent answers a knock on its probe port the failure is the workers' own
//! at once (the budget is spent, no window waited out); when a member's agent is gone, the
//! failure is a membership restart (nothing spent): at once where each session holds its own
//! lease (it drops the member itself), after the member's own session let it go under a server.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::test_support::{config, join, next, prober};
use super::{spawn_session, Event, Request};
use crate::round::Restarts;
use crate::{MemoryStore, Store};

type Link = (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
);

/// A loopback UDP port nothing listens on.
fn closed_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// Sessions a and b of `run` (restart budget 3) on `store` formed into one generation, b's
/// agent probed at `b_port`; a's probe port answers. `server_side`: sessions as a server's
/// (leases renewed by the agents' keep-alives), else as agents' own (`--rdzv-backend etcd`).
async fn pair(
    run: &str,
    store: &Arc<dyn Store>,
    b_port: u16,
    server_side: bool,
) -> (Vec<Link>, u64, tokio::task::JoinHandle<()>) {
    let (a_port, a_task) = prober(run).await;
    let mut links = vec![];
    for (node, port) in [("a", a_port), ("b", b_port)] {
        let mut cfg = config(run, node, 2, 2);
        cfg.max_restarts = 3;
        cfg.auto_keep_alive = !server_side;
        let link = spawn_session(store.clone(), cfg, None);
        if server_side {
            link.0.send(Request::KeepAlive).unwrap();
        }
        let mut j = join(node, 1);
        j.candidate.probe_port = port;
        link.0.send(Request::Join(j, 0)).unwrap();
        links.push(link);
    }
    let g = formed(&mut links).await;
    (links, g, a_task)
}

/// The generation every session of `links` formed.
async fn formed(links: &mut [Link]) -> u64 {
    let mut g = 0;
    for (_, rx) in links.iter_mut() {
        let mut seen = vec![];
        g = next(rx, &mut seen, |e| match e {
            Event::Formed(p) => Some(p.generation),
            _ => None,
        })
        .await
        .unwrap_or_else(|| panic!("formed: {seen:?}"));
    }
    g
}

/// A worker of `link`'s node failed in generation `g` with `description`.
fn fail(link: &Link, g: u64, description: &str) {
    link.0
        .send(Request::Failed {
            generation: g,
            description: description.into(),
            cause: None,
        })
        .unwrap();
}

async fn decision(rx: &mut mpsc::UnboundedReceiver<Event>) -> (bool, Restarts) {
    let mut seen = vec![];
    next(rx, &mut seen, |e| match e {
        Event::FailureDecision {
            restart, restarts, ..
        } => Some((*restart, restarts.clone())),
        _ => None,
    })
    .await
    .unwrap_or_else(|| panic!("a failure decision: {seen:?}"))
}

#[tokio::test]
async fn a_failure_while_every_other_agent_answers_is_the_workers_own_at_once() {
    let run = "own-failure";
    let (b_port, _b) = prober(run).await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (mut links, g, _a) = pair(run, &store, b_port, false).await;
    let t0 = Instant::now();
    fail(&links[0], g, "rank 0 exited with 1");
    let (restart, restarts) = decision(&mut links[0].1).await;
    let took = t0.elapsed();
    assert!(restart);
    assert_eq!((restarts.failures, restarts.membership), (1, 0), "spent");
    assert!(
        took < crate::decisions::loss::ATTRIBUTION_WINDOW / 2,
        "decided without waiting out the window: {took:?}"
    );
}

/// Under a server, the failing member's session does not drop a gone peer itself (the lease
/// on its keys is the server's carrier, shared by every agent): the failure waits for the peer's
/// own session to let it go, and is that loss's doing.
#[tokio::test]
async fn under_a_server_a_failure_while_a_member_is_gone_waits_for_its_loss_and_spends_nothing() {
    let run = "lost-member";
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (mut links, g, _a) = pair(run, &store, closed_port(), true).await;
    let t0 = Instant::now();
    fail(&links[0], g, "rank 0: Connection reset by peer");
    // b's process is gone (its port is closed); its lease goes a moment later.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let state = crate::store::run_state::RunState::new(store.clone(), run);
    assert!(
        state.is_member(g, "b").await.unwrap(),
        "a's session left b's membership to b's own session"
    );
    links[1].0.send(Request::Leave).unwrap();
    let (restart, restarts) = decision(&mut links[0].1).await;
    assert!(restart);
    assert_eq!(
        (restarts.failures, restarts.membership),
        (0, 1),
        "the loss's doing"
    );
    assert!(t0.elapsed() >= Duration::from_millis(600));
}

/// Where each agent's session holds its own lease (`--rdzv-backend etcd`), nothing would
/// notice a dead agent before its lease expires (30 s here): the failing member's session
/// knocks, b's host refuses, and a's session drops b itself — records why, revokes b's lease —
/// and the failure is a membership restart at once, not a spent restart after the window.
#[tokio::test]
async fn with_own_leases_a_failure_drops_a_member_whose_agent_is_gone_at_once() {
    let run = "gone-member";
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (mut links, g, _a) = pair(run, &store, closed_port(), false).await;
    let t0 = Instant::now();
    fail(&links[0], g, "rank 0: Connection reset by peer");
    let (restart, restarts) = decision(&mut links[0].1).await;
    let took = t0.elapsed();
    assert!(restart);
    assert_eq!(
        (restarts.failures, restarts.membership),
        (0, 1),
        "the loss's doing, nothing spent"
    );
    assert!(
        took < crate::decisions::loss::ATTRIBUTION_WINDOW,
        "decided without waiting out the window: {took:?}"
    );
    let state = crate::store::run_state::RunState::new(store.clone(), run);
    assert!(
        !state.is_member(g, "b").await.unwrap(),
        "b's lease was revoked"
    );
    assert_eq!(
        state.lost("b").await.unwrap(),
        crate::decisions::loss::AGENT_GONE
    );
    let closed = state.closed(g).await.unwrap().unwrap_or_default();
    assert!(
        closed.starts_with("node b (127.0.0.1, rank 1) lost: its agent's process is gone"),
        "{closed}"
    );
}

/// An agent that leaves because the run ended is no loss: its lease is left to expire and no
/// "left" is recorded, so a member still attributing a worker failure does not blame it (a
/// user saw the survivors' summary name a node whose agent had only exited after the end).
#[tokio::test]
async fn a_leave_after_the_runs_end_records_no_loss_and_keeps_the_membership() {
    let run = "left-after-end";
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut links = vec![];
    for node in ["a", "b"] {
        let link = spawn_session(store.clone(), config(run, node, 2, 2), None);
        link.0.send(Request::Join(join(node, 1), 0)).unwrap();
        links.push(link);
    }
    let g = formed(&mut links).await;
    let state = crate::store::run_state::RunState::new(store.clone(), run);
    let end = crate::RunEnd {
        success: false,
        reason: "rank 1 failed; restart budget spent".into(),
        at_ms: crate::clock::now_ms(),
        root_cause: None,
        retryable: false,
        unfit: false,
    };
    assert!(state.end(&end).await.unwrap());
    let (tx, rx) = &mut links[1];
    let mut seen = vec![];
    next(rx, &mut seen, |e| {
        matches!(e, Event::Finished(_)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("b hears the end: {seen:?}"));
    tx.send(Request::Leave).unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while rx.recv().await.is_some() {}
    })
    .await;
    assert!(closed.is_ok(), "b's session ends with its leave");
    assert!(
        state.is_member(g, "b").await.unwrap(),
        "b's membership stays until its lease expires"
    );
    assert_ne!(state.lost("b").await.unwrap(), crate::decisions::loss::LEFT);
}
