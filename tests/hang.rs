//! Hang detection from step beacons (`--hang-timeout`): a rank that stops sending beacons has
//! its stacks dumped, is named, and fails the group like a worker failure; a script that sends
//! no beacons is never judged.

use std::time::Duration;

use crate::harness::{drun, run, worker};

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

/// The same pause (4 s, past the 2 s timeout) without beacons is never judged a hang.
#[test]
fn a_job_without_beacons_is_never_judged_hung() {
    let (code, out, err) = hang_job("0", "100", "4", "0");
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("hang:"), "{err}");
    assert!(out.contains("done rank=1"), "{out}");
}
