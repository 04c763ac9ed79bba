//! A hang (`--hang-timeout`) fails the group like a worker failure: one restart, resumed from
//! the last sealed checkpoint.

use super::*;

/// Rank 1 stops inside `stuck_here()` at step 7, after step 6 was sealed: its stack is dumped,
/// the hang names it (and rank 0, waiting for it in the commit of step 8), and generation 2 resumes both ranks from step 6.
#[test]
fn a_hang_restarts_the_group_from_the_last_sealed_checkpoint() {
    let d = dirs();
    let r = rdzv(Store::Memory, "ckpt-hang", "1");
    let a = agent(
        0,
        &r,
        &d,
        2,
        &["--max-restarts", "1", "--hang-timeout", "2"],
        &[("CKPT_HANG_AT", "1:7"), ("CKPT_STEPS", "10")],
    );
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "recovered and finished:\n{err}");
    for want in [
        // Rank 0 waits in its commit of step 8 for rank 1: stuck with it.
        "made no progress for",
        "rank 1 on node",
        "(last step 6)",
        "in stuck_here",
        "restarting the worker group (1/1 restarts used)",
    ] {
        assert!(err.contains(want), "lacks {want:?}:\n{err}");
    }
    let evs = events(&d);
    let resumed = |e: &Value| e["gen"] == 2 && e["resume_step"] == 6;
    assert_eq!(count(&evs, "start", resumed), 2, "{evs:?}");
    assert_eq!(count(&evs, "done", |e| e["gen"] == 2), 2, "{evs:?}");
}
