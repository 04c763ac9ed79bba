//! Hang detection from step beacons (`--hang-timeout`): a rank that stops sending beacons has
//! its stacks dumped, is named, and fails the group like a worker failure; a script that sends
//! no beacons is never judged.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::{drun, run, torch_python, wait_for, worker, Agent, DrunCmd};

/// `drun --standalone` with 2 workers of `hang.py` and `--hang-timeout 2`.
/// Exit code, stdout, stderr.
fn hang_job(max_restarts: &str, steps: &str, stuck: &str, beacons: &str) -> (i32, String, String) {
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .args(["--hang-timeout", "2", "--max-restarts", max_restarts])
        .args(["--shutdown-timeout", "3"])
        .arg(worker("hang.py"))
        .args([steps, stuck, beacons]);
    run(c, Duration::from_secs(90))
}

/// `PATH` with the test venv's `py-spy` (linked into `dir`) first.
fn path_with_py_spy(python: &Path, dir: &Path) -> std::ffi::OsString {
    let spy = python.with_file_name("py-spy");
    assert!(
        spy.is_file(),
        "{} is missing: run .ci/setup (it installs py-spy into the test venv)",
        spy.display()
    );
    std::os::unix::fs::symlink(&spy, dir.join("py-spy")).unwrap();
    std::env::join_paths(
        std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )
    .unwrap()
}

/// Rank 1 stops beaconing inside `stuck_here()` while rank 0 goes on: its stack is dumped,
/// the hang names it and its last step, one restart is spent and the second attempt finishes.
#[test]
fn a_rank_that_stops_beaconing_is_dumped_named_and_restarted() {
    let (code, out, err) = hang_job("1", "200", "-1", "1");
    assert_eq!(code, 0, "{err}");
    for want in [
        "hang: rank 1 on node",
        "(last step 19); rank 0 was at step",
        "in stuck_here",
        "restarting the worker group (1/1 restarts used)",
    ] {
        assert!(err.contains(want), "lacks {want:?}:\n{err}");
    }
    assert!(out.contains("done rank=1"), "{out}");
}

/// With `py-spy` on drun's PATH (the test venv's, which `.ci/setup` installs) the stuck rank's
/// stack comes from `py-spy dump`, prefixed with its rank, and still shows `stuck_here`.
#[test]
fn with_py_spy_on_path_the_stuck_ranks_stack_comes_from_py_spy() {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let err = stuck_rank_1_with_py_spy(&python, dir.path(), &[]);
    assert!(err.contains("[rank 1] stacks (py-spy dump --pid "), "{err}");
}

/// `hang.py` with rank 1 stuck, `py-spy` on PATH and `env` set: the run fails and py-spy's
/// frames show rank 1 in `stuck_here`; returns drun's stderr.
fn stuck_rank_1_with_py_spy(python: &Path, dir: &Path, env: &[(&str, &Path)]) -> String {
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .args(["--hang-timeout", "2", "--max-restarts", "0"])
        .args(["--shutdown-timeout", "3"])
        .env("PATH", path_with_py_spy(python, dir))
        .envs(env.iter().copied())
        .arg(worker("hang.py"))
        .args(["200", "-1", "1"]);
    let (code, _, err) = run(c, Duration::from_secs(90));
    assert_ne!(code, 0, "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("[rank 1]") && l.contains("stuck_here (")),
        "py-spy's frame of stuck_here:\n{err}"
    );
    err
}

/// A stuck rank with NCCL loaded (its memory maps name `libnccl`, as a GPU job's do) is dumped
/// with `py-spy dump --native`: the native frames say which call it waits in; its Python frames
/// are still there.
#[test]
fn a_stuck_rank_with_nccl_loaded_is_dumped_with_native_frames() {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let err = stuck_rank_1_with_py_spy(&python, dir.path(), &[("HANG_AS_NCCL", dir.path())]);
    assert!(
        err.contains("[rank 1] stacks (py-spy dump --native --pid "),
        "{err}"
    );
}

/// Without a restart left, the run ends with the hang's line naming the rank.
#[test]
fn a_hang_without_restarts_left_ends_the_run_naming_the_hung_rank() {
    let (code, _, err) = hang_job("0", "100000", "-1", "1");
    assert_eq!(code, 1, "{err}");
    let last = err
        .lines()
        .rfind(|l| l.starts_with("drun: "))
        .unwrap_or_default();
    assert!(last.contains("hang: rank 1 on node"), "{last}\n{err}");
    assert!(err.contains("in stuck_here"), "{err}");
}

/// A rank stopped by SIGSTOP is continued for its stack dump (py-spy cannot attach to it, and a
/// pending faulthandler signal loses to SIGTERM): the dump shows `stuck_here`, in one line
/// says why, and the stop does not wait out the grace period for it.
#[test]
fn a_sigstopped_rank_is_continued_for_its_dump_and_stopped_with_the_group() {
    let (code, _, err) = hang_job("0", "100000", "sigstop", "1");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("[rank 1] the worker (pid ") && err.contains("is stopped (SIGSTOP"),
        "{err}"
    );
    assert!(err.contains("in stuck_here"), "{err}");
    assert!(!err.contains("Stack backtrace"), "{err}");
    assert!(!err.contains("sending SIGKILL"), "{err}");
}

