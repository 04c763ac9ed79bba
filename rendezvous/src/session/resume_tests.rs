//! A session resumed on another server (the agent reconnected) with a join still pending.

use super::test_support::{config, join as join_of, next};
use super::*;
use crate::store::LeaseId;
use crate::{Join, MemoryStore, Plan};

fn cfg(node: &str) -> SessionConfig {
    config("resume", node, 2, 2)
}

fn join(node: &str) -> Join {
    join_of(node, 1)
}

fn opened(ev: &Event) -> Option<LeaseId> {
    match ev {
        Event::Opened { lease } => Some(*lease),
        _ => None,
    }
}

/// What agent `a` resumes with when it never heard of a plan: its lease and its join.
fn still_waiting(lease: LeaseId) -> Resume {
    Resume {
        lease,
        generation: 0,
        waiting: Some(join("a")),
    }
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
    let lease = next(&mut a_rx, &mut seen, opened).await.expect("a's lease");
    let plan = next(&mut b_rx, &mut seen, formed).await.expect("b formed");
    // `a`'s session wrote the membership; its Formed never reaches the agent: the server is gone.
    next(&mut a_rx, &mut seen, formed).await.expect("a formed");
    drop((a_tx, a_rx));
    let (_a2_tx, mut a2_rx) = spawn_session(store.clone(), cfg("a"), Some(still_waiting(lease)));
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
    let lease = next(&mut a_rx, &mut seen, opened).await.expect("a's lease");
    drop((a_tx, a_rx));
    let (_a2_tx, mut a2_rx) = spawn_session(store.clone(), cfg("a"), Some(still_waiting(lease)));
    let (b_tx, mut b_rx) = spawn_session(store.clone(), cfg("b"), None);
    b_tx.send(Request::Join(join("b"), 0)).unwrap();
    let a = next(&mut a2_rx, &mut seen, formed).await.expect("a formed");
    let b = next(&mut b_rx, &mut seen, formed).await.expect("b formed");
    assert_eq!((a.generation, a), (1, b), "events: {seen:?}");
}
