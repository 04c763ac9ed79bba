//! Tests of `Round` on the in-memory store.

use std::time::Duration;

use super::*;
use crate::Candidate;
use crate::MemoryStore;

fn cand(id: &str, port: u16) -> Candidate {
    Candidate {
        node_id: id.into(),
        advertise_addr: "127.0.0.1".into(),
        slots: 2,
        requested_node_rank: None,
        master_port: port,
        probe_port: 0,
    }
}

/// Two nodes exactly, formed as soon as both joined.
fn two_nodes() -> RoundConfig {
    RoundConfig {
        min_nodes: 2,
        max_nodes: 2,
        last_call: Duration::ZERO,
        join_timeout: Duration::from_secs(30),
        settle: Duration::ZERO,
    }
}

#[tokio::test]
async fn single_node_generations_increase_and_carry_restarts() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let round = Round::new(store.clone(), "job", RoundConfig::single_node());
    let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    round.join(&cand("n0", 4000).into(), lease).await.unwrap();
    let p1 = round.wait_for_plan("n0", 0, lease, |_| {}).await.unwrap();
    assert_eq!((p1.generation, p1.world_size, p1.master_port), (1, 2, 4000));
    assert!(
        store
            .get("/drun/v1/job/gen/current.leader")
            .await
            .unwrap()
            .is_none(),
        "formation clears the decider key for the next round"
    );

    let r = round.record_restart(RestartCause::Failure).await.unwrap();
    assert_eq!(
        r,
        Restarts {
            failures: 1,
            membership: 0,
            history: vec![]
        }
    );
    round.join(&cand("n0", 4001).into(), lease).await.unwrap();
    let p2 = round.wait_for_plan("n0", 1, lease, |_| {}).await.unwrap();
    assert_eq!(
        (p2.generation, p2.master_port, p2.restarts_failures),
        (2, 4001, 1)
    );
    assert_eq!(round.current_generation().await.unwrap().0, 2);
}

#[tokio::test]
async fn two_participants_agree_on_one_plan() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let cfg = two_nodes();
    let a = Round::new(store.clone(), "job", cfg);
    let b = Round::new(store.clone(), "job", cfg);
    let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    a.join(&cand("a", 1).into(), lease).await.unwrap();
    let wait_a = tokio::spawn(async move { a.wait_for_plan("a", 0, lease, |_| {}).await });
    let lease2 = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    b.join(&cand("b", 2).into(), lease2).await.unwrap();
    let pb = b.wait_for_plan("b", 0, lease2, |_| {}).await.unwrap();
    let pa = wait_a.await.unwrap().unwrap();
    assert_eq!(pa, pb);
    assert_eq!(pa.generation, 1);
    assert_eq!(pa.members[0].node_id, "a");
}

#[tokio::test]
async fn a_node_that_finds_the_wiped_store_already_formed_from_its_join_takes_that_generation() {
    // Both nodes ran generation 1; etcd came back without its data. Node a found the store at
    // generation 0 first and formed generation 1 again, from both joins; node b only starts
    // waiting now, with the store at 1 again: the number it ran before.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let cfg = two_nodes();
    let (a, b) = (
        Round::new(store.clone(), "job", cfg),
        Round::new(store.clone(), "job", cfg),
    );
    let (la, lb) = (
        store.lease_grant(Duration::from_secs(10)).await.unwrap(),
        store.lease_grant(Duration::from_secs(10)).await.unwrap(),
    );
    a.join(&cand("a", 1).into(), la).await.unwrap();
    b.join(&cand("b", 2).into(), lb).await.unwrap();
    let pa = a.wait_for_plan("a", 1, la, |_| {}).await.unwrap();
    assert_eq!(pa.generation, 1, "formed anew from generation 0");
    let pb = tokio::time::timeout(Duration::from_secs(5), b.wait_for_plan("b", 1, lb, |_| {}))
        .await
        .expect("b takes the generation formed from its join, not waits for a second one")
        .unwrap();
    assert_eq!(pb, pa);
}