/// The same pause (4 s, past the 2 s timeout) without beacons is never judged a hang.
#[test]
fn a_job_without_beacons_is_never_judged_hung() {
    let (code, out, err) = hang_job("0", "100", "4", "0");
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("hang:"), "{err}");
    assert!(out.contains("done rank=1"), "{out}");
}

/// Real torch (gloo): rank 1 stops calling `all_reduce`, so rank 0 blocks in it (gloo's own
/// timeout is 30 minutes). Detected within `--hang-timeout` + 2 s; rank 0's stack shows the
/// `all_reduce`, rank 1's `stuck_here`.
#[test]
fn a_rank_blocked_in_a_gloo_all_reduce_is_a_hang_within_the_timeout() {
    let Some(python) = torch_python() else { return };
    let mut c = drun();
    c.python(&python)
        .args(["--standalone", "--nproc-per-node", "2"])
        .args(["--hang-timeout", "3", "--max-restarts", "0"])
        .args(["--shutdown-timeout", "3"])
        .arg(worker("allreduce_hang.py"));
    let agent = Agent::start(c);
    wait_for("rank 1 to stop", Duration::from_secs(120), || {
        agent.stdout_so_far().contains("stuck")
    });
    let stopped = Instant::now();
    wait_for("the hang", Duration::from_secs(30), || {
        agent.stderr_so_far().contains("hang: rank")
    });
    let detected = stopped.elapsed();
    assert!(
        detected <= Duration::from_secs(5),
        "detected after {detected:?}:\n{}",
        agent.stderr_so_far()
    );
    let (code, _, err) = agent.wait(Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    for want in ["in all_reduce", "in stuck_here", "(last step 19)"] {
        assert!(err.contains(want), "lacks {want:?}:\n{err}");
    }
}

/// Real torch (gloo), two process groups: every step all-reduces on a second group ("pair")
/// and then on the default one; rank 1 stops before the default group's 20th `all_reduce`.
/// The flight recorders of both ranks (on by default under `--hang-timeout`, dumped by the
/// helper's thread while rank 0 is blocked in the collective) name the rank that never
/// entered it and the operation, beside the stacks; the "pair" group, in step, is not named.
#[test]
fn a_rank_blocked_in_a_gloo_collective_is_named_by_the_flight_recorder() {
    let Some(python) = torch_python() else { return };
    let mut c = drun();
    c.python(&python)
        .args(["--standalone", "--nproc-per-node", "2"])
        .args(["--hang-timeout", "3", "--max-restarts", "0"])
        .args(["--shutdown-timeout", "3"])
        .arg(worker("allreduce_hang.py"))
        .arg("--pair");
    let (code, _, err) = run(c, Duration::from_secs(120));
    assert_eq!(code, 1, "{err}");
    let table: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("flight recorder: "))
        .collect();
    assert_eq!(
        table.len(),
        1,
        "one line, for the default group only:\n{err}"
    );
    assert!(
        table[0].contains(
            "flight recorder: default_pg: rank 0 waits in all_reduce #20 (float[1]); rank 1 never entered it (its last: all_reduce #19)"
        ),
        "{err}"
    );
    assert!(err.contains("in stuck_here"), "the stacks too:\n{err}");
}

