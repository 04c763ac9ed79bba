//! Elastic re-formation with real agents, real etcd and real signals (docs/architecture.md §2).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::{
    alive, drun, holds_for, processes_of_run, stop_all, torch_python, wait_for, worker, Agent,
    DrunCmd,
};

mod failed_round;
mod host_stop;
mod pins;
mod reconnect;

/// Lease TTL used by these tests, in seconds.
const TTL: u64 = 3;

fn rdzv_etcd(etcd: &Etcd) -> Vec<String> {
    vec![
        "--rdzv-backend".into(),
        "etcd".into(),
        "--rdzv-endpoint".into(),
        etcd.endpoint.clone(),
        "--rdzv-conf".into(),
        format!("lease_ttl={TTL},last_call_timeout=0.5"),
    ]
}

fn agent(i: usize, run: &str, nnodes: &str, rdzv: &[String], extra: &[&str], dir: &Path) -> Agent {
    let mut c: Command = crate::harness::node_cmd(i, run, nnodes, rdzv);
    c.quick_shutdown()
        .args(extra)
        .arg(worker("elastic.py"))
        .arg(dir)
        .arg(format!("agent{i}"));
    Agent::start(c)
}

/// Records of generation `g` (one per rank).
fn gen(dir: &Path, g: u64) -> Vec<Value> {
    let mut v = crate::harness::gen_records(dir, g);
    v.sort_by_key(|r| r["rank"].as_str().unwrap().parse::<u32>().unwrap());
    v
}

fn pids(records: &[Value]) -> Vec<i32> {
    records
        .iter()
        .map(|r| r["pid"].as_i64().unwrap() as i32)
        .collect()
}

fn by_label<'a>(records: &'a [Value], label: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["label"] == label).collect()
}

/// Waits until generation `g` has `world` ranks, all reporting that world size.
fn wait_gen(dir: &Path, g: u64, world: usize, timeout: Duration) -> Vec<Value> {
    wait_for(
        &format!("generation {g} with {world} ranks"),
        timeout,
        || {
            let r = gen(dir, g);
            r.len() == world
                && r.iter()
                    .all(|x| x["world_size"].as_str() == Some(world.to_string().as_str()))
        },
    );
    gen(dir, g)
}

#[test]
fn node_loss_reforms_the_survivors_within_ttl() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    let mut agents: Vec<Agent> = (0..3)
        .map(|i| agent(i, "loss", "2:3", &rdzv, &[], dir.path()))
        .collect();
    let g1 = wait_gen(dir.path(), 1, 6, Duration::from_secs(60));
    let victim = agents.remove(2);
    let victim_workers = pids(
        &by_label(&g1, "agent2")
            .into_iter()
            .cloned()
            .collect::<Vec<_>>(),
    );
    let t0 = Instant::now();
    victim.signal(Signal::SIGKILL);
    let g2 = wait_gen(dir.path(), 2, 4, Duration::from_secs(TTL + 2));
    eprintln!(
        "re-formed into generation 2 after {:?} (TTL {TTL} s)",
        t0.elapsed()
    );
    assert!(by_label(&g2, "agent2").is_empty());
    assert!(
        g2.iter().all(|r| r["restart_count"] == "0"),
        "membership changes are free"
    );
    assert!(g2.iter().all(|r| r["restarts_membership"] == "1"), "{g2:?}");
    wait_for(
        "no process of the killed node or of generation 1 survives",
        Duration::from_secs(5),
        || pids(&g1).iter().all(|p| !alive(*p)),
    );
    assert!(victim_workers.iter().all(|p| !alive(*p)));
    drop(victim);
    stop_all(agents);
}

