//! Tests of [`super::node_states`] and of reading a status from a store.

use std::collections::BTreeMap;

use super::*;
use crate::{assign, Candidate, MemoryStore};

fn plan(g: u64, ids: &[&str]) -> Plan {
    let c: Vec<Candidate> = ids
        .iter()
        .map(|id| Candidate {
            node_id: id.to_string(),
            advertise_addr: format!("10.0.0.{}", id.len()),
            slots: 2,
            requested_node_rank: None,
            master_port: 1,
            probe_port: 0,
        })
        .collect();
    assign("r", g, &c, 0, 0).unwrap()
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn members_standbys_and_the_lost_each_get_a_state() {
    let now = plan(2, &["a", "b"]);
    let before = plan(1, &["a", "b", "c", "d"]);
    let present = ids(&["a"]);
    let waiting = vec![
        ("b".to_string(), "h".to_string()),
        ("s".into(), "hs".into()),
    ];
    let mut lost = BTreeMap::new();
    lost.insert("c".to_string(), loss::CONNECTION_CLOSED.to_string());
    lost.insert("d".to_string(), loss::LEFT.to_string());
    let facts = NodeFacts {
        present,
        done: vec![],
        waiting,
        lost,
        ended: false,
        forming: false,
    };
    let got = node_states(Some(&now), Some(&before), &facts);
    let states: Vec<(&str, NodeState)> = got.iter().map(|n| (n.node.as_str(), n.state)).collect();
    assert_eq!(
        states,
        [
            ("a", NodeState::Running),
            ("b", NodeState::Joining),
            ("s", NodeState::Standby),
            ("c", NodeState::Lost),
            ("d", NodeState::Left),
        ]
    );
    assert_eq!(got[1].ranks, Some((2, 3)));
    assert_eq!(got[1].node_rank, Some(1));
    assert_eq!(got[3].why.as_deref(), Some(loss::CONNECTION_CLOSED));
    assert_eq!(got[2].ranks, None);
}

/// Before the first generation (or while one re-forms) the nodes that wait are joining the
/// round, not standing by beside a running group (a user saw both nodes of a forming `2:3`
/// job shown as standbys).
#[test]
fn nodes_waiting_while_no_generation_runs_are_joining_not_standbys() {
    let waiting = vec![
        ("a".to_string(), "ha".to_string()),
        ("b".to_string(), "hb".to_string()),
    ];
    let facts = NodeFacts {
        waiting: waiting.clone(),
        forming: true,
        ..Default::default()
    };
    let got = node_states(None, None, &facts);
    let states: Vec<NodeState> = got.iter().map(|n| n.state).collect();
    assert_eq!(states, [NodeState::Joining, NodeState::Joining]);
    // Beside a running generation the same wait is a standby's.
    let facts = NodeFacts {
        present: ids(&["m"]),
        waiting,
        ..Default::default()
    };
    let got = node_states(Some(&plan(1, &["m"])), None, &facts);
    let states: Vec<NodeState> = got.iter().map(|n| n.state).collect();
    assert_eq!(
        states,
        [NodeState::Running, NodeState::Standby, NodeState::Standby]
    );
}

#[test]
fn a_member_without_membership_or_reason_lost_its_lease() {
    let p = plan(1, &["a"]);
    let got = node_states(Some(&p), None, &NodeFacts::default());
    assert_eq!(got[0].state, NodeState::Lost);
    assert_eq!(got[0].why.as_deref(), Some(loss::LEASE_EXPIRED));
}

#[test]
fn an_ended_run_shows_done_and_ended_members_not_lost_ones() {
    let p = plan(3, &["a", "b"]);
    let done = ids(&["a"]);
    let facts = NodeFacts {
        done,
        ended: true,
        ..Default::default()
    };
    let got = node_states(Some(&p), Some(&plan(2, &["a", "b", "c"])), &facts);
    let states: Vec<NodeState> = got.iter().map(|n| n.state).collect();
    assert_eq!(states, [NodeState::Done, NodeState::Ended]);
}

#[test]
fn an_ended_run_keeps_the_reason_a_member_was_dropped_for() {
    let p = plan(3, &["a", "b", "c"]);
    let facts = NodeFacts {
        done: ids(&["a"]),
        lost: [("b".to_string(), loss::LEASE_EXPIRED.to_string())].into(),
        ended: true,
        ..Default::default()
    };
    let got = node_states(Some(&p), None, &facts);
    let states: Vec<NodeState> = got.iter().map(|n| n.state).collect();
    assert_eq!(states, [NodeState::Done, NodeState::Lost, NodeState::Ended]);
    assert_eq!(got[1].why.as_deref(), Some(loss::LEASE_EXPIRED));
}

#[tokio::test]
async fn an_unknown_run_reads_as_unknown_and_old_json_decodes() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let s = read_status(&store, "nope").await.unwrap();
    assert!(s.is_unknown());
    assert!(s.now_ms > 0);
    // A status from an older server: no nodes, formation or reading time.
    let old: RunStatus = serde_json::from_str(
        r#"{"run":"r","generation":1,"plan":null,"waiting":[],"progress":null,
            "round_failed":null,"restarts":{"failures":1,"membership":0},"finished":null,
            "root_causes":[],"checkpoints":{"latest":null,"sealed":[],"bad":{}}}"#,
    )
    .unwrap();
    assert_eq!(old.restarts.failures, 1);
    assert!(old.nodes.is_empty() && old.formation.is_none());
}

#[tokio::test]
async fn a_formation_is_recorded_with_its_plan_and_a_re_form_counts_lost_work() {
    use std::time::Duration;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let round = Round::new(store.clone(), "job", RoundConfig::single_node());
    let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
    let cand = |port| Candidate {
        node_id: "n0".into(),
        advertise_addr: "127.0.0.1".into(),
        slots: 2,
        requested_node_rank: None,
        master_port: port,
        probe_port: 0,
    };
    round.join(&cand(4000).into(), lease).await.unwrap();
    round.wait_for_plan("n0", 0, lease, |_| {}).await.unwrap();
    let s = read_status(&store, "job").await.unwrap();
    let f = s.formation.expect("generation 1's formation is recorded");
    assert!(f.record.formed_at_ms >= f.record.round_opened_at_ms);
    assert_eq!(f.record.lost_work, None, "a first formation loses nothing");
    assert!(!f.because.is_empty());
    // The node has not written its membership key: it is still joining.
    assert_eq!(s.nodes.len(), 1);
    assert_eq!(s.nodes[0].ranks, Some((0, 1)));

    round.join(&cand(4001).into(), lease).await.unwrap();
    round.wait_for_plan("n0", 1, lease, |_| {}).await.unwrap();
    let s = read_status(&store, "job").await.unwrap();
    assert_eq!(s.generation, 2);
    let lost = s.formation.unwrap().record.lost_work;
    assert_eq!(
        lost.map(|l| l.resume_step),
        Some(None),
        "no checkpoint: from the start"
    );
}