/// Two agents of run `run` on `server`, one `allreduce_hang.py` rank each, with their
/// `--hang-timeout` and `DRUN_TEST_HANG_HERE` (unset: rank 1 stops); their stderr once they
/// exited.
fn two_hanging_nodes(
    python: &std::path::Path,
    server: &crate::harness::cluster::RdzvServer,
    run: &str,
    nodes: [(&str, Option<&str>); 2],
) -> Vec<String> {
    let agents: Vec<crate::harness::Agent> = nodes
        .iter()
        .enumerate()
        .map(|(i, (timeout, here))| {
            let mut c =
                crate::harness::node_cmd(i, run, "2", &["--rdzv-endpoint", &server.endpoint]);
            c.python(python)
                .args(["--nproc-per-node", "1", "--warm-workers", "off"])
                .args(["--hang-timeout", timeout, "--max-restarts", "0"])
                .args(["--shutdown-timeout", "3"])
                .arg(worker("allreduce_hang.py"));
            if let Some(here) = here {
                c.env("DRUN_TEST_HANG_HERE", here);
            }
            crate::harness::Agent::start(c)
        })
        .collect();
    agents
        .into_iter()
        .map(|a| a.wait(Duration::from_secs(120)).2)
        .collect()
}

/// The same hang across two nodes (one rank each): neither node alone can name rank 1 (node 0
/// sees its rank wait, node 1 sees its rank in no collective), so each reports its dumps and
/// `drun-rendezvous status` judges them together, after the run ended too.
#[test]
fn across_nodes_status_names_the_rank_on_another_node_that_never_entered_the_collective() {
    let Some(python) = torch_python() else { return };
    let server = crate::harness::cluster::RdzvServer::start(&["--store", "memory"]);
    let errs = two_hanging_nodes(&python, &server, "flight2", [("3", None), ("3", None)]);
    assert!(
        errs.iter()
            .any(|e| e.contains("flight recorder dumps are reported")),
        "{errs:?}"
    );
    let out = std::process::Command::new(crate::harness::cluster::rendezvous_bin())
        .args(["status", "flight2", "--endpoint", &server.endpoint])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("flight generation 1 hung:")
            && flat.contains("default_pg: rank 0 waits in all_reduce #20 (float[1]); rank 1 never entered it (its last: all_reduce #19)"),
        "{text}\n{errs:?}"
    );
}

/// The node whose rank stopped judges the hang first (its timeout is 3 s, the other node's
/// 5 s) and stops its rank, which breaks the collective the other node's rank waits in: that
/// rank exits before its node judges anything. Its flight recorder was dumped at half its
/// node's timeout, and that dump is reported as the group stops: `status` still names the
/// rank that never entered the collective.
#[test]
fn a_hang_judged_first_on_another_node_leaves_this_nodes_flight_dump_to_status() {
    let Some(python) = torch_python() else { return };
    let server = crate::harness::cluster::RdzvServer::start(&["--store", "memory"]);
    let errs = two_hanging_nodes(
        &python,
        &server,
        "flight3",
        [("5", Some("0")), ("3", Some("1"))],
    );
    assert!(
        !errs[0].contains("dumping the stacks of the stuck ranks"),
        "the 5 s node judged no hang of its own (its rank failed first):\n{}",
        errs[0]
    );
    assert!(
        errs[0].contains("their flight recorder dumps, taken then, are reported"),
        "{}",
        errs[0]
    );
    let out = std::process::Command::new(crate::harness::cluster::rendezvous_bin())
        .args(["status", "flight3", "--endpoint", &server.endpoint])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let waits = flat.contains("waits in all_reduce #20 (float[1]); rank ");
    let names = flat.contains("never entered it (its last: all_reduce #19)");
    assert!(
        flat.contains("flight generation 1 hung:") && waits && names,
        "{text}\n{errs:?}"
    );
}
