//! `--preflight`: the interconnect check before the first generation trains (2 agents × 2
//! torch gloo workers on loopback), a slowed link named, and the skips.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::cluster::{rendezvous_bin, RdzvServer};
use crate::harness::{drun, node_cmd, run, torch_python, worker, Agent, DrunCmd};

/// Node `i` of the 2-node run `run`, 2 workers of `ddp_destroy.py` (a DDP job that inits its
/// own process group after the check), with `--preflight` and `extra` flags and environment.
fn node(server: &RdzvServer, run: &str, i: usize, python: &Path, env: &[(&str, &str)]) -> Agent {
    let rdzv = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
    ];
    let mut c = node_cmd(i, run, "2", &rdzv);
    c.args([
        "--node-rank",
        &i.to_string(),
        "--max-restarts",
        "0",
        "--preflight",
    ])
    .quick_shutdown()
    .python(python)
    .arg(worker("ddp_destroy.py"));
    for (k, v) in env {
        c.env(k, v);
    }
    Agent::start(c)
}

fn finish(a: Agent, b: Agent) -> (String, String) {
    let (code_a, _, err_a) = a.wait(Duration::from_secs(180));
    let (code_b, _, err_b) = b.wait(Duration::from_secs(180));
    assert_eq!((code_a, code_b), (0, 0), "A:\n{err_a}\nB:\n{err_b}");
    (err_a, err_b)
}

/// The human `drun-rendezvous status` view of `run` on `server`, its whitespace collapsed.
fn status_view(server: &RdzvServer, run: &str) -> String {
    let o = Command::new(rendezvous_bin())
        .args(["status", run, "--endpoint", &server.endpoint])
        .output()
        .expect("run drun-rendezvous status");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Unwrapped: the view wraps long lines at 80 columns.
    let view = String::from_utf8_lossy(&o.stdout).into_owned();
    view.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn row<'a>(err: &'a str, link: &str) -> &'a str {
    err.lines()
        .find(|l| l.trim_start().starts_with(link))
        .unwrap_or_else(|| panic!("no row for {link}:\n{err}"))
}

/// Node rank 0 prints one table (the check's total time, the all_reduce, each node's own
/// all_reduce, both ring links with bandwidth and latency, none slow), node 1 one summary line; then the DDP script inits its
/// own process group on the same store and every worker exits 0.
#[test]
fn preflight_on_two_nodes_prints_a_per_link_table_then_trains() {
    let Some(python) = torch_python() else { return };
    let server = RdzvServer::start(&["--store", "memory"]);
    let a = node(&server, "preflight", 0, &python, &[]);
    let b = node(&server, "preflight", 1, &python, &[]);
    let (err_a, err_b) = finish(a, b);
    assert!(
        err_a.contains("preflight: 4 ranks on 2 nodes (gloo) in "),
        "{err_a}"
    );
    assert!(
        err_a.contains("all_reduce of ") && err_a.contains(" over all ranks: bus bandwidth "),
        "{err_a}"
    );
    assert!(
        err_a.contains("all_reduce within each node: bus bandwidth median ")
            && err_a.contains(", 2 ranks on a node"),
        "each node's own all_reduce:\n{err_a}"
    );
    for link in ["node 0 → 1", "node 1 → 0"] {
        let r = row(&err_a, link);
        assert!(
            r.contains("Gbit/s") && r.contains("µs") && !r.contains("SLOW"),
            "{r}"
        );
    }
    assert!(err_b.contains("2 links measured, none slow"), "{err_b}");
    assert!(
        !err_b.contains("node 0 → 1  "),
        "only node rank 0 prints the table:\n{err_b}"
    );
}

/// Node 1's local rank 0 (rank 2) sleeps before each bulk send: the link node 1 → 0 is named
/// slow in node 0's table and in node 1's summary; the other link is not; the job still runs.
#[test]
fn a_slowed_link_is_named_in_the_table() {
    let Some(python) = torch_python() else { return };
    let server = RdzvServer::start(&["--store", "memory"]);
    let slow = [("DRUN_PREFLIGHT_TEST_DELAY", "2:0.5")];
    let a = node(&server, "preflight-slow", 0, &python, &slow);
    let b = node(&server, "preflight-slow", 1, &python, &slow);
    let (err_a, err_b) = finish(a, b);
    assert!(
        row(&err_a, "node 1 → 0").contains("SLOW: below half the median link"),
        "{err_a}"
    );
    assert!(!row(&err_a, "node 0 → 1").contains("SLOW"), "{err_a}");
    assert!(err_b.contains("slow: node 1 → 0"), "{err_b}");
    let view = status_view(&server, "preflight-slow");
    assert!(view.contains("SLOW (below half the median link"), "{view}");
}

/// An interpreter without torch: one line per node says the check skipped, and the script
/// runs; `--no-python` skips it at start. Neither costs the job anything.
#[test]
fn without_torch_or_an_interpreter_the_check_says_it_skipped_and_the_script_runs() {
    let notorch = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/notorch");
    let mut c: Command = drun();
    c.args(["--standalone", "--nproc-per-node", "2", "--preflight"])
        .env("PYTHONPATH", &notorch)
        .arg(worker("printer.py"))
        .arg("1");
    let (code, out, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("preflight: skipped: torch is not importable by ")
            && err.contains("; the script runs"),
        "{err}"
    );
    assert!(out.contains("tail-without-newline rank=1"), "{out}");

    let mut c: Command = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "1",
        "--preflight",
        "--no-python",
    ])
    .args(["true"]);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("--preflight: skipped: --no-python runs no interpreter to measure in"),
        "{err}"
    );
}
