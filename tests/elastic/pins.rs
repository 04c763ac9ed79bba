//! Pinned node ranks (`--node-rank`) in elastic runs are an order: losing any node re-forms the
//! survivors with node ranks 0..n-1 in pin order; duplicate pins form (ties by node id); a round
//! that fails ends every waiting node with the same line and exit 3. Against etcd directly and a
//! `drun-rendezvous` server on its memory store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use super::{gen, pids, stop_all, TTL};
use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::{alive, drun, read_json, torch_python, wait_for, worker, Agent, DrunCmd};

/// The rendezvous under test, kept alive for the test's duration.
enum Backend {
    Etcd(Etcd),
    Memory(RdzvServer),
}

impl Backend {
    fn etcd() -> Backend {
        Backend::Etcd(Etcd::start())
    }

    fn memory() -> Backend {
        Backend::Memory(RdzvServer::start(&["--store", "memory"]))
    }

    /// Rendezvous flags with `conf` as `--rdzv-conf`.
    fn flags(&self, conf: &str) -> Vec<String> {
        let mut v: Vec<String> = match self {
            Backend::Etcd(e) => vec![
                "--rdzv-backend".into(),
                "etcd".into(),
                "--rdzv-endpoint".into(),
                e.endpoint.clone(),
            ],
            Backend::Memory(s) => vec![
                "--rdzv-backend".into(),
                "drun".into(),
                "--rdzv-endpoint".into(),
                s.endpoint.clone(),
            ],
        };
        v.extend(["--rdzv-conf".into(), conf.into()]);
        v
    }
}

/// What every agent of a test run shares.
struct Job<'a> {
    run_id: &'a str,
    nnodes: &'a str,
    nproc: u32,
    rdzv: Vec<String>,
    /// Worker script under `tests/workers/`, called as `script DIR agent<i>`.
    script: &'a str,
    dir: &'a Path,
    /// Workers' Python (torch), else the default.
    python: Option<&'a Path>,
}

impl Job<'_> {
    /// Agent `i` (address 127.0.0.(i+1), label `agent<i>`) with `--node-rank pin`.
    fn agent(&self, i: usize, pin: usize) -> Agent {
        let mut c = drun();
        c.job(self.run_id, self.nnodes)
            .nproc(self.nproc)
            .node(i)
            .quick_shutdown()
            .args(["--node-rank", &pin.to_string()])
            .args(&self.rdzv);
        if let Some(p) = self.python {
            c.python(p);
        }
        c.arg(worker(self.script))
            .arg(self.dir)
            .arg(format!("agent{i}"));
        Agent::start(c)
    }
}

/// The newest generation after `after` whose records show exactly `world` ranks, all of that
/// world size: (generation, records). Waits up to `timeout`.
fn wait_world(dir: &Path, after: u64, world: usize, timeout: Duration) -> (u64, Vec<Value>) {
    let complete = |g: u64| {
        let r = gen(dir, g);
        r.len() == world
            && r.iter()
                .all(|x| x["world_size"].as_str() == Some(world.to_string().as_str()))
    };
    let newest = || (after + 1..after + 50).rev().find(|g| complete(*g));
    wait_for(
        &format!("a generation after {after} with {world} ranks"),
        timeout,
        || newest().is_some(),
    );
    let g = newest().unwrap();
    (g, gen(dir, g))
}

/// Every record's node rank is its agent's place in `order` (pin order), and its global rank
/// follows from it (contiguous per node).
fn ranks_follow(records: &[Value], order: &[usize], nproc: u32) {
    for r in records {
        let label = r["label"].as_str().unwrap();
        let pin: usize = label.trim_start_matches("agent").parse().unwrap();
        let expect = order.iter().position(|p| *p == pin).unwrap_or_else(|| {
            panic!("{label} is not a member: {records:?}");
        });
        let group: u32 = r["group_rank"].as_str().unwrap().parse().unwrap();
        let rank: u32 = r["rank"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            group as usize, expect,
            "{label}: node rank in pin order: {r}"
        );
        assert_eq!(rank / nproc, group, "{label}: contiguous global ranks: {r}");
    }
}

