//! `drun-rendezvous status` and `drun --status` during a real multi-node job: the JSON names
//! the actual agents, the human view fits 80 columns, `--watch` refreshes, bad input is one
//! line with its exit code.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::harness::cluster::{free_port, rendezvous_bin, Etcd, RdzvServer};
use crate::harness::{drun, node_cmd, run, wait_for, worker, Agent};

/// Runs `cmd` to its end: (exit code, stdout, stderr).
fn output(cmd: &mut Command) -> (i32, String, String) {
    let o = cmd.output().expect("run the status command");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The JSON of a status command, `None` while it fails.
fn json_of(cmd: &mut Command) -> Option<Value> {
    let (code, out, _) = output(cmd);
    (code == 0)
        .then(|| serde_json::from_str(&out).ok())
        .flatten()
}

/// Node id → state, from a status document.
fn states(s: &Value) -> BTreeMap<String, String> {
    s["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let id = n["node"].as_str().unwrap_or_default().to_string();
            (id, n["state"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

/// The node id agent `i` (its own loopback address) runs under.
fn node_id(i: usize, agent: &Agent) -> String {
    format!("127.0.0.{}_{}", i + 1, agent.pid())
}

/// Every line of a human view fits 80 columns and the view names each of `nodes` with `state`.
fn check_view(view: &str, nodes: &[(String, &str)]) {
    for line in view.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}\n{view}"
        );
    }
    for (id, state) in nodes {
        let row = view
            .lines()
            .find(|l| l.starts_with(id.as_str()))
            .unwrap_or_else(|| panic!("no row for {id}:\n{view}"));
        assert!(
            row.ends_with(state),
            "{id} should be {state}: {row}\n{view}"
        );
    }
}

/// `n` agents of run `run` whose workers (`trap.py`) mark `dir/ready_<rank>` and run until
/// stopped.
fn trap_agents(n: usize, run: &str, nnodes: &str, rdzv: &[&str], dir: &Path) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let mut c = node_cmd(i, run, nnodes, rdzv);
            c.args(["--shutdown-timeout", "3"])
                .arg(worker("trap.py"))
                .arg(dir)
                .arg("0");
            Agent::start(c)
        })
        .collect()
}

/// 3 members and a standby on a `drun-rendezvous` server over etcd: the server's status, etcd's
/// status and the agents' own `drun --status` all name exactly the running agents.
#[test]
fn status_during_a_job_names_the_actual_members_and_the_standby() {
    let etcd = Etcd::start();
    let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let rdzv = ["--rdzv-endpoint", server.endpoint.as_str()];
    let dir = tempfile::tempdir().unwrap();
    let agents = trap_agents(4, "statusrun", "2:3", &rdzv, dir.path());
    wait_for(
        "6 workers of the 3-node group",
        Duration::from_secs(60),
        || (0..6).all(|r| dir.path().join(format!("ready_{r}")).exists()),
    );
    let server_json = || {
        json_of(Command::new(rendezvous_bin()).args([
            "status",
            "statusrun",
            "--json",
            "--endpoint",
            &server.endpoint,
        ]))
    };
    // The group formed with the first three to arrive: whichever three, the fourth stands by.
    wait_for(
        "3 running members and a standby",
        Duration::from_secs(30),
        || {
            server_json().is_some_and(|s| {
                let st = states(&s);
                st.values().filter(|v| *v == "running").count() == 3
                    && st.values().filter(|v| *v == "standby").count() == 1
            })
        },
    );
    let s = server_json().unwrap();
    let ids: Vec<String> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| node_id(i, a))
        .collect();
    let st = states(&s);
    assert_eq!(
        st.keys().cloned().collect::<Vec<_>>(),
        {
            let mut v = ids.clone();
            v.sort();
            v
        },
        "{s}"
    );
    let members: Vec<String> = s["plan"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["node_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(members.len(), 3, "{s}");
    for m in &members {
        assert_eq!(st[m], "running", "{s}");
    }
    assert_eq!(s["plan"]["world_size"], 6, "{s}");
    assert_eq!(s["generation"], 1, "{s}");
    assert!(s["formation"]["formed_at_ms"].as_u64() > Some(0), "{s}");
    assert!(
        s["formation"]["lost_work"].is_null(),
        "a first formation lost nothing: {s}"
    );

    // etcd read directly says the same.
    let e = json_of(Command::new(rendezvous_bin()).args([
        "status",
        "statusrun",
        "--json",
        "--etcd-endpoints",
        &etcd.endpoint,
    ]))
    .expect("status from etcd");
    assert_eq!(states(&e), st, "{e}");

    // The human view: 80 columns, each member running, the standby named.
    let (code, view, err) = output(Command::new(rendezvous_bin()).args([
        "status",
        "statusrun",
        "--endpoint",
        &server.endpoint,
    ]));
    assert_eq!(code, 0, "{err}");
    let expect: Vec<(String, &str)> = ids
        .iter()
        .map(|id| {
            (
                id.clone(),
                if members.contains(id) {
                    "running"
                } else {
                    "standby"
                },
            )
        })
        .collect();
    check_view(&view, &expect);
    assert!(
        view.starts_with("run statusrun: generation 1, running; 3 nodes, world size 6"),
        "{view}"
    );
    eprintln!("{view}");

    // The agent side, with the flags the agents were started with.
    let mut agent_status = drun();
    agent_status
        .args(["--status", "--json", "--rdzv-id", "statusrun"])
        .args(rdzv);
    let a = json_of(&mut agent_status).expect("drun --status --json");
    assert_eq!(states(&a), st, "{a}");
    let mut agent_view = drun();
    agent_view
        .args([
            "--status",
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            &etcd.endpoint,
        ])
        .args(["--rdzv-id", "statusrun"]);
    let (code, view, err) = output(&mut agent_view);
    assert_eq!(code, 0, "{err}");
    check_view(&view, &expect);

    // --watch: one compact document per refresh, until stopped.
    let mut watch = Command::new(rendezvous_bin())
        .args([
            "status",
            "statusrun",
            "--json",
            "--watch=0.2",
            "--endpoint",
            &server.endpoint,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        let line = lines.next().expect("a refresh").unwrap();
        let doc: Value = serde_json::from_str(&line).expect("one JSON document per line");
        assert_eq!(states(&doc).len(), 4, "{doc}");
    }
    let _ = watch.kill();
    let _ = watch.wait();

    // A member's agent is killed: the standby takes its place, the dead node is shown lost
    // (with why) and the re-form's lost work is counted.
    let victim = ids.iter().position(|id| *id == members[1]).unwrap();
    agents[victim].signal(nix::sys::signal::Signal::SIGKILL);
    wait_for(
        "generation 2 with the former standby",
        Duration::from_secs(60),
        || {
            server_json().is_some_and(|s| {
                s["generation"] == 2 && states(&s).values().filter(|v| *v == "running").count() == 3
            })
        },
    );
    let s = server_json().unwrap();
    let dead = &s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == members[1].as_str());
    let dead = dead.unwrap_or_else(|| panic!("the killed node is listed: {s}"));
    assert_eq!(dead["state"], "lost", "{s}");
    assert!(dead["why"].as_str().is_some_and(|w| !w.is_empty()), "{s}");
    assert!(s["formation"]["lost_work"]["ms"].as_u64().is_some(), "{s}");
    assert_eq!(s["restarts"]["membership"], 1, "{s}");
    let (code, view, err) = output(Command::new(rendezvous_bin()).args([
        "status",
        "statusrun",
        "--endpoint",
        &server.endpoint,
    ]));
    assert_eq!(code, 0, "{err}");
    check_view(&view, &[(members[1].clone(), "lost")]);
    assert!(
        view.contains("at the last re-form (restarted from the beginning)"),
        "{view}"
    );
    eprintln!("{view}");
    drop(agents);
}

/// The agent hosting a c10d rendezvous answers `drun --status` too.
#[test]
fn status_of_a_c10d_run_asks_the_hosting_agent() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let rdzv = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint.as_str(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let agents = trap_agents(2, "statusc10d", "2", &rdzv, dir.path());
    wait_for("4 workers", Duration::from_secs(60), || {
        (0..4).all(|r| dir.path().join(format!("ready_{r}")).exists())
    });
    let status = || {
        let mut c = drun();
        c.args(["--status", "--json", "--rdzv-id", "statusc10d"])
            .args(rdzv);
        json_of(&mut c)
    };
    let ids: Vec<String> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| node_id(i, a))
        .collect();
    wait_for(
        "both agents running in the status",
        Duration::from_secs(30),
        || {
            status().is_some_and(|s| {
                ids.iter()
                    .all(|id| states(&s).get(id).is_some_and(|v| v == "running"))
            })
        },
    );
    drop(agents);
}