#[test]
fn a_stopped_node_is_fenced_then_rejoins_and_the_group_scales_back_up() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    let agents: Vec<Agent> = (0..3)
        .map(|i| agent(i, "stop", "2:3", &rdzv, &[], dir.path()))
        .collect();
    let g1 = wait_gen(dir.path(), 1, 6, Duration::from_secs(60));
    let stale = pids(
        &by_label(&g1, "agent2")
            .into_iter()
            .cloned()
            .collect::<Vec<_>>(),
    );
    agents[2].signal(Signal::SIGSTOP);
    let t0 = Instant::now();
    let g2 = wait_gen(dir.path(), 2, 4, Duration::from_secs(TTL + 5));
    assert!(by_label(&g2, "agent2").is_empty());
    let woke = t0 + Duration::from_secs(2 * TTL);
    std::thread::sleep(woke.saturating_duration_since(Instant::now()));
    agents[2].signal(Signal::SIGCONT);
    wait_for(
        "the stale node's workers are killed once it wakes",
        Duration::from_secs(10),
        || stale.iter().all(|p| !alive(*p)),
    );
    let g3 = wait_gen(dir.path(), 3, 6, Duration::from_secs(30));
    assert_eq!(
        by_label(&g3, "agent2").len(),
        2,
        "the fenced node came back as a member"
    );
    // Never two worlds at once: generation 2's workers are all gone in generation 3.
    wait_for("generation 2 workers gone", Duration::from_secs(10), || {
        pids(&g2).iter().all(|p| !alive(*p))
    });
    stop_all(agents);
}

#[test]
fn sigterm_to_the_first_joined_agent_makes_it_leave_and_the_others_reform() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    let first = agent(0, "leave", "2:3", &rdzv, &[], dir.path());
    wait_for(
        "the first agent to wait in the rendezvous",
        Duration::from_secs(30),
        || first.stderr_so_far().contains("waiting for 1 more node"),
    );
    let others: Vec<Agent> = (1..3)
        .map(|i| agent(i, "leave", "2:3", &rdzv, &[], dir.path()))
        .collect();
    wait_gen(dir.path(), 1, 6, Duration::from_secs(60));
    first.signal(Signal::SIGTERM);
    let (code, _, err) = first.wait(Duration::from_secs(30));
    assert_eq!(code, 143, "{err}");
    let g2 = wait_gen(dir.path(), 2, 4, Duration::from_secs(20));
    assert!(by_label(&g2, "agent0").is_empty());
    assert!(
        others.iter().all(|a| alive(a.pid())),
        "leaving does not end the run"
    );
    stop_all(others);
}

#[test]
fn restart_budget_is_job_wide_and_the_summary_names_both_failures() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    // Node rank 0 fails in the first attempt, node rank 1 in the second: with --max-restarts 1
    // the second failure ends the job on both nodes.
    let mk = |i: usize| {
        let mut c = drun();
        c.job("budget", "2")
            .nproc(2)
            .node(i)
            .quick_shutdown()
            .args(["--max-restarts", "1", "--node-rank", &i.to_string()])
            .args(&rdzv)
            .arg(worker("elastic.py"))
            .arg(dir.path())
            .arg(format!("agent{i}"))
            .arg("0:0,1:1");
        Agent::start(c)
    };
    let agents = vec![mk(0), mk(1)];
    let mut errs = Vec::new();
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 1, "{err}");
        errs.push(err);
    }
    let g2 = gen(dir.path(), 2);
    assert!(
        g2.iter().all(|r| r["restart_count"] == "1"),
        "every rank sees the same count: {g2:?}"
    );
    // The failing node's own summary; the other node names the same failure as a remote one.
    let summary = errs
        .iter()
        .find(|e| e.contains("Root Cause (first observed failure)"))
        .expect("a failure summary");
    let first = summary
        .find("earlier, generation 1:")
        .expect("the first failure is listed");
    let root = summary.find("Root Cause").unwrap();
    assert!(first < root, "{summary}");
    assert!(
        summary[first..].contains("on node 127.0.0.1_"),
        "first failure on node rank 0: {summary}"
    );
    assert!(
        summary.contains("  rank      : 2 (local_rank: 0)"),
        "second failure on node rank 1: {summary}"
    );
    let other = errs
        .iter()
        .find(|e| !e.contains("Root Cause (first observed failure)"))
        .expect("the other agent");
    assert!(other.contains("restart budget spent"), "{other}");
    assert!(
        other.contains("Root Cause (first failure of generation 2, on node 127.0.0.2_")
            && other.contains("rank      : 2 (local_rank: 0)"),
        "the other node names node rank 1's failure: {other}"
    );
}

