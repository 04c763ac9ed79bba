//! Prometheus `/metrics` of agents (`drun --metrics-port`) and of the rendezvous server
//! (`drun-rendezvous serve --metrics-addr`), scraped with a plain HTTP GET and parsed during a
//! real 3-node run with a node kill (torch, gloo on loopback).

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::scrape::{self, get, scrape, value, Sample};
use crate::harness::{
    drun, gen_records, node_cmd, run, torch_python, wait_for, worker, Agent, DrunCmd,
};

fn has(samples: &[Sample], name: &str, want: &[(&str, &str)], v: f64) -> bool {
    value(samples, name, want) == Some(v)
}

/// 3 agents (`--nnodes 2:3`, 1 torch worker each sending step beacons until the test has seen
/// what it waits for) through a server with metrics; the survivor at node 0 shows generation 1,
/// then, after SIGKILL of node 3's agent,
/// generation 2, one re-form caused by `node_lost`, non-empty restart-phase histograms and
/// its rank's step time; the server (on `store`) shows the same generation and re-form.
fn node_kill_in_the_metrics(store: &[&str]) {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = RdzvServer::start_with_metrics(store);
    let rdzv = ["--rdzv-endpoint".to_string(), server.endpoint.clone()];
    let mut agents: Vec<Agent> = (0..3)
        .map(|i| {
            let mut c = node_cmd(i, "metrics", "2:3", &rdzv);
            c.nproc(1)
                .quick_shutdown()
                .python(&python)
                .args(["--metrics-port", "0"])
                .arg(worker("beacon_steps.py"))
                .arg(dir.path());
            Agent::start(c)
        })
        .collect();
    let survivor = &agents[0];
    let mut addr = None;
    wait_for(
        "the survivor prints its metrics address",
        Duration::from_secs(30),
        || {
            addr = scrape::announced(&survivor.stderr_so_far());
            addr.is_some()
        },
    );
    let addr = addr.unwrap();
    let mut last = Vec::new();
    wait_for(
        "generation 1 with 3 nodes and a step time in the survivor's metrics",
        Duration::from_secs(90),
        || {
            last = scrape(&addr).unwrap_or_default();
            has(&last, "drun_generation", &[], 1.0)
                && has(&last, "drun_members", &[], 3.0)
                && value(&last, "drun_rank_step_seconds", &[("rank", "0")]).is_some()
        },
    );
    assert_eq!(gen_records(dir.path(), 1).len(), 3);

    let victim = agents.pop().unwrap();
    victim.signal(Signal::SIGKILL);
    let _ = victim.wait(Duration::from_secs(10));
    let phases = ["stop", "form", "spawn", "first_progress"];
    wait_for(
        "generation 2 after the node kill, with its re-form, phases and step times",
        Duration::from_secs(90),
        || {
            last = scrape(&addr).unwrap_or_default();
            has(&last, "drun_generation", &[], 2.0)
                && phases.iter().all(|p| {
                    value(&last, "drun_restart_phase_seconds_count", &[("phase", p)])
                        .is_some_and(|n| n > 0.0)
                })
                && value(&last, "drun_rank_step_seconds", &[("rank", "0")]).is_some_and(|s| s > 0.0)
        },
    );
    let s = &last;
    assert!(has(s, "drun_members", &[], 2.0), "{s:?}");
    assert!(has(s, "drun_waiting", &[], 0.0), "{s:?}");
    assert!(
        has(s, "drun_reforms_total", &[("cause", "node_lost")], 1.0),
        "{s:?}"
    );
    assert!(
        has(s, "drun_restarts_total", &[("cause", "membership")], 1.0),
        "{s:?}"
    );
    assert!(
        has(s, "drun_restarts_total", &[("cause", "failure")], 0.0),
        "{s:?}"
    );
    assert!(has(s, "drun_restart_seconds_count", &[], 1.0), "{s:?}");
    assert!(
        value(s, "drun_rank_samples_per_second", &[("rank", "0")]).is_some_and(|v| v > 0.0),
        "{s:?}"
    );
    assert!(
        value(s, "drun_worker_resident_memory_bytes", &[("rank", "0")]).is_some_and(|v| v > 0.0),
        "{s:?}"
    );
    // The survivor's gen-1 worker failed (gloo lost its peer) or was stopped: an exit counted.
    assert!(
        s.iter()
            .any(|x| x.name == "drun_worker_exits_total" && x.value > 0.0),
        "{s:?}"
    );

    let srv = scrape(server.metrics.as_deref().unwrap()).expect("the server's metrics");
    let run = ("run", "metrics");
    assert!(has(&srv, "drun_rdzv_generation", &[run], 2.0), "{srv:?}");
    assert!(has(&srv, "drun_rdzv_members", &[run], 2.0), "{srv:?}");
    assert!(
        has(
            &srv,
            "drun_rdzv_reforms_total",
            &[run, ("cause", "node_lost")],
            1.0
        ),
        "{srv:?}"
    );
    assert!(has(&srv, "drun_rdzv_sessions", &[run], 2.0), "{srv:?}");
    assert!(has(&srv, "drun_rdzv_waiting", &[run], 0.0), "{srv:?}");

    std::fs::write(dir.path().join("release"), b"").unwrap();
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(120));
        assert_eq!(code, 0, "a survivor must finish:\n{err}");
    }
}

#[test]
fn a_node_kill_shows_in_the_metrics_of_a_survivor_and_of_the_server_memory() {
    node_kill_in_the_metrics(&["--store", "memory"]);
}

#[test]
fn a_node_kill_shows_in_the_metrics_of_a_survivor_and_of_the_server_etcd() {
    let etcd = Etcd::start();
    node_kill_in_the_metrics(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
}

/// The server's endpoint answers `/metrics` in OpenMetrics text and 404 elsewhere; a bad
/// `--metrics-addr` is a usage error.
#[test]
fn the_server_serves_metrics_and_refuses_a_bad_address() {
    let server = RdzvServer::start_with_metrics(&["--store", "memory"]);
    let addr = server.metrics.clone().unwrap();
    let (code, head, body) = get(&addr, "/metrics").expect("reachable");
    assert_eq!(code, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(
        body.contains("# TYPE drun_rdzv_lease_keepalive_failures counter"),
        "{body}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let samples = scrape::parse(&body);
    assert!(
        has(
            &samples,
            "drun_rdzv_lease_keepalive_failures_total",
            &[],
            0.0
        ),
        "{body}"
    );
    assert_eq!(get(&addr, "/").map(|r| r.0), Some(404));

    let mut c = std::process::Command::new(crate::harness::cluster::rendezvous_bin());
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "nonsense",
    ]);
    let (code, _, err) = run(c, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid --metrics-addr 'nonsense'"), "{err}");
}

/// `--metrics-port` on a port in use: one line naming the flag, exit 2, nothing started.
#[test]
fn metrics_port_in_use_is_a_usage_error() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut c = drun();
    c.args(["--standalone", "--metrics-port", &port])
        .arg(worker("exit_code.py"))
        .arg("0");
    let (code, _, err) = run(c, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid --metrics-port"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let mut c = drun();
    c.args(["--standalone", "--metrics-port", "70000"])
        .arg(worker("exit_code.py"))
        .arg("0");
    let (code, _, err) = run(c, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--metrics-port"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
