//! The environment check through a real round on the in-memory store: a warning table in every
//! member's plan, or one refusal line on every waiting node.

use std::time::Duration;

use super::*;
use crate::envcheck::{is_refusal, EnvCheck, Fingerprint};
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
        },
        resume_hint: None,
        fingerprint,
        env_check: Some(check),
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