#[test]
fn a_node_arriving_mid_run_triggers_exactly_one_reform() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    let mut agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "grow", "2:3", &rdzv, &[], dir.path()))
        .collect();
    wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    agents.push(agent(2, "grow", "2:3", &rdzv, &[], dir.path()));
    let g2 = wait_gen(dir.path(), 2, 6, Duration::from_secs(30));
    assert_eq!(by_label(&g2, "agent2").len(), 2);
    holds_for("no further re-form", Duration::from_secs(2 * TTL), || {
        gen(dir.path(), 3).is_empty()
    });
    stop_all(agents);
}

/// Two newcomers arriving 1.5 s apart to a running `--nnodes 2:5` group with a 4 s last call
/// are admitted together: one re-form (generation 2 with all four nodes), while the first two
/// train on meanwhile; no generation of three.
fn arrivals_within_the_last_call_are_admitted_in_one_reform(rdzv: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let mut agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "arrivals", "2:5", rdzv, &[], dir.path()))
        .collect();
    let g1 = wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    agents.push(agent(2, "arrivals", "2:5", rdzv, &[], dir.path()));
    // The scenario: the second newcomer arrives 1.5 s after the first (pods scheduled one by one).
    std::thread::sleep(Duration::from_millis(1500));
    agents.push(agent(3, "arrivals", "2:5", rdzv, &[], dir.path()));
    let g2 = wait_gen(dir.path(), 2, 8, Duration::from_secs(60));
    assert_eq!(by_label(&g2, "agent2").len(), 2);
    assert_eq!(by_label(&g2, "agent3").len(), 2);
    holds_for("no further re-form", Duration::from_secs(2 * TTL), || {
        gen(dir.path(), 3).is_empty()
    });
    assert!(
        pids(&g1).iter().all(|p| !crate::harness::alive(*p)),
        "generation 1's workers were replaced once"
    );
    let leader = agents[0].stderr_so_far() + &agents[1].stderr_so_far();
    assert!(
        leader.contains(
            "are waiting to join (scale-up), admitted together at the end of the last call (4 s)"
        ),
        "one re-form admitted both newcomers:\n{leader}"
    );
    stop_all(agents);
}

#[test]
fn arrivals_within_the_last_call_are_admitted_in_one_reform_etcd() {
    let etcd = Etcd::start();
    let mut rdzv = rdzv_etcd(&etcd);
    *rdzv.last_mut().unwrap() = format!("lease_ttl={TTL},last_call_timeout=4");
    arrivals_within_the_last_call_are_admitted_in_one_reform(&rdzv);
}

#[test]
fn arrivals_within_the_last_call_are_admitted_in_one_reform_memory() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = vec![
        "--rdzv-endpoint".to_string(),
        server.endpoint.clone(),
        "--rdzv-conf".into(),
        format!("lease_ttl={TTL},last_call_timeout=4"),
    ];
    arrivals_within_the_last_call_are_admitted_in_one_reform(&rdzv);
}

#[test]
fn rendezvous_server_restart_does_not_disturb_workers() {
    let etcd = Etcd::start();
    let mut server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let endpoint = server.endpoint.clone();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = vec!["--rdzv-endpoint".to_string(), endpoint.clone()];
    let agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "srv", "2", &rdzv, &[], dir.path()))
        .collect();
    let g1 = wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    server.kill();
    holds_for(
        "workers undisturbed while the server is down",
        Duration::from_secs(3),
        || pids(&g1).iter().all(|p| alive(*p)) && gen(dir.path(), 2).is_empty(),
    );
    let _server = RdzvServer::start_on(
        &endpoint,
        &["--store", "etcd", "--etcd-endpoints", &etcd.endpoint],
    );
    holds_for(
        "workers undisturbed after the server came back",
        Duration::from_secs(12),
        || pids(&g1).iter().all(|p| alive(*p)) && gen(dir.path(), 2).is_empty(),
    );
    stop_all(agents);
}

