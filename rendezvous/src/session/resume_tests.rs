//! A session resumed on another server (the agent reconnected) with a join still pending.

use std::time::Duration;

use tokio::sync::mpsc;

use super::*;
use crate::{Candidate, Join, MemoryStore, Plan, RoundConfig};

fn cfg(node: &str) -> SessionConfig {
    SessionConfig {
        run_id: "resume".into(),
        node_id: node.into(),
        round: RoundConfig {
            min_nodes: 2,
            max_nodes: 2,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(60),
            settle: Duration::ZERO,
        },
        lease_ttl: Duration::from_secs(30),
        keep_alive_interval: Duration::from_secs(10),
        max_restarts: 0,
        auto_keep_alive: true,
        scale_up_save: None,
        ckpt_interval: Default::default(),
    }
}

fn join(node: &str) -> Join {
    Candidate {
        node_id: node.into(),
        advertise_addr: "127.0.0.1".into(),
        slots: 1,
        requested_node_rank: None,
        master_port: 1,
    }
    .into()
}

/// The next event `pick` accepts within 5 s; every event seen on the way is appended to
/// `seen`, so a failure names what the session said instead.
async fn next<T>(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    seen: &mut Vec<String>,
    pick: impl Fn(&Event) -> Option<T>,
) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(ev) = rx.recv().await {
            if let Some(t) = pick(&ev) {
                return Some(t);
            }
            seen.push(format!("{ev:?}"));
        }
        None
    })
    .await
    .ok()
    .flatten()
}

fn formed(ev: &Event) -> Option<Plan> {
    match ev {
        Event::Formed(p) => Some(p.clone()),
        _ => None,
    }
}

/// Chaos seed 1159 (etcd), found again by CI: the plan admitting node `a` was written and its
/// session wrote `a`'s membership (deleting its join), then the server stopped before `a`
/// heard of it. `a` reconnected still waiting; the new session joined it again, the fresh
/// join was newer than the plan, and `a` stood by beside the world it belonged to, which
/// waited for it forever.
#[tokio::test]
async fn a_node_admitted_while_its_server_was_away_runs_the_plan_it_was_admitted_to() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a_tx, mut a_rx) = spawn_session(store.clone(), cfg("a"), None);
    let (b_tx, mut b_rx) = spawn_session(store.clone(), cfg("b"), None);
    a_tx.send(Request::Join(join("a"), 0)).unwrap();
    b_tx.send(Request::Join(join("b"), 0)).unwrap();
    let mut seen = Vec::new();
    let lease = next(&mut a_rx, &mut seen, |ev| match ev {
        Event::Opened { lease } => Some(*lease),
        _ => None,
    })
    .await
    .expect("a's lease");
    let plan = next(&mut b_rx, &mut seen, formed).await.expect("b formed");
    // `a`'s session wrote the membership; its Formed never reaches the agent: the server is gone.
    next(&mut a_rx, &mut seen, formed).await.expect("a formed");
    drop((a_tx, a_rx));
    let resume = Resume {
        lease,
        generation: 0,
        waiting: Some(join("a")),
    };
    let (_a2_tx, mut a2_rx) = spawn_session(store.clone(), cfg("a"), Some(resume));
    let got = next(&mut a2_rx, &mut seen, formed).await;
    assert_eq!(got, Some(plan), "events: {seen:?}");
}

/// A node that reconnects while waiting, before any plan admitted it, waits on and is
/// admitted with the next arrival.
#[tokio::test]
async fn a_node_resumed_while_still_waiting_is_admitted_when_the_round_completes() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a_tx, mut a_rx) = spawn_session(store.clone(), cfg("a"), None);
    a_tx.send(Request::Join(join("a"), 0)).unwrap();
    let mut seen = Vec::new();
    let lease = next(&mut a_rx, &mut seen, |ev| match ev {
        Event::Opened { lease } => Some(*lease),
        _ => None,
    })
    .await
    .expect("a's lease");
    drop((a_tx, a_rx));
    let resume = Resume {
        lease,
        generation: 0,
        waiting: Some(join("a")),
    };
    let (_a2_tx, mut a2_rx) = spawn_session(store.clone(), cfg("a"), Some(resume));
    let (b_tx, mut b_rx) = spawn_session(store.clone(), cfg("b"), None);
    b_tx.send(Request::Join(join("b"), 0)).unwrap();
    let a = next(&mut a2_rx, &mut seen, formed).await.expect("a formed");
    let b = next(&mut b_rx, &mut seen, formed).await.expect("b formed");
    assert_eq!((a.generation, a), (1, b), "events: {seen:?}");
}