#[tokio::test]
async fn a_generation_formed_before_a_join_is_not_taken_by_it() {
    // b ran generation 1 and joins again: the plan of 1 (it is in it) is not its next one.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let round = Round::new(store.clone(), "job", RoundConfig::single_node());
    let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    round.join(&cand("b", 1).into(), lease).await.unwrap();
    assert_eq!(
        round
            .wait_for_plan("b", 0, lease, |_| {})
            .await
            .unwrap()
            .generation,
        1
    );
    round.join(&cand("b", 2).into(), lease).await.unwrap();
    let p = round.wait_for_plan("b", 1, lease, |_| {}).await.unwrap();
    assert_eq!(
        (p.generation, p.master_port),
        (2, 2),
        "a new generation from the new join"
    );
}

#[tokio::test(start_paused = true)]
async fn join_timeout_reports_who_came() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let cfg = RoundConfig {
        min_nodes: 2,
        max_nodes: 2,
        last_call: Duration::ZERO,
        join_timeout: Duration::from_secs(5),
        settle: Duration::ZERO,
    };
    let round = Round::new(store.clone(), "job", cfg);
    let lease = store.lease_grant(Duration::from_secs(100)).await.unwrap();
    round.join(&cand("lonely", 1).into(), lease).await.unwrap();
    let mut seen = vec![];
    let err = round
        .wait_for_plan("lonely", 0, lease, |r| seen.push(r.to_string()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RendezvousError::Timeout {
                joined: 1,
                min: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("lonely"), "{err}");
    assert!(
        seen[0].contains("waiting for 1 more node (1/2)"),
        "{seen:?}"
    );
}

/// Two participants in a round that fails: the decider's verdict is published and the
/// follower ends with the same line, long before its own deadline.
async fn both_fail_alike(cfg: RoundConfig, b_slots: u32) -> (RendezvousError, RendezvousError) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = Round::new(store.clone(), "job", cfg);
    let b = Round::new(store.clone(), "job", cfg);
    let la = store.lease_grant(Duration::from_secs(100)).await.unwrap();
    let lb = store.lease_grant(Duration::from_secs(100)).await.unwrap();
    a.join(&cand("a", 1).into(), la).await.unwrap();
    let wait_a = tokio::spawn(async move { a.wait_for_plan("a", 0, la, |_| {}).await });
    // b joins once a is the decider.
    while store
        .get("/drun/v1/job/gen/current.leader")
        .await
        .unwrap()
        .is_none()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.join(
        &Candidate {
            slots: b_slots,
            ..cand("b", 2)
        }
        .into(),
        lb,
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    let eb = b.wait_for_plan("b", 0, lb, |_| {}).await.unwrap_err();
    assert!(
        t0.elapsed() < cfg.join_timeout + FOLLOWER_GRACE,
        "the follower heard the verdict before its own deadline"
    );
    let ea = wait_a.await.unwrap().unwrap_err();
    assert_eq!(ea.to_string(), eb.to_string(), "one line on every node");
    assert!(
        matches!(eb, RendezvousError::RoundFailed(_)),
        "the follower reports the decider's verdict: {eb:?}"
    );
    // The verdict was for that round only: a node joining afterwards forms a new one, and
    // the formation clears the record.
    let one = RoundConfig {
        min_nodes: 1,
        max_nodes: 1,
        last_call: Duration::ZERO,
        join_timeout: Duration::from_secs(5),
        settle: Duration::ZERO,
    };
    let c = Round::new(store.clone(), "job", one);
    let lc = store.lease_grant(Duration::from_secs(100)).await.unwrap();
    store.lease_revoke(la).await.unwrap();
    store.lease_revoke(lb).await.unwrap();
    c.join(&cand("a", 3).into(), lc).await.unwrap();
    let plan = c.wait_for_plan("a", 0, lc, |_| {}).await.unwrap();
    assert_eq!(plan.generation, 1);
    assert!(store
        .get("/drun/v1/job/gen/current.failed")
        .await
        .unwrap()
        .is_none());
    (ea, eb)
}

#[tokio::test(start_paused = true)]
async fn a_join_timeout_ends_every_waiting_node_with_the_same_line() {
    let cfg = RoundConfig {
        min_nodes: 3,
        max_nodes: 3,
        last_call: Duration::ZERO,
        join_timeout: Duration::from_secs(5),
        settle: Duration::ZERO,
    };
    let (ea, _) = both_fail_alike(cfg, 2).await;
    assert!(
        matches!(
            ea,
            RendezvousError::Timeout {
                joined: 2,
                min: 3,
                ..
            }
        ),
        "{ea:?}"
    );
    assert!(ea.to_string().contains("only 2 of min 3"), "{ea}");
}

#[tokio::test(start_paused = true)]
async fn an_unformable_set_ends_every_waiting_node_with_the_same_line() {
    let cfg = RoundConfig {
        min_nodes: 2,
        max_nodes: 2,
        last_call: Duration::ZERO,
        join_timeout: Duration::from_secs(600),
        settle: Duration::ZERO,
    };
    let (ea, _) = both_fail_alike(cfg, 0).await;
    assert!(matches!(ea, RendezvousError::Unformable { .. }), "{ea:?}");
    assert!(
        ea.to_string().contains("node b offers no worker slots"),
        "{ea}"
    );
}

#[tokio::test]
async fn a_rejoin_replaces_the_old_membership_in_one_revision() {
    // The decider reads the members of g, then the waiting set: a survivor must never be in
    // neither, or a re-form could close without it.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let round = Round::new(store.clone(), "job", RoundConfig::single_node());
    let keys = round.keys().clone();
    let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    store
        .put(&keys.member(1, "n0"), b"{}".to_vec(), Some(lease))
        .await
        .unwrap();
    let mut w = store.watch_prefix(keys.prefix(), 0).await.unwrap();
    round
        .rejoin(&cand("n0", 4000).into(), lease, 1)
        .await
        .unwrap();
    let (a, b) = (w.recv().await.unwrap(), w.recv().await.unwrap());
    let rev = |ev: &WatchEvent| match ev {
        WatchEvent::Put(kv) => (kv.key.clone(), kv.mod_revision),
        WatchEvent::Delete(k, r) => (k.clone(), *r),
    };
    let ((ka, ra), (kb, rb)) = (rev(&a), rev(&b));
    assert_eq!(ra, rb, "{ka} and {kb} in one transaction");
    assert!(store.get(&keys.member(1, "n0")).await.unwrap().is_none());
    assert!(store.get(&keys.waiting("n0")).await.unwrap().is_some());
}

/// Chaos seed 1044 (memory) and 2003 (etcd): a lone node fenced past its lease, whose world no
/// one was left to close, joins again as a newcomer (a new session, `after` 0). The plan of its
/// old world still names it; it must form the next generation, not rejoin the old one.
#[tokio::test]
async fn a_lone_node_fenced_past_its_lease_forms_a_newer_generation() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let round = Round::new(store.clone(), "job", RoundConfig::single_node());
    let old = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    round.join(&cand("n0", 4000).into(), old).await.unwrap();
    let p1 = round.wait_for_plan("n0", 0, old, |_| {}).await.unwrap();
    assert_eq!(p1.generation, 1);
    // The lease runs out (the agent was stopped): nothing closes generation 1.
    store.lease_revoke(old).await.unwrap();
    assert_eq!(round.current_generation().await.unwrap().0, 1);

    let new = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    round.join(&cand("n0", 4001).into(), new).await.unwrap();
    let p2 = round.wait_for_plan("n0", 0, new, |_| {}).await.unwrap();
    assert_eq!((p2.generation, p2.master_port), (2, 4001));
}

/// Chaos seed 1159 (etcd): a node's session is lost with the server just as the plan that
/// admits it is written; on reconnect it sends its join again on the same lease. That plan is
/// still its world: it must take it, not stand by beside it (its peers would wait for it).
#[tokio::test]
async fn a_join_sent_again_on_the_same_lease_still_takes_the_plan_formed_from_it() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let round = Round::new(store.clone(), "job", RoundConfig::single_node());
    let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    let join: Join = cand("n0", 4000).into();
    round.join(&join, lease).await.unwrap();
    let p1 = round.wait_for_plan("n0", 0, lease, |_| {}).await.unwrap();
    // The agent never saw p1; after the reconnect its session sends the same join again.
    round.join(&join, lease).await.unwrap();
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        round.wait_for_plan("n0", 0, lease, |_| {}),
    )
    .await
    .expect("the plan formed from the join is found at once")
    .unwrap();
    assert_eq!(again, p1);
}
