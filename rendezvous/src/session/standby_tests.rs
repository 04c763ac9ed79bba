//! The stand-by rule through real sessions on the memory store: a node sent away is told whom it
//! must reach — the nodes that run now, not the generation it left — and that the run ended.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::standby::Reach;
use super::test_support::{config, join, next};
use super::{spawn_session, Event, Request, RunEnd};
use crate::store::run_state::RunState;
use crate::{Join, MemoryStore, Store};

type Link = (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
);

/// `node`'s join with a probe port, so it can be reached.
fn probed(node: &str) -> Join {
    let mut j = join(node, 1);
    j.candidate.probe_port = 7000;
    j
}

async fn formed(rx: &mut mpsc::UnboundedReceiver<Event>) -> u64 {
    let mut seen = vec![];
    let g = next(rx, &mut seen, |e| match e {
        Event::Formed(p) => Some(p.generation),
        _ => None,
    })
    .await;
    g.unwrap_or_else(|| panic!("formed: {seen:?}"))
}

async fn told(rx: &mut mpsc::UnboundedReceiver<Event>) -> Vec<String> {
    let mut seen = vec![];
    let reach = next(rx, &mut seen, |e| match e {
        Event::StandBy(r) => Some(r.clone()),
        _ => None,
    })
    .await;
    let reach: Vec<Reach> = reach.unwrap_or_else(|| panic!("a stand-by look: {seen:?}"));
    reach.into_iter().map(|r| r.node_id).collect()
}

#[tokio::test]
async fn a_node_standing_by_waits_for_who_runs_now_not_for_the_generation_it_left() {
    let run = "standby";
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut links: Vec<Link> = ["a", "b", "c"]
        .iter()
        .map(|n| spawn_session(store.clone(), config(run, n, 2, 3), None))
        .collect();
    // a and b form generation 1 without c, which stands by as if sent away from it.
    for (i, n) in ["a", "b"].iter().enumerate() {
        links[i].0.send(Request::Join(probed(n), 0)).unwrap();
    }
    let g = formed(&mut links[0].1).await;
    assert_eq!(formed(&mut links[1].1).await, g);
    links[2].0.send(Request::StandBy(g)).unwrap();
    assert_eq!(told(&mut links[2].1).await, vec!["a", "b"]);
    // A repeat changes nothing and is not answered again.
    links[2].0.send(Request::StandBy(g)).unwrap();

    // b goes for good: a waits alone for the next generation (below MIN), and c is told to
    // reach a only — not b, whom it would wait for forever.
    links[1].0.send(Request::Leave).unwrap();
    let mut seen = vec![];
    assert!(
        next(&mut links[0].1, &mut seen, |e| matches!(
            e,
            Event::Reform { .. }
        )
        .then_some(()))
        .await
        .is_some(),
        "a re-forms: {seen:?}"
    );
    links[0].0.send(Request::Join(probed("a"), g)).unwrap();
    assert_eq!(told(&mut links[2].1).await, vec!["a"]);

    // c reaches a and joins: the two form generation 2.
    links[2].0.send(Request::Join(probed("c"), g)).unwrap();
    let g2 = formed(&mut links[2].1).await;
    assert!(g2 > g);
    assert_eq!(formed(&mut links[0].1).await, g2);
}

#[tokio::test]
async fn a_node_standing_by_hears_that_the_run_ended() {
    let run = "standby-end";
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a_tx, mut a_rx) = spawn_session(store.clone(), config(run, "a", 1, 2), None);
    let (c_tx, mut c_rx) = spawn_session(store.clone(), config(run, "c", 1, 2), None);
    a_tx.send(Request::Join(probed("a"), 0)).unwrap();
    let g = formed(&mut a_rx).await;
    c_tx.send(Request::StandBy(g)).unwrap();
    assert_eq!(told(&mut c_rx).await, vec!["a"]);
    let end = RunEnd {
        success: true,
        reason: "every worker exited 0".into(),
        at_ms: 1,
        root_cause: None,
        retryable: false,
        unfit: false,
    };
    assert!(RunState::new(store.clone(), run).end(&end).await.unwrap());
    let mut seen = vec![];
    let finished = next(&mut c_rx, &mut seen, |e| match e {
        Event::Finished(e) => Some(e.clone()),
        _ => None,
    })
    .await;
    assert_eq!(finished, Some(end), "{seen:?}");
}

#[tokio::test]
async fn nobody_running_tells_the_node_to_join_now() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (c_tx, mut c_rx) = spawn_session(store, config("standby-alone", "c", 1, 2), None);
    c_tx.send(Request::StandBy(1)).unwrap();
    assert!(told(&mut c_rx).await.is_empty());
}
