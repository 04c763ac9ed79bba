//! The root cause across nodes: a worker failing on node B is named in node A's summary.

use std::time::Duration;

use crate::harness::cluster::{rendezvous_bin, RdzvServer};
use crate::harness::{node_cmd, worker, Agent};

/// Two agents × 2 workers, `--max-restarts 0`; rank 3 (node rank 1's local rank 1) prints a line
/// to stderr and exits 7. Both agents fail; A, whose workers were only stopped, names B's node,
/// rank, exit code and the worker's last line.
#[test]
fn a_worker_failure_on_node_b_is_named_in_node_a_summary() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
    ];
    let start = |i: usize| {
        let mut c = node_cmd(i, "rootcause", "2", &rdzv);
        c.args(["--node-rank", &i.to_string(), "--max-restarts", "0"])
            .args(["--shutdown-timeout", "3"])
            .arg(worker("exit_code.py"))
            .args(["7", "3", "1"]);
        Agent::start(c)
    };
    let a = start(0);
    let b = start(1);
    let b_node = format!("127.0.0.2_{}", b.pid());
    let (code_b, _, err_b) = b.wait(Duration::from_secs(90));
    let (code_a, _, err_a) = a.wait(Duration::from_secs(90));
    assert_eq!(code_b, 1, "node B: {err_b}");
    assert_eq!(code_a, 1, "node A: {err_a}");
    // B's own summary: its worker is the root cause.
    assert!(err_b.contains("rank      : 3 (local_rank: 1)"), "{err_b}");
    // A's summary names B's node, rank, exit code and message.
    for want in [
        "exit_code.py FAILED",
        &format!("Root Cause (first failure of generation 1, on node {b_node})"),
        "rank      : 3 (local_rank: 1)",
        "exitcode  : 7 (pid: ",
        "message   : rank 3 exiting with 7",
    ] {
        assert!(err_a.contains(want), "node A lacks {want:?}:\n{err_a}");
    }
    // The store holds it: `status` lists it with the run's end.
    let out = std::process::Command::new(rendezvous_bin())
        .args(["status", "rootcause", "--endpoint", &server.endpoint])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("status is not JSON ({e}): {out:?}"));
    let recorded = &status["root_causes"][0];
    assert_eq!(recorded["node"], b_node.as_str(), "{status}");
    assert_eq!(recorded["generation"], 1, "{status}");
    assert_eq!(recorded["rank"], 3, "{status}");
    assert_eq!(recorded["exitcode"], 7, "{status}");
    assert_eq!(recorded["message"], "rank 3 exiting with 7", "{status}");
    assert_eq!(status["finished"]["root_cause"], *recorded, "{status}");
    let failed = err_a
        .lines()
        .find(|l| l.starts_with("drun: run rootcause failed:"))
        .unwrap_or_else(|| panic!("no failure line on node A:\n{err_a}"));
    assert!(
        failed.contains("rank 3 (local_rank 1) exited with 7 (pid ")
            && failed.contains(&format!("on node {b_node}: rank 3 exiting with 7")),
        "{failed}"
    );
}