/// Bad input: one line naming the problem and the fix, and the documented exit code.
#[test]
fn status_of_an_unknown_run_or_an_unreachable_server_is_one_line() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let (code, out, err) = output(Command::new(rendezvous_bin()).args([
        "status",
        "nosuchrun",
        "--endpoint",
        &server.endpoint,
    ]));
    assert_eq!(code, 3, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no run named 'nosuchrun'") && err.contains("--rdzv-id"),
        "{err}"
    );

    let dead = format!("127.0.0.1:{}", free_port());
    let mut c = drun();
    c.args(["--status", "--rdzv-endpoint", &dead, "--rdzv-id", "x"]);
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains(&format!("cannot reach the rendezvous server at {dead}")),
        "{err}"
    );

    // A one-node run keeps its rendezvous inside its agent: nothing to ask (exit 2).
    let mut c = drun();
    c.args(["--status"]);
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--rdzv-endpoint"), "{err}");

    // Neither where to read nor whom to ask: both ways are named, not only etcd's.
    let (code, _, err) = output(
        Command::new(rendezvous_bin())
            .args(["status", "somerun"])
            .env_remove("DRUN_ETCD_ENDPOINTS"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--etcd-endpoints") && err.contains("--endpoint <"),
        "{err}"
    );
}

/// `--status` is a flag, not a subcommand: a script named `status.py` still runs.
#[test]
fn a_script_named_status_py_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("status.py");
    std::fs::write(&script, "print('status script ran')\n").unwrap();
    let mut c = drun();
    c.current_dir(dir.path()).arg("status.py");
    let (code, out, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("status script ran"), "{out}\n{err}");
}

/// A server whose etcd is gone answers `status` with its own error: said as the server's
/// answer (exit 3), not as a server that cannot be reached.
#[test]
fn status_through_a_server_whose_store_is_gone_says_the_server_answered() {
    let etcd = Etcd::start();
    let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let status = || {
        output(Command::new(rendezvous_bin()).args([
            "status",
            "somerun",
            "--endpoint",
            &server.endpoint,
        ]))
    };
    let (code, _, err) = status();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no run named 'somerun'"), "{err}");
    drop(etcd);
    let (code, _, err) = status();
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("answered but cannot read the run") && !err.contains("cannot reach"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
