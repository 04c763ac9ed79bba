//! Straggler reports from step beacons (`--straggler-factor`): 2 agents × 2 stdlib workers.

use std::time::Duration;

use crate::harness::cluster::{pinned_node, rendezvous_bin, RdzvServer};
use crate::harness::{wait_for, Agent, DrunCmd};

/// Node `i` of the 2-node run `run` on `server`: 2 workers of `straggle_steps.py STEPS SLOW`.
fn node(server: &RdzvServer, run: &str, i: usize, steps: u32, slow: i32) -> Agent {
    pinned_node(
        server,
        run,
        i,
        "straggle_steps.py",
        &[steps.to_string(), slow.to_string()],
    )
}

fn straggler_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.contains("straggler: rank"))
        .collect()
}

/// Rank 3 (node 1, local rank 1) steps 3× slower than the others (300 steps): soon after the
/// start (45 s allow for a busy machine; it takes about 3 s) node 1 prints
/// exactly one straggler line naming rank 3 and node 1; node 0 prints none.
#[test]
fn a_three_times_slower_rank_is_reported_once_as_a_straggler() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let a = node(&server, "straggler", 0, 300, 3);
    let b = node(&server, "straggler", 1, 300, 3);
    wait_for(
        "node 1 reports rank 3 as a straggler",
        Duration::from_secs(45),
        || !straggler_lines(&b.stderr_so_far()).is_empty(),
    );
    // While the job runs, `status` carries node 1's report: rank 3 and its step time.
    let reported = || {
        let o = std::process::Command::new(rendezvous_bin())
            .args([
                "status",
                "straggler",
                "--json",
                "--endpoint",
                &server.endpoint,
            ])
            .output()
            .expect("run drun-rendezvous status");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let nodes = v["reports"]["stragglers"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        nodes.values().any(|r| {
            r["node_rank"] == 1
                && r["stragglers"][0]["rank"] == 3
                && r["stragglers"][0]["step_time"].as_f64() > r["stragglers"][0]["median"].as_f64()
        })
    };
    wait_for(
        "status names rank 3 a straggler",
        Duration::from_secs(20),
        reported,
    );
    let (code_a, _, err_a) = a.wait(Duration::from_secs(120));
    let (code_b, _, err_b) = b.wait(Duration::from_secs(120));
    assert_eq!((code_a, code_b), (0, 0), "A:\n{err_a}\nB:\n{err_b}");
    let lines = straggler_lines(&err_b);
    assert_eq!(lines.len(), 1, "{err_b}");
    assert!(
        lines[0].contains("straggler: rank 3 (node 1, host ") && lines[0].contains("job median"),
        "{}",
        lines[0]
    );
    assert!(straggler_lines(&err_a).is_empty(), "{err_a}");
    assert!(!err_b.contains("no longer a straggler"), "{err_b}");
}

/// Every rank steps at the same pace (with ±20 % noise) for 300 steps: no straggler line.
#[test]
fn even_ranks_are_never_reported_as_stragglers() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let a = node(&server, "even", 0, 300, -1);
    let b = node(&server, "even", 1, 300, -1);
    let (code_a, _, err_a) = a.wait(Duration::from_secs(120));
    let (code_b, _, err_b) = b.wait(Duration::from_secs(120));
    assert_eq!((code_a, code_b), (0, 0), "A:\n{err_a}\nB:\n{err_b}");
    for err in [&err_a, &err_b] {
        assert!(!err.contains("straggler"), "{err}");
    }
}

/// One worker per node (2 agents): node-locally rank 1 has nobody to lag behind; the job's
/// pace (each node reports its ranks' step times through the rendezvous every 5 s) gives it
/// node 0's rank as the median, and node 1 names it once.
#[test]
fn a_slow_rank_alone_on_its_node_is_named_from_the_jobs_pace() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = crate::harness::drun();
            c.job("pace", "2")
                .nproc(1)
                .node(i)
                .args([
                    "--rdzv-backend",
                    "drun",
                    "--rdzv-endpoint",
                    &server.endpoint,
                ])
                .args(["--node-rank", &i.to_string(), "--max-restarts", "0"])
                .quick_shutdown()
                .arg(crate::harness::worker("straggle_steps.py"))
                .args(["400", "1"]);
            Agent::start(c)
        })
        .collect();
    wait_for(
        "node 1 reports rank 1 as a straggler",
        Duration::from_secs(60),
        || !straggler_lines(&agents[1].stderr_so_far()).is_empty(),
    );
    let mut errs = Vec::new();
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(120));
        assert_eq!(code, 0, "{err}");
        errs.push(err);
    }
    let lines = straggler_lines(&errs[1]);
    assert_eq!(lines.len(), 1, "{}", errs[1]);
    assert!(
        lines[0].contains("straggler: rank 1 (node 1, host "),
        "{}",
        lines[0]
    );
    assert!(straggler_lines(&errs[0]).is_empty(), "{}", errs[0]);
}