/// 3 agents pinned 0/1/2 (`--nnodes 2:3`); SIGKILL the agent pinned `victim`: its guard kills its
/// workers and the survivors re-form at world 2 with node ranks 0..1 in pin order. With
/// `python`, the workers are torch gloo workers whose all_reduce must add up in both worlds.
fn lose_a_pinned_node(backend: Backend, run_id: &str, victim: usize, python: Option<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let rdzv = backend.flags(&format!("lease_ttl={TTL},last_call_timeout=2"));
    let (script, nproc) = match python {
        Some(_) => ("allreduce.py", 1),
        None => ("elastic.py", 2),
    };
    let job = Job {
        run_id,
        nnodes: "2:3",
        nproc,
        rdzv,
        script,
        dir: dir.path(),
        python: python.as_deref(),
    };
    let mut agents: Vec<Option<Agent>> = (0..3).map(|i| Some(job.agent(i, i))).collect();
    let world = |nodes: usize| nodes * nproc as usize;
    let (g1, first) = wait_world(dir.path(), 0, world(3), Duration::from_secs(120));
    ranks_follow(&first, &[0, 1, 2], nproc);
    let victim_workers: Vec<i32> = pids(
        &first
            .iter()
            .filter(|r| r["label"] == format!("agent{victim}"))
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert_eq!(victim_workers.len(), nproc as usize);
    agents[victim].take().unwrap().signal(Signal::SIGKILL);
    wait_for(
        "the killed node's workers to be gone",
        Duration::from_secs(10),
        || victim_workers.iter().all(|p| !alive(*p)),
    );
    let (_, second) = wait_world(dir.path(), g1, world(2), Duration::from_secs(90));
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    ranks_follow(&second, &survivors, nproc);
    if python.is_some() {
        assert!(
            first.iter().all(|r| r["allreduce"] == 6),
            "1+2+3: {first:?}"
        );
        assert!(
            second.iter().all(|r| r["allreduce"] == 3),
            "1+2: {second:?}"
        );
    }
    let agents: Vec<Agent> = agents.into_iter().flatten().collect();
    for a in &agents {
        assert!(
            !a.stderr_so_far().contains("cannot assign node ranks"),
            "{}",
            a.stderr_so_far()
        );
    }
    stop_all(agents);
}

#[test]
fn losing_pinned_node_rank_0_reforms_in_pin_order_on_etcd_with_torch() {
    let Some(python) = torch_python() else { return };
    lose_a_pinned_node(Backend::etcd(), "pin0-etcd", 0, Some(python));
}

#[test]
fn losing_pinned_node_rank_0_reforms_in_pin_order_on_the_memory_server() {
    lose_a_pinned_node(Backend::memory(), "pin0-mem", 0, None);
}

#[test]
fn losing_pinned_node_rank_1_reforms_in_pin_order_on_etcd() {
    lose_a_pinned_node(Backend::etcd(), "pin1-etcd", 1, None);
}

#[test]
fn losing_pinned_node_rank_1_reforms_in_pin_order_on_the_memory_server_with_torch() {
    let Some(python) = torch_python() else { return };
    lose_a_pinned_node(Backend::memory(), "pin1-mem", 1, Some(python));
}

/// Two agents both pinned to node rank 0 form one group: the tie goes by node id (agent0's
/// address sorts first) and every agent prints the same warning line.
fn duplicate_pins_form(backend: Backend, run_id: &str) {
    let dir = tempfile::tempdir().unwrap();
    let rdzv = backend.flags(&format!("lease_ttl={TTL}"));
    let job = Job {
        run_id,
        nnodes: "2",
        nproc: 1,
        rdzv,
        script: "envdump.py",
        dir: dir.path(),
        python: None,
    };
    // Both say --node-rank 0; only the address (and so the node id) differs.
    let agents: Vec<Agent> = (0..2).map(|i| job.agent(i, 0)).collect();
    let mut warnings = Vec::new();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "agent {i}: {err}");
        let w = err
            .lines()
            .find(|l| l.contains("2 nodes pinned node rank 0"))
            .unwrap_or_else(|| panic!("agent {i} warns about the tie: {err}"))
            .to_string();
        assert!(w.contains("ties go by node id"), "{w}");
        // The message itself, without the agent's own `node=` field.
        let msg = &w[w.find("2 nodes pinned").unwrap()..];
        warnings.push(msg[..msg.find(" node=").unwrap_or(msg.len())].to_string());
    }
    assert_eq!(warnings[0], warnings[1], "the same line on every agent");
    for rank in 0..2 {
        let env = &read_json(&dir.path().join(format!("env_{rank}.json")))["env"];
        assert_eq!(env["GROUP_RANK"], rank.to_string().as_str());
        assert_eq!(env["WORLD_SIZE"], "2");
        // 127.0.0.1_<pid> sorts before 127.0.0.2_<pid>.
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
    }
}

#[test]
fn duplicate_pins_form_with_ties_by_node_id_on_etcd() {
    duplicate_pins_form(Backend::etcd(), "dup-etcd");
}

#[test]
fn duplicate_pins_form_with_ties_by_node_id_on_the_memory_server() {
    duplicate_pins_form(Backend::memory(), "dup-mem");
}

/// A round that fails (2 of min 3 nodes by `join_timeout`) ends both waiting agents with exit 3
/// and the very same error line: the decider's verdict, published to the other.
fn failed_round_is_one_line_everywhere(backend: Backend, run_id: &str) {
    let dir = tempfile::tempdir().unwrap();
    let rdzv = backend.flags(&format!("lease_ttl={TTL},join_timeout=3"));
    let job = Job {
        run_id,
        nnodes: "3",
        nproc: 1,
        rdzv,
        script: "envdump.py",
        dir: dir.path(),
        python: None,
    };
    let first = job.agent(0, 0);
    wait_for(
        "the first agent to wait in the rendezvous",
        Duration::from_secs(30),
        || first.stderr_so_far().contains("waiting for 2 more nodes"),
    );
    let second = job.agent(1, 1);
    let mut lines = Vec::new();
    for (i, a) in [first, second].into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(30));
        assert_eq!(code, 3, "agent {i}: {err}");
        let error: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("drun: error:"))
            .collect();
        assert_eq!(error.len(), 1, "one error line: {err}");
        lines.push(error[0].to_string());
    }
    assert_eq!(lines[0], lines[1], "the same reason on every node");
    assert!(
        lines[0].contains("only 2 of min 3") && lines[0].contains("127.0.0.2_"),
        "names who came: {}",
        lines[0]
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "no worker started"
    );
}

#[test]
fn a_failed_round_ends_every_node_with_the_same_line_on_etcd() {
    failed_round_is_one_line_everywhere(Backend::etcd(), "fail-etcd");
}

#[test]
fn a_failed_round_ends_every_node_with_the_same_line_on_the_memory_server() {
    failed_round_is_one_line_everywhere(Backend::memory(), "fail-mem");
}
