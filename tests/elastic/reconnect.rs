//! An agent whose connection to the rendezvous server breaks, and which reconnects within the
//! reconnect grace, keeps its membership: the server revokes the lease of a vanished agent only
//! (see `rendezvous/src/decisions/loss.rs`).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{agent, gen, pids, stop_all, wait_gen};
use crate::harness::cluster::RdzvServer;
use crate::harness::etcd::Etcd;
use crate::harness::{alive, holds_for, Agent};

/// A loopback TCP proxy whose open connections can be cut at once, while it keeps accepting.
struct Proxy {
    addr: String,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let open = Arc::new(Mutex::new(Vec::new()));
        let conns = open.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let mut o = conns.lock().unwrap();
                o.push(client.try_clone().unwrap());
                o.push(server.try_clone().unwrap());
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Proxy { addr, open }
    }

    /// Breaks every connection made so far (both directions, both ends).
    fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

#[test]
fn an_agent_that_reconnects_within_the_grace_keeps_its_membership() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let proxy = Proxy::start(server.endpoint.clone());
    let dir = tempfile::tempdir().unwrap();
    // Agent 0 talks through the proxy, agent 1 directly; default lease_ttl (10 s).
    let via_proxy = vec!["--rdzv-endpoint".to_string(), proxy.addr.clone()];
    let direct = vec!["--rdzv-endpoint".to_string(), server.endpoint.clone()];
    let agents: Vec<Agent> = vec![
        agent(0, "reconnect", "2", &via_proxy, &[], dir.path()),
        agent(1, "reconnect", "2", &direct, &[], dir.path()),
    ];
    let g1 = wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    proxy.cut();
    // Well past the 1 s grace: a revoked lease would have re-formed the group by now.
    undisturbed(
        dir.path(),
        &g1,
        agents,
        "generation 1 undisturbed after the connection broke",
        4,
    );
}

/// Generation 1 (`g1`, under `dir`) keeps running for `secs` (no worker gone, no generation 2),
/// and agent 0 was never fenced; then the agents are stopped.
fn undisturbed(
    dir: &std::path::Path,
    g1: &[serde_json::Value],
    agents: Vec<Agent>,
    what: &str,
    secs: u64,
) {
    holds_for(what, Duration::from_secs(secs), || {
        pids(g1).iter().all(|p| alive(*p)) && gen(dir, 2).is_empty()
    });
    let err = agents[0].stderr_so_far();
    assert!(!err.contains("fenced"), "{err}");
    stop_all(agents);
}

/// Replica 1 of two on one etcd, and agent 0's sessions on it; replica 2 and agent 1.
fn two_replicas(run: &str, dir: &std::path::Path) -> (Etcd, RdzvServer, RdzvServer, Vec<Agent>) {
    let etcd = Etcd::start();
    let store = [
        "--store",
        "etcd",
        "--etcd-endpoints",
        etcd.endpoint.as_str(),
    ];
    let s1 = RdzvServer::start(&store);
    let s2 = RdzvServer::start(&store);
    let conf = ["--rdzv-conf", "lease_ttl=3"];
    let both = vec![
        "--rdzv-endpoint".to_string(),
        format!("{},{}", s1.endpoint, s2.endpoint),
    ];
    let only_2 = vec!["--rdzv-endpoint".to_string(), s2.endpoint.clone()];
    let agents: Vec<Agent> = vec![
        agent(0, run, "2", &both, &conf, dir),
        agent(1, run, "2", &only_2, &conf, dir),
    ];
    (etcd, s1, s2, agents)
}

/// Replica 1 stops (`stop`) while generation 1 runs; agent 0 must carry on through replica 2.
fn replica_stops(run: &str, stop: impl FnOnce(&mut RdzvServer)) {
    let dir = tempfile::tempdir().unwrap();
    let (_etcd, mut s1, _s2, agents) = two_replicas(run, dir.path());
    let g1 = wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    stop(&mut s1);
    undisturbed(
        dir.path(),
        &g1,
        agents,
        "generation 1 undisturbed past replica 1's lease TTL",
        7,
    );
}

#[test]
fn a_replica_stopped_with_sigterm_exits_promptly_and_its_agents_keep_their_membership() {
    // A rolling update (Kubernetes, systemd) stops a replica with SIGTERM while agents hold
    // sessions on it, which never end on their own: the replica closes them after a bounded
    // drain (2 s) and exits 0, and agent 0 carries on through replica 2 as if it had died.
    replica_stops("replica-stopped", |s1| {
        assert_eq!(s1.terminate(Duration::from_secs(10)), Some(0));
    });
}

#[test]
fn an_agent_whose_server_replica_dies_keeps_its_membership_on_the_other_replica() {
    // Two replicas on one etcd. Agent 0 talks to replica 1 (and knows replica 2); agent 1 talks
    // to replica 2 only. Replica 1 is SIGKILLed while generation 1 runs: agent 0 reconnects to
    // replica 2, which takes over its lease (`rendezvous/src/store/shared_lease.rs`). Replica 1's
    // shared etcd lease expires after one TTL (3 s here); had the keys not moved, agent 0's
    // membership would go with it and the group would re-form.
    replica_stops("replica-dies", RdzvServer::kill);
}

#[test]
fn a_memory_server_restarted_without_its_state_fences_with_that_reason() {
    // The memory store keeps nothing across a restart: the agents' leases are unknown to the
    // new server though the outage was far shorter than the TTL, and the fence line says why
    // (not "expired").
    let mut server = RdzvServer::start(&["--store", "memory"]);
    let endpoint = server.endpoint.clone();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = vec!["--rdzv-endpoint".to_string(), endpoint.clone()];
    let agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "mem-restart", "2", &rdzv, &[], dir.path()))
        .collect();
    wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    server.kill();
    let _again = RdzvServer::start_on(&endpoint, &["--store", "memory"]);
    crate::harness::wait_for("both agents fenced", Duration::from_secs(60), || {
        agents.iter().all(|a| a.stderr_so_far().contains("fenced:"))
    });
    for a in &agents {
        let err = a.stderr_so_far();
        let fence = err
            .lines()
            .find(|l| l.contains("fenced:"))
            .unwrap_or_else(|| panic!("a fence line: {err}"));
        assert!(
            fence.contains("no longer holds this run's generation 1") && !fence.contains("expired"),
            "{fence}"
        );
    }
    stop_all(agents);
}
