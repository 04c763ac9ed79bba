//! Multi-node rendezvous: several real agents on loopback addresses, real etcd, real servers.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::harness::cluster::{free_port, rendezvous_bin, Etcd, RdzvServer};
use crate::harness::{holds_for, read_json, run, torch_python, wait_for, worker, Agent, DrunCmd};

/// `drun` for agent `i` of a multi-node job: its own loopback address and run id `run`.
fn agent_cmd(i: usize, run: &str, nnodes: &str, rdzv: &[&str]) -> Command {
    crate::harness::node_cmd(i, run, nnodes, rdzv)
}

fn envs(dir: &Path) -> Vec<Value> {
    let mut out: Vec<Value> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("env_"))
        .map(|e| read_json(&e.path()))
        .collect();
    out.sort_by_key(|v| v["env"]["RANK"].as_str().unwrap().parse::<u32>().unwrap());
    out
}

/// 4 agents × 2 workers; agent 3 pins node rank 0. Checks ranks 0..7 exactly once, one world.
fn four_agents(rdzv: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<Agent> = (0..4)
        .map(|i| {
            let mut c = agent_cmd(i, "four", "4", rdzv);
            if i == 3 {
                c.args(["--node-rank", "0"]);
            }
            c.arg(worker("envdump.py"))
                .arg(dir.path())
                .arg(format!("agent{i}"));
            Agent::start(c)
        })
        .collect();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "agent {i}: {err}");
    }
    let envs = envs(dir.path());
    let ranks: Vec<u32> = envs
        .iter()
        .map(|e| e["env"]["RANK"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ranks, (0..8).collect::<Vec<_>>(), "ranks 0..7 exactly once");
    for key in [
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "DRUN_GENERATION",
        "GROUP_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
    ] {
        let values: BTreeSet<&str> = envs
            .iter()
            .map(|e| e["env"][key].as_str().unwrap())
            .collect();
        assert_eq!(values.len(), 1, "{key} identical everywhere: {values:?}");
    }
    assert_eq!(envs[0]["env"]["WORLD_SIZE"], "8");
    assert_eq!(envs[0]["env"]["GROUP_WORLD_SIZE"], "4");
    // The agent that asked for node rank 0 got it, and with it MASTER_ADDR.
    let pinned: Vec<&Value> = envs.iter().filter(|e| e["argv"][2] == "agent3").collect();
    assert_eq!(pinned.len(), 2);
    for e in &pinned {
        assert_eq!(e["env"]["GROUP_RANK"], "0");
    }
    assert_eq!(envs[0]["env"]["MASTER_ADDR"], "127.0.0.4");
    // Contiguous ranks per node.
    for e in &envs {
        let rank: u32 = e["env"]["RANK"].as_str().unwrap().parse().unwrap();
        let group: u32 = e["env"]["GROUP_RANK"].as_str().unwrap().parse().unwrap();
        let local: u32 = e["env"]["LOCAL_RANK"].as_str().unwrap().parse().unwrap();
        assert_eq!(rank, group * 2 + local);
    }
}

#[test]
fn four_agents_via_server_on_etcd() {
    let etcd = Etcd::start();
    let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    four_agents(&["--rdzv-endpoint", &server.endpoint]);
}

#[test]
fn four_agents_via_server_on_memory_store() {
    let server = RdzvServer::start(&["--store", "memory"]);
    four_agents(&[
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
    ]);
}

#[test]
fn four_agents_with_c10d_embedded_host() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    four_agents(&["--rdzv-backend", "c10d", "--rdzv-endpoint", &endpoint]);
}

#[test]
fn four_agents_directly_on_etcd() {
    let etcd = Etcd::start();
    four_agents(&["--rdzv-backend", "etcd", "--rdzv-endpoint", &etcd.endpoint]);
}

#[test]
fn joining_a_finished_run_is_one_line_exit_3() {
    let etcd = Etcd::start();
    let rdzv = ["--rdzv-backend", "etcd", "--rdzv-endpoint", &etcd.endpoint];
    let mut c = agent_cmd(0, "done-run", "1", &rdzv);
    c.arg(worker("envdump.py"))
        .arg(tempfile::tempdir().unwrap().path());
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    let mut again = agent_cmd(1, "done-run", "1", &rdzv);
    again
        .args(["-q"])
        .arg(worker("envdump.py"))
        .arg(tempfile::tempdir().unwrap().path());
    let (code, _, err) = run(again, Duration::from_secs(60));
    assert_eq!(code, 3, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("run done-run already finished at"),
        "{err}"
    );
}

