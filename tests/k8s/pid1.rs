//! drun as PID 1 of a new PID namespace (`unshare --pid --fork`), as in a container without an
//! init: signals, orphans, the termination message, the restart counter.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::harness::{clean_env, drun_bin, read_json, run, wait_for, worker, Agent};

/// `drun ARGS` as PID 1 of a new PID namespace (with a user namespace, so no privilege is
/// needed; `--kill-child`: a failing test leaves nothing behind).
fn as_pid1(args: &[&str]) -> Command {
    let probe = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
        ])
        .arg("true")
        .status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "`unshare --user --map-root-user --pid --fork --mount-proc` must work here (util-linux, unprivileged user namespaces)"
    );
    let mut c = clean_env(Command::new("unshare"));
    c.args([
        "--user",
        "--map-root-user",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
    ])
    .arg(drun_bin())
    .args(args);
    c
}

/// drun's pid (in this namespace): the one child of `unshare`.
fn drun_pid(unshare: &Agent) -> i32 {
    let path = format!("/proc/{0}/task/{0}/children", unshare.pid());
    let mut pid = 0;
    wait_for("unshare to start drun", Duration::from_secs(10), || {
        pid = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    pid
}

#[test]
fn as_pid1_sigterm_stops_the_workers_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let a = Agent::start(as_pid1(&[
        "--nproc-per-node",
        "2",
        &worker("trap.py"),
        out,
        "0",
    ]));
    let ready = |r: u32| dir.path().join(format!("ready_{r}"));
    wait_for("both workers ready", Duration::from_secs(30), || {
        ready(0).exists() && ready(1).exists()
    });
    assert!(
        a.stderr_so_far().contains("running as PID 1"),
        "{}",
        a.stderr_so_far()
    );
    kill(Pid::from_raw(drun_pid(&a)), Signal::SIGTERM).unwrap();
    let (code, _, err) = a.wait(Duration::from_secs(30));
    assert_eq!(code, 143, "documented: 128+SIGTERM. {err}");
    for r in 0..2 {
        let signals = std::fs::read_to_string(dir.path().join(format!("signals_{r}"))).unwrap();
        assert_eq!(
            signals.trim(),
            "SIGTERM",
            "rank {r} got the forwarded SIGTERM"
        );
        assert!(
            dir.path().join(format!("saved_{r}")).exists(),
            "rank {r} finished its save before drun exited"
        );
    }
}

#[test]
fn as_pid1_orphaned_grandchildren_are_adopted_and_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (code, _, err) = run(
        as_pid1(&["--nproc-per-node", "2", &worker("orphan_reap.py"), out]),
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{err}");
    for r in 0..2 {
        let rec = read_json(&dir.path().join(format!("orphan_{r}.json")));
        assert_eq!(
            rec["adopted_by"], 1,
            "rank {r}: re-parented to drun, PID 1: {rec}"
        );
        assert_eq!(rec["reaped"], true, "rank {r}: no zombie left: {rec}");
    }
}

fn termination(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.len() <= 4096,
        "the kubelet's limit: {} bytes",
        text.len()
    );
    serde_json::from_str(&text).unwrap()
}

#[test]
fn as_pid1_a_worker_failure_leaves_its_root_cause_in_the_termination_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("termination-log");
    let state = dir.path().join("state");
    let args = [
        "--termination-log",
        log.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--nproc-per-node",
        "2",
        &worker("exit_code.py"),
        "7",
        "1",
    ];
    for start in 0..2u64 {
        let (code, _, err) = run(as_pid1(&args), Duration::from_secs(60));
        assert_eq!(code, 1, "{err}");
        let t = termination(&log);
        assert_eq!(t["exit_code"], 1, "{t}");
        assert_eq!(t["class"], "fatal", "{t}");
        let reason = t["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("rank 1 (local_rank 1) exited with 7"),
            "{t}"
        );
        assert_eq!(
            t["container_restarts"], start,
            "the counter on --state-dir goes up with every start"
        );
    }
}

#[test]
fn a_usage_error_is_also_a_termination_message() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("termination-log");
    let mut c = crate::harness::drun();
    c.arg("--termination-log")
        .arg(&log)
        .args(["--nnodes", "0", "t.py"]);
    let (code, _, _) = run(c, Duration::from_secs(30));
    assert_eq!(code, 2);
    let t = termination(&log);
    assert_eq!(
        (t["exit_code"].as_u64(), t["class"].as_str()),
        (Some(2), Some("fatal"))
    );
    assert!(t["reason"].as_str().unwrap().contains("--nnodes"), "{t}");
}
