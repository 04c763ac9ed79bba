//! `--log-format json`: the agent's and the server's log records are one JSON object per line
//! with the run (and the node) as fields; worker output keeps its shape.

use std::time::Duration;

use serde_json::Value;

use crate::harness::cluster::RdzvServer;
use crate::harness::{drun, run, worker};

/// The JSON records of `stderr`; panics on a line that is neither a JSON object nor one of
/// `allowed` (worker output), and on a record without a `run` and a `node`.
fn records(stderr: &str, allowed: impl Fn(&str) -> bool) -> Vec<Value> {
    let mut out = Vec::new();
    for line in stderr.lines() {
        if allowed(line) {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON record ({e}): {line:?}\n{stderr}"));
        for key in ["run", "node", "level", "message", "timestamp"] {
            assert!(v[key].is_string(), "{key} missing in {line}");
        }
        out.push(v);
    }
    out
}

#[test]
fn a_single_node_run_with_json_logs_writes_one_record_per_line_each_naming_the_run() {
    let mut c = drun();
    c.args(["--log-format", "json", "--nproc-per-node", "1", "-v"])
        .args(["--rdzv-id", "jsonrun"])
        .arg(worker("exit_code.py"))
        .args(["0", "0", "0.1"]);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    let recs = records(&err, |l| l == "[rank0]:rank 0 exiting with 0");
    assert!(
        err.lines().any(|l| l == "[rank0]:rank 0 exiting with 0"),
        "the worker's line keeps its shape: {err}"
    );
    assert!(recs.iter().all(|r| r["run"] == "jsonrun"), "{err}");
    let formed = recs
        .iter()
        .find(|r| r["message"].as_str().unwrap().starts_with("world formed"))
        .unwrap_or_else(|| panic!("no formation record: {err}"));
    assert_eq!(formed["gen"], 1, "{formed}");
    // Records after the formation name the generation even when the event itself does not.
    let finished = recs
        .iter()
        .find(|r| r["message"].as_str().unwrap().starts_with("run finished"))
        .unwrap_or_else(|| panic!("no end record: {err}"));
    assert_eq!(finished["gen"], 1, "{finished}");
    // A record about one worker names its rank (at -v).
    let exited = recs
        .iter()
        .find(|r| r["message"] == "worker exited")
        .unwrap_or_else(|| panic!("no worker exit record: {err}"));
    assert_eq!(exited["rank"], 0, "{exited}");
}

#[test]
fn the_server_writes_json_records_naming_run_and_node() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut server = RdzvServer::start_logging(
        &["--store", "memory", "--log-format", "json"],
        "info,drun_rendezvous=debug",
        &log,
    );
    let mut c = drun();
    // The agent takes the format from the environment here.
    c.env("DRUN_LOG_FORMAT", "json")
        .args(["--nproc-per-node", "1"])
        .args([
            "--nnodes",
            "1",
            "--rdzv-id",
            "srvjson",
            "--rdzv-backend",
            "drun",
        ])
        .args(["--rdzv-endpoint", &server.endpoint])
        .arg(worker("exit_code.py"))
        .args(["0", "0", "0.1"]);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    records(&err, |l| l == "[rank0]:rank 0 exiting with 0");
    server.kill();
    let text = std::fs::read_to_string(&log).unwrap();
    let mut session_records = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("server line not JSON ({e}): {line:?}\n{text}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
        // Every record of the server about an agent's session (opened, the group formed by it,
        // the run's end, closed) names the run and the node.
        if v["target"]
            .as_str()
            .unwrap()
            .starts_with("drun_rendezvous::")
        {
            assert_eq!(v["run"], "srvjson", "{line}");
            assert!(v["node"].is_string(), "{line}");
            session_records += 1;
        }
    }
    assert!(session_records >= 3, "too few session records: {text}");
}