fn world_sizes(dir: &Path) -> BTreeSet<String> {
    envs(dir)
        .iter()
        .map(|e| e["env"]["WORLD_SIZE"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn elastic_min_max_forms_after_last_call_and_parks_standbys() {
    let etcd = Etcd::start();
    let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let rdzv = [
        "--rdzv-endpoint",
        server.endpoint.as_str(),
        "--rdzv-conf",
        "last_call_timeout=2",
    ];

    // 3 agents, --nnodes 2:4: forms at 3 once the last call closes.
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let mut c = agent_cmd(i, "elastic3", "2:4", &rdzv);
            c.arg(worker("envdump.py")).arg(dir.path());
            Agent::start(c)
        })
        .collect();
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(world_sizes(dir.path()), BTreeSet::from(["6".to_string()]));

    // 5 agents: forms at 4 at once; the fifth is a standby visible in the server's state.
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<Agent> = (0..5)
        .map(|i| {
            let mut c = agent_cmd(i, "elastic5", "2:4", &rdzv);
            c.arg(worker("trap.py")).arg(dir.path()).arg("0");
            Agent::start(c)
        })
        .collect();
    wait_for(
        "8 workers of the 4-node group ready",
        Duration::from_secs(60),
        || (0..8).all(|r| dir.path().join(format!("ready_{r}")).exists()),
    );
    let status = || -> Value {
        let out = Command::new(rendezvous_bin())
            .args([
                "status",
                "elastic5",
                "--json",
                "--etcd-endpoints",
                &etcd.endpoint,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    wait_for(
        "one standby in the server's state",
        Duration::from_secs(20),
        || status()["waiting"].as_array().is_some_and(|w| w.len() == 1),
    );
    let s = status();
    assert_eq!(s["plan"]["members"].as_array().unwrap().len(), 4, "{s}");
    assert_eq!(s["plan"]["world_size"], 8, "{s}");
    assert!(
        !dir.path().join("ready_8").exists(),
        "the standby runs no worker"
    );
    drop(agents);
}

#[test]
fn killing_one_of_two_server_replicas_during_rendezvous_loses_nothing() {
    let etcd = Etcd::start();
    let mut s1 = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let s2 = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let endpoints = format!("{},{}", s1.endpoint, s2.endpoint);
    let rdzv = ["--rdzv-endpoint", endpoints.as_str()];
    let dir = tempfile::tempdir().unwrap();
    let start = |i: usize| {
        let mut c = agent_cmd(i, "ha", "3", &rdzv);
        c.arg(worker("envdump.py")).arg(dir.path());
        Agent::start(c)
    };
    let a0 = start(0);
    let a1 = start(1);
    wait_for(
        "two agents waiting in the rendezvous",
        Duration::from_secs(30),
        || {
            let out = Command::new(rendezvous_bin())
                .args(["status", "ha", "--json", "--etcd-endpoints", &etcd.endpoint])
                .output()
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout)
                .is_ok_and(|v| v["waiting"].as_array().is_some_and(|w| w.len() == 2))
        },
    );
    s1.kill();
    let a2 = start(2);
    for a in [a0, a1, a2] {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{err}");
    }
    assert_eq!(world_sizes(dir.path()), BTreeSet::from(["6".to_string()]));
    assert_eq!(envs(dir.path()).len(), 6);
}

/// Two agents running long workers; returns (agents, dir with ready_<rank> files).
fn running_job(rdzv: &[&str], run: &str) -> (Vec<Agent>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = agent_cmd(i, run, "2", rdzv);
            c.args(["--shutdown-timeout", "5"])
                .arg(worker("trap.py"))
                .arg(dir.path())
                .arg("0");
            Agent::start(c)
        })
        .collect();
    wait_for("4 workers ready", Duration::from_secs(60), || {
        (0..4).all(|r| dir.path().join(format!("ready_{r}")).exists())
    });
    (agents, dir)
}

/// Holds for `duration` that every worker keeps its pid and sees no signal and every agent
/// lives; otherwise fails naming what changed, with the agents' output so far.
fn undisturbed(
    what: &str,
    duration: Duration,
    agents: &[Agent],
    dir: &Path,
    before: &[(String, bool)],
) {
    let end = std::time::Instant::now() + duration;
    while std::time::Instant::now() < end {
        let now = worker_state(dir);
        let gone: Vec<usize> = (0..agents.len())
            .filter(|&i| !crate::harness::alive(agents[i].pid()))
            .collect();
        if now != before || !gone.is_empty() {
            let logs: String = agents
                .iter()
                .enumerate()
                .map(|(i, a)| format!("--- agent {i}:\n{}\n", a.stderr_so_far()))
                .collect();
            panic!("{what} stopped holding: workers {before:?} -> {now:?}, agents gone: {gone:?}\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn worker_state(dir: &Path) -> Vec<(String, bool)> {
    (0..4)
        .map(|r| {
            let pid = std::fs::read_to_string(dir.join(format!("ready_{r}"))).unwrap_or_default();
            (pid, dir.join(format!("signals_{r}")).exists())
        })
        .collect()
}

/// Ends the job with SIGTERM to every agent; each worker must have seen exactly that one signal.
fn end_job(agents: Vec<Agent>, dir: &Path) {
    for a in &agents {
        a.signal(Signal::SIGTERM);
    }
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 143, "{err}");
    }
    for r in 0..4 {
        let sigs = std::fs::read_to_string(dir.join(format!("signals_{r}"))).unwrap_or_default();
        assert_eq!(
            sigs.trim(),
            "SIGTERM",
            "rank {r} saw only the final SIGTERM"
        );
    }
}

#[test]
fn etcd_leader_loss_does_not_disturb_workers() {
    let members = Etcd::cluster(3);
    let endpoints: Vec<&str> = members.iter().map(|m| m.endpoint.as_str()).collect();
    let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &endpoints.join(",")]);
    let (agents, dir) = running_job(
        &[
            "--rdzv-endpoint",
            &server.endpoint,
            "--rdzv-conf",
            "lease_ttl=4",
        ],
        "leader",
    );
    let before = worker_state(dir.path());
    let mut leader = None;
    wait_for("an etcd member to lead", Duration::from_secs(10), || {
        leader = members.iter().find(|m| m.is_leader());
        leader.is_some()
    });
    leader.unwrap().signal(Signal::SIGKILL);
    undisturbed(
        "workers undisturbed after the etcd leader died",
        Duration::from_secs(10),
        &agents,
        dir.path(),
        &before,
    );
    end_job(agents, dir.path());
}

