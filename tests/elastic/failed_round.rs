//! An agent whose round failed leaves the run with it: a node arriving right after it exited
//! forms no group with it (its waiting key went with its lease at once, not after the server's
//! reconnect grace or the lease TTL). On etcd directly and on a `drun-rendezvous` server's
//! memory store.

use std::time::Duration;

use super::{agent, gen, stop_all, wait_gen};
use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::holds_for;

fn a_failed_rounds_agent_is_not_in_the_next_group(rdzv: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let with = |timeout: &str| -> Vec<String> {
        let mut v = rdzv.to_vec();
        v.extend([
            "--rdzv-conf".into(),
            format!("lease_ttl=3,last_call_timeout=0.5,join_timeout={timeout}"),
        ]);
        v
    };
    let a = agent(0, "ghost", "2", &with("1"), &[], dir.path());
    let (code, _, err) = a.wait(Duration::from_secs(30));
    assert_eq!(
        code, 3,
        "the lone agent's round fails at its join timeout:\n{err}"
    );
    assert!(err.contains("only 1 of min 2 nodes joined"), "{err}");

    // At once: alone, this node waits (before the fix it formed generation 1 with the agent
    // that had just exited, and started its workers against that agent's dead master).
    let b = agent(1, "ghost", "2", &with("30"), &[], dir.path());
    holds_for(
        "no group without a second live node",
        Duration::from_secs(2),
        || gen(dir.path(), 1).is_empty(),
    );
    let c = agent(2, "ghost", "2", &with("30"), &[], dir.path());
    let ranks = wait_gen(dir.path(), 1, 4, Duration::from_secs(30));
    let mut labels: Vec<&str> = ranks.iter().map(|r| r["label"].as_str().unwrap()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels, ["agent1", "agent2"], "{ranks:?}");
    stop_all(vec![b, c]);
}

#[test]
fn a_failed_rounds_agent_is_not_in_the_next_group_etcd() {
    let etcd = Etcd::start();
    a_failed_rounds_agent_is_not_in_the_next_group(&[
        "--rdzv-backend".into(),
        "etcd".into(),
        "--rdzv-endpoint".into(),
        etcd.endpoint.clone(),
    ]);
}

#[test]
fn a_failed_rounds_agent_is_not_in_the_next_group_memory() {
    let server = RdzvServer::start(&["--store", "memory"]);
    a_failed_rounds_agent_is_not_in_the_next_group(&[
        "--rdzv-endpoint".into(),
        server.endpoint.clone(),
    ]);
}
