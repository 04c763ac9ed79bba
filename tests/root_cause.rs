//! The root cause across nodes: a worker failing on node B is named in node A's summary.

use std::time::Duration;

use crate::harness::cluster::{pinned_node, rendezvous_bin, RdzvServer};
use crate::harness::{drun, run, Agent, DrunCmd};

/// Node `i` of a 2-node run `run` on `server`, 2 workers, `--max-restarts 0`: the ranks in
/// `ranks` (comma-separated) print a line to stderr and exit with `code`.
fn failing_node(server: &RdzvServer, run: &str, i: usize, code: &str, ranks: &str) -> Agent {
    pinned_node(server, run, i, "exit_code.py", &[code, ranks, "1"])
}

/// Two agents × 2 workers, `--max-restarts 0`; rank 3 (node rank 1's local rank 1) prints a line
/// to stderr and exits 7. Both agents fail; A, whose workers were only stopped, names B's node,
/// rank, exit code and the worker's last line.
#[test]
fn a_worker_failure_on_node_b_is_named_in_node_a_summary() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let start = |i: usize| failing_node(&server, "rootcause", i, "7", "3");
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
        .args([
            "status",
            "rootcause",
            "--json",
            "--endpoint",
            &server.endpoint,
        ])
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

/// Both nodes' workers fail at once (ranks 0 and 3): whichever failure the rendezvous decides
/// first is the run's root cause, and the other node names it after its own summary.
#[test]
fn when_both_nodes_fail_at_once_each_names_the_one_root_cause() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let start = |i: usize| failing_node(&server, "bothfail", i, "5", "0,3");
    let agents = [start(0), start(1)];
    let nodes: Vec<String> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| format!("127.0.0.{}_{}", i + 1, a.pid()))
        .collect();
    let errs: Vec<String> = agents
        .into_iter()
        .map(|a| {
            let (code, _, err) = a.wait(Duration::from_secs(90));
            assert_eq!(code, 1, "{err}");
            err
        })
        .collect();
    let out = std::process::Command::new(rendezvous_bin())
        .args([
            "status",
            "bothfail",
            "--json",
            "--endpoint",
            &server.endpoint,
        ])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = &status["root_causes"][0];
    let root_node = root["node"].as_str().expect("a recorded root cause");
    let i = nodes
        .iter()
        .position(|n| n == root_node)
        .unwrap_or_else(|| panic!("{root_node} is not one of {nodes:?}"));
    let rank = if i == 0 { 0 } else { 3 };
    assert_eq!(root["rank"], rank, "{status}");
    let other = &errs[1 - i];
    for want in [
        format!("Root Cause (first failure of generation 1, on node {root_node})"),
        format!("message   : rank {rank} exiting with 5"),
    ] {
        assert!(
            other.contains(&want),
            "node {} lacks {want:?}:\n{other}",
            1 - i
        );
    }
    assert!(
        errs[i].contains("Root Cause (first observed failure)")
            && !errs[i].contains("Root Cause (first failure of generation"),
        "the root node prints its own summary only:\n{}",
        errs[i]
    );
}

/// A module the workers' interpreter has not got (the usual start: `python3` from `PATH`
/// without the environment that has torch): the summary is followed by a line naming the
/// interpreter and the fix.
#[test]
fn a_missing_module_names_the_interpreter_that_ran_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("needs.py");
    std::fs::write(&script, "import drun_no_such_module.sub\n").unwrap();
    let mut c = drun();
    c.args(["--standalone"]).nproc(1).arg(&script);
    c.env("DRUN_PYTHON", "python3");
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    let want = " (from DRUN_PYTHON), which has no module 'drun_no_such_module': activate the environment that has it, or fix or unset DRUN_PYTHON, or pass --python PATH";
    let line = err
        .lines()
        .find(|l| l.contains("the workers ran "))
        .unwrap_or_else(|| panic!("no line naming the interpreter:\n{err}"));
    assert!(line.contains("python3"), "{line}");
    assert!(line.ends_with(want), "wanted {want:?} in:\n{line}");
}