#[test]
fn short_etcd_stall_does_not_disturb_workers() {
    let etcd = Etcd::start();
    let (agents, dir) = running_job(
        &["--rdzv-backend", "etcd", "--rdzv-endpoint", &etcd.endpoint],
        "stall",
    );
    let before = worker_state(dir.path());
    etcd.signal(Signal::SIGSTOP);
    undisturbed(
        "workers undisturbed while etcd is stopped",
        Duration::from_secs(3),
        &agents,
        dir.path(),
        &before,
    );
    etcd.signal(Signal::SIGCONT);
    undisturbed(
        "workers undisturbed after etcd resumed",
        Duration::from_secs(8),
        &agents,
        dir.path(),
        &before,
    );
    end_job(agents, dir.path());
}

#[test]
fn ddp_all_reduce_across_four_agents() {
    let Some(python) = torch_python() else { return };
    let etcd = Etcd::start();
    let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let out = tempfile::tempdir().unwrap();
    let agents: Vec<Agent> = (0..4)
        .map(|i| {
            let mut c = agent_cmd(i, "ddp8", "4", &["--rdzv-endpoint", &server.endpoint]);
            // One generation that never restarts: a warm interpreter per rank would import
            // torch beside the workers for nothing (8 of the test's 16 imports).
            c.python(&python)
                .args(["--warm-workers", "off"])
                .arg(crate::harness::root().join("examples/train_ddp.py"))
                .args(["--epochs", "2", "--out"])
                .arg(out.path());
            Agent::start(c)
        })
        .collect();
    let mut outputs = String::new();
    for a in agents {
        let (code, stdout, err) = a.wait(Duration::from_secs(300));
        assert_eq!(code, 0, "{stdout}\n{err}");
        outputs.push_str(&stdout);
    }
    let done = outputs
        .lines()
        .find(|l| l.contains("]:done "))
        .expect("rank 0's done line");
    assert!(done.contains("world_size=8"), "{done}");
    assert!(out.path().join("final.pt").is_file());
}

