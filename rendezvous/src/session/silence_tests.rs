//! The silence rule through real sessions on the memory store: a node its peers do not hear is
//! given up when its agent does not answer the ping, and kept when it does.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::test_support::{config, join, next};
use super::{spawn_session, Event, Request};
use crate::store::reports::ReportKind;
use crate::{MemoryStore, Plan, Store};

type Link = (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
);

/// Three sessions of run `run` formed into one generation of 3 nodes: their links and the plan.
async fn three(run: &str) -> (Vec<Link>, Plan) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut links: Vec<Link> = ["a", "b", "c"]
        .iter()
        .map(|n| spawn_session(store.clone(), config(run, n, 2, 3), None))
        .collect();
    for ((tx, _), n) in links.iter().zip(["a", "b", "c"]) {
        tx.send(Request::Join(join(n, 1), 0)).unwrap();
    }
    let mut plan = None;
    for (_, rx) in links.iter_mut() {
        let mut seen = vec![];
        plan = next(rx, &mut seen, |e| match e {
            Event::Formed(p) => Some(p.clone()),
            _ => None,
        })
        .await;
        assert!(plan.is_some(), "formed: {seen:?}");
    }
    (links, plan.unwrap())
}

/// The peers report of the node with `from` in `plan` naming `silent` (node ids).
fn peers_report(plan: &Plan, silent: &[&str]) -> Request {
    let ranks: Vec<u32> = silent
        .iter()
        .map(|id| plan.member(id).expect("a member").node_rank)
        .collect();
    Request::Report {
        kind: ReportKind::Peers,
        json: serde_json::json!({
            "generation": plan.generation,
            "node_rank": 0,
            "silent": ranks,
        })
        .to_string(),
    }
}

#[tokio::test]
async fn a_node_nobody_hears_is_given_up_and_the_others_reform_at_once() {
    let (mut links, plan) = three("silent-gone").await;
    // b and c cannot hear a; a's agent (the test) never answers the ping.
    let t0 = tokio::time::Instant::now();
    links[1].0.send(peers_report(&plan, &["a"])).unwrap();
    pinged(&mut links[0].1).await;
    let mut seen = vec![];
    let fenced = next(&mut links[0].1, &mut seen, |e| match e {
        Event::Fenced(why) => Some(why.clone()),
        _ => None,
    })
    .await
    .expect("a is given up");
    assert!(
        fenced.contains("neither its peers (b) nor the rendezvous server hear it"),
        "{fenced}"
    );
    for i in [1, 2] {
        let mut seen = vec![];
        let reason = next(&mut links[i].1, &mut seen, |e| match e {
            Event::Reform { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .await
        .expect("the others re-form");
        assert!(reason.contains("node a"), "{reason}");
    }
    let took = t0.elapsed();
    assert!(
        took >= super::silence::PING_WAIT,
        "given up only after the wait: {took:?}"
    );
    assert!(
        took < super::silence::PING_WAIT + Duration::from_secs(2),
        "{took:?}"
    );
}

#[tokio::test]
async fn an_accused_node_whose_agent_answers_stays_and_nothing_reforms() {
    let (mut links, plan) = three("silent-answers").await;
    links[1].0.send(peers_report(&plan, &["a"])).unwrap();
    pinged(&mut links[0].1).await;
    // The agent answers as the launcher's link does: a keep-alive at once.
    links[0].0.send(Request::KeepAlive).unwrap();
    let quiet = tokio::time::timeout(super::silence::PING_WAIT * 4, async {
        loop {
            match links[0].1.recv().await {
                Some(e @ (Event::Fenced(_) | Event::Reform { .. })) => return e,
                Some(_) => {}
                None => std::future::pending().await,
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "a answered and stays: {quiet:?}");
    // Withdrawn, and accused again later: asked again.
    links[1].0.send(peers_report(&plan, &[])).unwrap();
    links[1].0.send(peers_report(&plan, &["a"])).unwrap();
    pinged(&mut links[0].1).await;
}

/// Waits for the session to ask its agent to answer (a ping); fails naming what came instead.
async fn pinged(rx: &mut mpsc::UnboundedReceiver<Event>) {
    let mut seen = vec![];
    let ping = next(rx, &mut seen, |e| matches!(e, Event::Ping).then_some(())).await;
    assert!(ping.is_some(), "the agent is asked: {seen:?}");
}