#[test]
fn a_killed_worker_stops_peers_blocked_in_a_collective() {
    let Some(python) = torch_python() else { return };
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = drun();
            c.job("ring", "2")
                .nproc(1)
                .node(i)
                .quick_shutdown()
                .python(&python)
                .args(["--max-restarts", "1"])
                .args(&rdzv)
                .arg(worker("ring.py"))
                .arg(dir.path());
            Agent::start(c)
        })
        .collect();
    let g1 = wait_gen(dir.path(), 1, 2, Duration::from_secs(120));
    let t0 = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids(&g1)[1]), Signal::SIGKILL).unwrap();
    wait_gen(dir.path(), 2, 2, Duration::from_secs(60));
    eprintln!(
        "all workers restarted {:?} after the kill (collective timeout: 30 min)",
        t0.elapsed()
    );
    assert!(
        pids(&g1).iter().all(|p| !alive(*p)),
        "the blocked peer was stopped"
    );
    stop_all(agents);
}

#[test]
fn etcd_outage_longer_than_ttl_fences_in_bounded_time_then_the_group_recovers() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    let agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "outage", "2", &rdzv, &[], dir.path()))
        .collect();
    let g1 = wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    etcd.signal(Signal::SIGSTOP);
    let t0 = Instant::now();
    wait_for(
        "agents to self-fence and stop their workers",
        Duration::from_secs(TTL + 5),
        || pids(&g1).iter().all(|p| !alive(*p)),
    );
    eprintln!(
        "workers stopped {:?} into the etcd outage (TTL {TTL} s)",
        t0.elapsed()
    );
    etcd.signal(Signal::SIGCONT);
    wait_gen(dir.path(), 2, 4, Duration::from_secs(30));
    // Nobody closed generation 1 (every agent was fenced): the re-form still counts.
    let o = Command::new(crate::harness::cluster::rendezvous_bin())
        .args([
            "status",
            "outage",
            "--json",
            "--etcd-endpoints",
            &etcd.endpoint,
        ])
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(status["generation"], 2, "{status}");
    assert_eq!(status["restarts"]["membership"], 1, "{status}");
    assert_eq!(status["restarts"]["failures"], 0, "{status}");
    stop_all(agents);
}

/// A tiny deterministic generator, so a failing campaign can be replayed from its seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