/// `drun-rendezvous status RUN --endpoint SERVER` as JSON (`null` while it cannot answer).
fn memory_status(run: &str, endpoint: &str) -> Value {
    let out = Command::new(rendezvous_bin())
        .args(["status", run, "--json", "--endpoint", endpoint])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Whether the round's progress line says a node decided to stand by.
fn standing_by(status: &Value) -> bool {
    status["progress"]
        .as_str()
        .is_some_and(|p| p.contains("standing by"))
}

/// `--nnodes 1:2` at MAX: a third agent is a standby. Even though it alone meets MIN it must not
/// form a second world beside the running one; it joins when the group re-forms (here after a
/// node is SIGKILLed).
#[test]
fn a_standby_never_forms_a_second_world_beside_a_running_group() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = server.quick_rdzv();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |i: usize| {
        let mut c = agent_cmd(i, "standby", "1:2", &rdzv);
        c.arg(worker("trap.py")).arg(dirs[i].path()).arg("0");
        Agent::start(c)
    };
    let status = || memory_status("standby", &server.endpoint);
    let ready = |i: usize, ranks: &[u32]| {
        ranks
            .iter()
            .all(|r| dirs[i].path().join(format!("ready_{r}")).exists())
    };
    let a = start(0);
    let b = start(1);
    wait_for("a 2-node group", Duration::from_secs(30), || {
        ready(0, &[0, 1]) && ready(1, &[2, 3])
    });
    let c = start(2);
    wait_for(
        "the third agent to decide it is a standby",
        Duration::from_secs(30),
        || standing_by(&status()),
    );
    let s = status();
    assert_eq!(s["generation"], 1, "no second world formed: {s}");
    assert_eq!(s["waiting"].as_array().map(Vec::len), Some(1), "{s}");
    assert_eq!(
        std::fs::read_dir(dirs[2].path()).unwrap().count(),
        0,
        "the standby runs no worker"
    );
    b.signal(Signal::SIGKILL);
    drop(b);
    wait_for(
        "A and the standby to form generation 2",
        Duration::from_secs(60),
        || {
            let s = status();
            s["generation"].as_u64() >= Some(2)
                && s["plan"]["world_size"] == 4
                && s["plan"]["members"].as_array().is_some_and(|m| {
                    m.iter().any(|n| {
                        n["advertise_addr"]
                            .as_str()
                            .is_some_and(|a| a.starts_with("127.0.0.3"))
                    })
                })
        },
    );
    wait_for(
        "the former standby's workers",
        Duration::from_secs(30),
        || dirs[2].path().join("ready_2").exists() || dirs[2].path().join("ready_0").exists(),
    );
    drop((a, c));
}

/// A standby of a run that finishes never forms a generation of its own: it ends as a late
/// joiner of a finished run does (one line, exit 3), having started no worker.
#[test]
fn a_standby_of_a_finished_run_starts_nothing() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = server.quick_rdzv();
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |i: usize| {
        let mut c = agent_cmd(i, "standby-end", "1", &rdzv);
        c.arg(worker("trap.py")).arg(dirs[i].path()).arg("0");
        Agent::start(c)
    };
    let a = start(0);
    wait_for("the running worker", Duration::from_secs(30), || {
        dirs[0].path().join("ready_0").exists()
    });
    let c = start(1);
    wait_for("a standby", Duration::from_secs(30), || {
        standing_by(&memory_status("standby-end", &server.endpoint))
    });
    // The workers "save" on SIGTERM and exit 0: the run succeeds.
    for rank in 0..2 {
        let ready = dirs[0].path().join(format!("ready_{rank}"));
        wait_for("the worker's handlers", Duration::from_secs(30), || {
            ready.exists()
        });
        let pid: i32 = std::fs::read_to_string(ready)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    }
    let (ca, _, ea) = a.wait(Duration::from_secs(30));
    assert_eq!(ca, 0, "{ea}");
    let (cc, _, ec) = c.wait(Duration::from_secs(30));
    assert_eq!(cc, 3, "{ec}");
    assert!(ec.contains("run standby-end already finished"), "{ec}");
    assert_eq!(
        std::fs::read_dir(dirs[1].path()).unwrap().count(),
        0,
        "the standby started no worker"
    );
}

#[test]
fn the_etcd_backend_waits_for_etcd_to_answer_within_the_join_timeout() {
    // Nodes and etcd start in any order: an agent whose etcd does not answer yet (stopped here)
    // keeps trying, and runs once it does.
    let etcd = Etcd::start();
    etcd.signal(Signal::SIGSTOP);
    let rdzv = ["--rdzv-backend", "etcd", "--rdzv-endpoint", &etcd.endpoint];
    let dir = tempfile::tempdir().unwrap();
    let mut c = agent_cmd(0, "etcd-late", "1", &rdzv);
    c.arg(worker("envdump.py")).arg(dir.path());
    let agent = Agent::start(c);
    holds_for("the agent waits for etcd", Duration::from_secs(4), || {
        envs(dir.path()).is_empty()
    });
    etcd.signal(Signal::SIGCONT);
    let (code, _, err) = agent.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert_eq!(envs(dir.path()).len(), 2);
}

#[test]
fn an_etcd_that_never_answers_is_one_line_exit_3_after_the_join_timeout() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let rdzv = [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        &endpoint,
        "--rdzv-conf",
        "join_timeout=3",
    ];
    let mut c = agent_cmd(0, "no-etcd", "1", &rdzv);
    c.args(["-q"]).arg(worker("envdump.py")).arg("/nonexistent");
    let t = std::time::Instant::now();
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 3, "{err}");
    assert!(
        t.elapsed() >= Duration::from_secs(3),
        "gave up after {:?}",
        t.elapsed()
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&format!("cannot reach etcd at {endpoint}"))
            && lines[0].contains("join timeout of 3 s"),
        "{err}"
    );
}
