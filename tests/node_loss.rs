//! A crashed node is named, noticed at once through its closed connection and its closed probe
//! port (the reconnect grace is cut short), its peers' collective errors do not spend the
//! restart budget, and the survivors re-form without waiting out the last call — at the default settings (real torch, gloo on loopback).

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::{alive, gen_records, node_cmd, torch_python, wait_for, Agent, DrunCmd};

/// 3 agents `--nnodes 2:3` on 127.0.0.1-3, 1 torch worker each doing `steps` all_reduce steps
/// (`tests/workers/steps.py`); returns once generation 1 runs with all 3 ranks.
fn three_agents(run: &str, rdzv: &[String], python: &Path, dir: &Path, steps: u32) -> Vec<Agent> {
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let mut c = node_cmd(i, run, "2:3", rdzv);
            c.nproc(1)
                .quick_shutdown()
                .python(python)
                .arg(crate::harness::worker("steps.py"))
                .arg(dir)
                .arg(steps.to_string());
            Agent::start(c)
        })
        .collect();
    wait_for("generation 1 with 3 ranks", Duration::from_secs(90), || {
        gen_records(dir, 1).len() == 3
    });
    agents
}

/// 3 agents (1 worker each, `--nnodes 2:3`, default `--max-restarts 0`) rendezvousing through
/// `rdzv`; SIGKILL of the agent of node 3 (its guard kills its worker). The survivors' gloo
/// errors are attributed to the loss, named with `noticed` (how it was known): generation 2
/// runs at world 2 without a last-call wait and the job ends with exit 0.
fn crashed_node_is_a_membership_restart(rdzv: &[String], noticed: &str) {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Default lease_ttl (10 s) and last_call_timeout (30 s): the loss is known before the
    // lease expires, and the re-form does not wait out the last call.
    let mut agents = three_agents("loss", rdzv, &python, dir.path(), 150);
    let victim = agents.pop().unwrap();
    victim.signal(Signal::SIGKILL);
    let (_, _, victim_err) = victim.wait(Duration::from_secs(10));
    wait_for("generation 2 with 2 ranks", Duration::from_secs(90), || {
        gen_records(dir.path(), 2).len() == 2
    });
    for r in gen_records(dir.path(), 2) {
        assert_eq!(r["world_size"], 2, "{r}");
    }
    let mut all_err = String::new();
    for a in agents {
        let (code, out, err) = a.wait(Duration::from_secs(120));
        assert_eq!(
            code, 0,
            "a survivor must finish\nstdout:\n{out}\nstderr:\n{err}\nvictim:\n{victim_err}"
        );
        assert!(out.contains("done gen=2"), "{out}");
        assert!(out.contains("world=2 sum=2"), "{out}");
        all_err.push_str(&err);
    }
    assert!(
        all_err.contains(&format!("(127.0.0.3, rank 2) lost: {noticed}")),
        "the re-form names the lost node and how it was noticed:\n{all_err}"
    );
    assert!(
        all_err.contains("formed now: every surviving member rejoined with 2 nodes"),
        "generation 2 formed without a last-call wait:\n{all_err}"
    );
    assert!(
        all_err.contains("restart into generation 2 took")
            && all_err.contains("workers stopped")
            && all_err.contains("group formed")
            && all_err.contains("workers spawned"),
        "the restart phases are printed:\n{all_err}"
    );
    assert!(
        !all_err.contains("restart budget spent"),
        "the loss must not end the job as a worker failure:\n{all_err}"
    );
}

/// [`crashed_node_is_a_membership_restart`] through a `drun-rendezvous` server on `store`:
/// the loss is known through the victim's closed connection, and its host's answer to the
/// server's knock cuts the reconnect grace short.
fn crashed_node_under_a_server(store: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let server = RdzvServer::start_logging(store, "warn", &log);
    let rdzv = ["--rdzv-endpoint".to_string(), server.endpoint.clone()];
    crashed_node_is_a_membership_restart(&rdzv, "its agent's connection to the rendezvous closed");
    if torch_python().is_none() {
        return;
    }
    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        server_log.contains("its host says nothing listens on its probe port any more"),
        "the server asked the victim's host:\n{server_log}"
    );
}

#[test]
fn crashed_node_is_a_membership_restart_memory() {
    crashed_node_under_a_server(&["--store", "memory"]);
}

#[test]
fn crashed_node_is_a_membership_restart_etcd() {
    let etcd = Etcd::start();
    crashed_node_under_a_server(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
}

/// The `etcd` backend (a session in every agent, no server): nothing closes when an agent
/// dies, and its lease would hold for 10 s after the survivors' workers failed. The failing
/// survivor's session knocks on the victim's probe port, its host refuses, and the session
/// drops the victim itself (records why, revokes its lease): a membership restart, not a
/// worker failure that ends a job with `--max-restarts 0`.
#[test]
fn crashed_node_is_a_membership_restart_on_the_etcd_backend() {
    let etcd = Etcd::start();
    let rdzv = [
        "--rdzv-backend".to_string(),
        "etcd".into(),
        "--rdzv-endpoint".into(),
        etcd.endpoint.clone(),
    ];
    crashed_node_is_a_membership_restart(
        &rdzv,
        "its agent's process is gone (its host says nothing listens on its probe port any more)",
    );
}

/// An agent stopped (SIGSTOP) past its lease while its worker runs on: the others re-form
/// without it, its worker fails in the old world, and when the agent resumes it is fenced while
/// reporting that failure: it joins again as a newcomer instead of ending the job with exit 1.
#[test]
fn an_agent_stopped_past_its_lease_rejoins_instead_of_failing_the_job() {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = [
        "--rdzv-endpoint".to_string(),
        server.endpoint.clone(),
        "--rdzv-conf".into(),
        // The resumed agent rejoins as a newcomer: a short last call admits it soon.
        "lease_ttl=3,last_call_timeout=1".into(),
    ];
    let agents = three_agents("paused", &rdzv, &python, dir.path(), 100_000);
    let paused = &agents[2];
    paused.signal(Signal::SIGSTOP);
    wait_for(
        "the others re-form without it",
        Duration::from_secs(60),
        || gen_records(dir.path(), 2).len() == 2,
    );
    paused.signal(Signal::SIGCONT);
    // However it learns it was dropped — fenced while reporting its worker's failure, fenced
    // while supervising, or the re-form itself — it joins again as a newcomer.
    wait_for(
        "a generation with all 3 nodes again",
        Duration::from_secs(60),
        || (3..10).any(|g| gen_records(dir.path(), g).len() == 3),
    );
    let err = paused.stderr_so_far();
    assert!(alive(paused.pid()), "the resumed agent carries on: {err}");
    assert!(!err.contains("FAILED"), "no failure summary: {err}");
    assert!(!err.contains("could not report the failure"), "{err}");
}