#[test]
fn fault_campaign_leaves_no_orphans_and_never_hangs() {
    let seed = std::env::var("DRUN_CAMPAIGN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42u64);
    let mut rng = Lcg(seed);
    let etcd = Etcd::start();
    let mut server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let endpoint = server.endpoint.clone();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = vec![
        "--rdzv-endpoint".to_string(),
        endpoint.clone(),
        "--rdzv-conf".to_string(),
        format!("lease_ttl={TTL},last_call_timeout=0.5"),
    ];
    let run = format!("campaign{seed}");
    let extra = ["--max-restarts", "1000"];
    let mut agents: Vec<Option<Agent>> = (0..3)
        .map(|i| Some(agent(i, &run, "2:3", &rdzv, &extra, dir.path())))
        .collect();
    wait_gen(dir.path(), 1, 6, Duration::from_secs(60));
    let mut log = Vec::new();
    for n in 0..50 {
        let live: Vec<usize> = (0..agents.len()).filter(|i| agents[*i].is_some()).collect();
        match rng.next(5) {
            0 => {
                // SIGKILL a random worker of the newest generation.
                let latest = (1..200u64)
                    .rev()
                    .find(|g| !gen(dir.path(), *g).is_empty())
                    .unwrap_or(1);
                let ws = pids(&gen(dir.path(), latest));
                let p = ws[rng.next(ws.len())];
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), Signal::SIGKILL);
                log.push(format!("{n}: SIGKILL worker {p} (gen {latest})"));
            }
            1 if live.len() > 2 => {
                let i = live[rng.next(live.len())];
                agents[i].take().unwrap().signal(Signal::SIGKILL);
                log.push(format!("{n}: SIGKILL agent{i}"));
            }
            1 => {
                let i = (0..agents.len())
                    .find(|i| agents[*i].is_none())
                    .unwrap_or(agents.len());
                let a = agent(i, &run, "2:3", &rdzv, &extra, dir.path());
                if i == agents.len() {
                    agents.push(Some(a));
                } else {
                    agents[i] = Some(a);
                }
                log.push(format!("{n}: start agent{i}"));
            }
            2 => {
                let i = live[rng.next(live.len())];
                let a = agents[i].as_ref().unwrap();
                a.signal(Signal::SIGSTOP);
                let ms = 200 + rng.next(2 * TTL as usize * 1000);
                std::thread::sleep(Duration::from_millis(ms as u64));
                a.signal(Signal::SIGCONT);
                log.push(format!("{n}: SIGSTOP agent{i} for {ms} ms"));
            }
            3 => {
                server.kill();
                std::thread::sleep(Duration::from_millis(200 + rng.next(1500) as u64));
                server = RdzvServer::start_on(
                    &endpoint,
                    &["--store", "etcd", "--etcd-endpoints", &etcd.endpoint],
                );
                log.push(format!("{n}: restart the rendezvous server"));
            }
            _ => {
                let i = live[rng.next(live.len())];
                let a = agents[i].as_ref().unwrap();
                a.signal(Signal::SIGUSR1);
                log.push(format!("{n}: SIGUSR1 agent{i}"));
            }
        }
        std::thread::sleep(Duration::from_millis(300 + rng.next(700) as u64));
    }
    eprintln!("campaign (seed {seed}):\n{}", log.join("\n"));
    // The job must end within a deadline: every agent leaves on SIGTERM with a documented code.
    let survivors: Vec<Agent> = agents.into_iter().flatten().collect();
    for a in &survivors {
        a.signal(Signal::SIGCONT);
        a.signal(Signal::SIGTERM);
    }
    for a in survivors {
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert!(
            [0, 1, 3, 4, 143].contains(&code),
            "undocumented exit {code}: {err}"
        );
    }
    wait_for(
        "no process of the run left",
        Duration::from_secs(10),
        || processes_of_run(&run).is_empty(),
    );
}

#[test]
fn below_min_the_survivor_waits_then_exits_3_naming_who_came() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = vec![
        "--rdzv-backend".to_string(),
        "etcd".into(),
        "--rdzv-endpoint".into(),
        etcd.endpoint.clone(),
        "--rdzv-conf".into(),
        format!("lease_ttl={TTL},join_timeout=4"),
    ];
    let mut agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "below", "2", &rdzv, &[], dir.path()))
        .collect();
    wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    agents.remove(1).signal(Signal::SIGKILL);
    let (code, _, err) = agents.remove(0).wait(Duration::from_secs(30));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("waiting for 1 more node (1/2)"),
        "progress while below MIN: {err}"
    );
    let error = err
        .lines()
        .find(|l| l.starts_with("drun: error:"))
        .expect("one error line");
    assert!(
        error.contains("1 of min 2") && error.contains("127.0.0.1_"),
        "names who came: {error}"
    );
}

