//! The environment check through a real round on the in-memory store: a warning table in every
//! member's plan, or one refusal line on every waiting node.

use std::time::Duration;

use super::*;
use crate::decisions::envcheck::{is_refusal, EnvCheck, Fingerprint};
use crate::{Candidate, Join, MemoryStore};

fn join(id: &str, torch: &str, check: EnvCheck) -> Join {
    let fingerprint: Fingerprint = [
        ("config.nnodes".to_string(), "2:2".to_string()),
        ("torch".to_string(), torch.to_string()),
    ]
    .into();
    Join {
        candidate: Candidate {
            node_id: id.into(),
            advertise_addr: "127.0.0.1".into(),
            slots: 1,
            requested_node_rank: None,
            master_port: 1000,
            probe_port: 0,
        },
        resume_hint: None,
        fingerprint,
        env_check: Some(check),
        held: Vec::new(),
    }
}

fn two() -> RoundConfig {
    RoundConfig {
        min_nodes: 2,
        max_nodes: 2,
        last_call: Duration::ZERO,
        join_timeout: Duration::from_secs(600),
        settle: Duration::ZERO,
    }
}

/// Both nodes join and wait; their results.
async fn form(a: Join, b: Join) -> (Result<Plan, RendezvousError>, Result<Plan, RendezvousError>) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (ra, rb) = (
        Round::new(store.clone(), "job", two()),
        Round::new(store.clone(), "job", two()),
    );
    let la = store.lease_grant(Duration::from_secs(100)).await.unwrap();
    let lb = store.lease_grant(Duration::from_secs(100)).await.unwrap();
    ra.join(&a, la).await.unwrap();
    rb.join(&b, lb).await.unwrap();
    let wa = tokio::spawn(async move { ra.wait_for_plan("a", 0, la, |_| {}).await });
    let pb = rb.wait_for_plan("b", 0, lb, |_| {}).await;
    (wa.await.unwrap(), pb)
}

#[tokio::test(start_paused = true)]
async fn warn_forms_with_one_table_in_every_members_plan() {
    let (a, b) = form(
        join("a", "2.4.0", EnvCheck::Warn),
        join("b", "2.3.1", EnvCheck::Warn),
    )
    .await;
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    let tables: Vec<&String> = a.notes.iter().filter(|n| n.contains("differ")).collect();
    assert_eq!(tables.len(), 1, "{:?}", a.notes);
    assert!(tables[0].contains("torch") && tables[0].contains("2.3.1"));
}

#[tokio::test(start_paused = true)]
async fn strict_on_one_node_refuses_on_every_node_with_the_same_line() {
    let (a, b) = form(
        join("a", "2.4.0", EnvCheck::Warn),
        join("b", "2.3.1", EnvCheck::Strict),
    )
    .await;
    let (ea, eb) = (a.unwrap_err().to_string(), b.unwrap_err().to_string());
    assert_eq!(ea, eb);
    assert!(is_refusal(&ea), "{ea}");
    assert!(ea.contains("torch (2.3.1 on b; 2.4.0 on a)"), "{ea}");
}

#[tokio::test(start_paused = true)]
async fn different_nnodes_are_refused_even_when_both_say_off() {
    let mut b = join("b", "2.4.0", EnvCheck::Off);
    b.fingerprint.insert("config.nnodes".into(), "1:2".into());
    let (a, b) = form(join("a", "2.4.0", EnvCheck::Off), b).await;
    let ea = a.unwrap_err().to_string();
    assert!(is_refusal(&ea) && ea.contains("config.nnodes"), "{ea}");
    assert_eq!(ea, b.unwrap_err().to_string());
}

#[tokio::test(start_paused = true)]
async fn the_fingerprint_survives_the_wire() {
    let j = join("a", "2.4.0", EnvCheck::Strict);
    let back: Join = drun_proto::v1::Candidate::from(&j).into();
    assert_eq!(back, j);
    // An older agent's candidate: no fingerprint, no setting.
    let old = drun_proto::v1::Candidate {
        node_id: "old".into(),
        ..Default::default()
    };
    let back: Join = old.into();
    assert!(back.fingerprint.is_empty() && back.env_check.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_refused_newcomer_of_a_re_form_is_turned_away_and_the_job_re_forms_without_it() {
    let cfg = RoundConfig {
        max_nodes: 3,
        ..two()
    };
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let round = |_: &str| Round::new(store.clone(), "job", cfg);
    let lease = || store.lease_grant(Duration::from_secs(100));
    let (la, lb, lc) = (
        lease().await.unwrap(),
        lease().await.unwrap(),
        lease().await.unwrap(),
    );
    let (a, b) = (
        join("a", "2.4.0", EnvCheck::Strict),
        join("b", "2.4.0", EnvCheck::Strict),
    );
    round("a").join(&a, la).await.unwrap();
    round("b").join(&b, lb).await.unwrap();
    let (ra, rb) = (round("a"), round("b"));
    let wa = tokio::spawn(async move { ra.wait_for_plan("a", 0, la, |_| {}).await });
    let g1 = round("b").wait_for_plan("b", 0, lb, |_| {}).await.unwrap();
    assert_eq!(wa.await.unwrap().unwrap().generation, 1);
    // Generation 1 closes; a newcomer with another torch joins with the members.
    store
        .put("/drun/v1/job/gen/1/closed", b"x".to_vec(), None)
        .await
        .unwrap();
    round("c")
        .join(&join("c", "2.3.1", EnvCheck::Warn), lc)
        .await
        .unwrap();
    round("a").join(&a, la).await.unwrap();
    round("b").join(&b, lb).await.unwrap();
    let (ra, rb2) = (round("a"), round("b"));
    let wa = tokio::spawn(async move { ra.wait_for_plan("a", 1, la, |_| {}).await });
    let wb = tokio::spawn(async move { rb2.wait_for_plan("b", 1, lb, |_| {}).await });
    let ec = rb.wait_for_plan("c", 0, lc, |_| {}).await.unwrap_err();
    let ec = ec.to_string();
    assert!(is_refusal(&ec), "{ec}");
    assert!(ec.contains("torch (2.3.1 on c; 2.4.0 on a, b)"), "{ec}");
    // The refused agent leaves (exit 2): its lease goes, and the members form without it.
    store.lease_revoke(lc).await.unwrap();
    let (pa, pb) = (wa.await.unwrap().unwrap(), wb.await.unwrap().unwrap());
    assert_eq!(pa, pb);
    assert_eq!(pa.generation, g1.generation + 1);
    let ids: Vec<&str> = pa.members.iter().map(|m| m.node_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
}