/// A node whose agent left (SIGTERM: it says so) is gone, not cut off: the survivor waiting
/// below MIN does not warn that its probes go unanswered, nor report a partition (a user saw
/// `status` show `partition node 0 ↔ node 1` for as long as the survivor waited).
#[test]
fn a_node_that_left_is_not_reported_unreachable_while_the_survivor_waits_below_min() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let dir = tempfile::tempdir().unwrap();
    let rdzv = vec![
        "--rdzv-endpoint".to_string(),
        server.endpoint.clone(),
        "--rdzv-conf".into(),
        "join_timeout=5".into(),
    ];
    let mut agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "left", "2", &rdzv, &[], dir.path()))
        .collect();
    wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    let leaving = agents.remove(1);
    leaving.signal(Signal::SIGTERM);
    let (code, _, err) = leaving.wait(Duration::from_secs(30));
    assert_eq!(code, 143, "{err}");
    let (code, _, err) = agents.remove(0).wait(Duration::from_secs(60));
    assert_eq!(code, 3, "below MIN until the join timeout: {err}");
    assert!(err.contains("waiting for 1 more node"), "{err}");
    assert!(!err.contains("cannot reach node rank"), "{err}");
    let status = std::process::Command::new(crate::harness::cluster::rendezvous_bin())
        .args(["status", "left", "--endpoint", &server.endpoint])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(!text.contains('↔'), "no broken pair: {text}");
}

#[test]
fn a_worker_failure_stays_the_primary_error_when_the_rendezvous_is_gone() {
    let mut server = RdzvServer::start(&["--store", "memory"]);
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("fail-now");
    // Both agents answer each other's probes, so each holds on to its failure's report for a
    // server to come back, until the join timeout gives the server up (`join_timeout`, short
    // here; 600 s by default).
    let conf = format!("lease_ttl={TTL},join_timeout={GIVE_UP}");
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = drun();
            c.args(["-q", "--nnodes", "2", "--rdzv-id", "gone", "--max-restarts", "3"])
                .args(["--rdzv-endpoint", &server.endpoint, "--rdzv-conf", &conf])
                .node(i)
                .args(["--no-python", "sh", "-c"])
                .arg("touch \"$0.$RANK\"; while [ ! -e \"$0\" ]; do sleep 0.05; done; echo boom >&2; exit 7")
                .arg(&trigger);
            Agent::start(c)
        })
        .collect();
    wait_for("both workers started", Duration::from_secs(60), || {
        (0..2).all(|r| dir.path().join(format!("fail-now.{r}")).exists())
    });
    server.kill();
    let killed = std::time::Instant::now();
    std::fs::write(&trigger, b"").unwrap();
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert!(
            killed.elapsed() >= Duration::from_secs(GIVE_UP - 1),
            "held on until the join timeout, not only the TTL:\n{err}"
        );
        // 3, not 1: with 3 restarts left the budget was never consulted (the rendezvous is
        // gone), and 1 would tell an operator's failure policy it was spent.
        assert_eq!(code, 3, "{err}");
        let summary = err
            .find("sh FAILED")
            .expect("the worker failure comes first");
        let also = err
            .find("drun: also: could not report the failure")
            .expect("the rendezvous problem is appended");
        assert!(summary < also, "{err}");
        assert!(err.contains("exitcode  : 7"), "{err}");
        assert!(err.contains("lost the rendezvous server"), "{err}");
    }
}

/// How long the agents of `a_worker_failure_stays_the_primary_error_when_the_rendezvous_is_gone`
/// wait for a server (their join timeout), in seconds.
const GIVE_UP: u64 = 8;

#[test]
fn etcd_restarted_with_a_wiped_data_dir_is_a_new_generation() {
    let mut etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let rdzv = rdzv_etcd(&etcd);
    let agents: Vec<Agent> = (0..2)
        .map(|i| agent(i, "wiped", "2", &rdzv, &[], dir.path()))
        .collect();
    let before = wait_gen(dir.path(), 1, 4, Duration::from_secs(60));
    etcd.restart_wiped();
    // The leases are gone with the data: every agent is fenced, kills its workers and the group
    // forms again from generation 1 of the new store.
    wait_for(
        "a new group on the wiped store",
        Duration::from_secs(30),
        || {
            let now = gen(dir.path(), 1);
            now.len() == 4
                && pids(&now)
                    .iter()
                    .all(|p| !pids(&before).contains(p) && alive(*p))
        },
    );
    assert!(
        pids(&before).iter().all(|p| !alive(*p)),
        "old workers are gone"
    );
    stop_all(agents);
}
