//! Supervision with real processes and signals: failures, restarts, teardown, orphans.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{alive, drun, read_json, run, wait_for, worker, Agent};

fn pids_in(dir: &Path, ranks: u32) -> Vec<i32> {
    let mut pids = Vec::new();
    for r in 0..ranks {
        let p = read_json(&dir.join(format!("pids_{r}.json")));
        for k in ["worker", "child", "setsid_child"] {
            pids.push(p[k].as_i64().unwrap() as i32);
        }
    }
    pids
}

fn signals_of(dir: &Path, rank: u32) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("signals_{rank}")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn worker_exit_3_fails_the_job_with_a_summary_naming_that_rank() {
    let dir = tempfile::tempdir().unwrap();
    let agent_err = dir.path().join("agent_error.json");
    let mut c = drun();
    c.env("TORCHELASTIC_ERROR_FILE", &agent_err)
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "--shutdown-timeout",
            "5",
        ])
        .arg(worker("exit_code.py"))
        .args(["3", "1"]);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("exit_code.py FAILED").count(), 1, "{err}");
    assert!(
        err.contains("Root Cause (first observed failure):"),
        "{err}"
    );
    assert!(err.contains("  rank      : 1 (local_rank: 1)"), "{err}");
    assert!(err.contains("  exitcode  : 3 (pid: "), "{err}");
    assert!(
        err.contains("rank 1 exiting with 3"),
        "stderr tail in the summary: {err}"
    );
    assert!(
        err.contains("<NO_OTHER_FAILURES>"),
        "the stopped sibling is not a failure: {err}"
    );
    let j = read_json(&agent_err);
    assert_eq!(j["message"]["errorCode"], 3, "{j}");
}

#[test]
fn error_file_from_record_is_the_traceback_and_is_copied_for_the_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let agent_err = dir.path().join("agent_error.json");
    let mut c = drun();
    c.env("TORCHELASTIC_ERROR_FILE", &agent_err)
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "--shutdown-timeout",
            "5",
        ])
        .arg(worker("record_fail.py"));
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    let summary = &err[err.find("Root Cause").expect("summary")..];
    assert!(
        summary.contains("ValueError: boom from rank 1"),
        "{summary}"
    );
    assert!(summary.contains("attempt_0/1/error.json"), "{summary}");
    let j = read_json(&agent_err);
    assert_eq!(j["message"]["message"], "ValueError: boom from rank 1");
    assert_eq!(j["message"]["errorCode"], 1);
}

#[test]
fn failure_on_first_attempt_is_restarted_with_restart_count_1() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--shutdown-timeout",
        "5",
    ])
    .arg(worker("flaky.py"))
    .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("restarting the worker group (1/2 restarts used)"),
        "{err}"
    );
    let a0 = read_json(&dir.path().join("attempt0_rank0"));
    for r in 0..2 {
        let a1 = read_json(&dir.path().join(format!("attempt1_rank{r}")));
        assert_eq!(a1["TORCHELASTIC_RESTART_COUNT"], "1");
        assert_eq!(a1["DRUN_GENERATION"], "2");
        assert_ne!(
            a1["MASTER_PORT"], a0["MASTER_PORT"],
            "fresh MASTER_PORT per generation"
        );
    }
    assert!(
        !dir.path().join("attempt2_rank0").exists(),
        "no third attempt"
    );
}

#[test]
fn without_restart_budget_the_same_failure_ends_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "5",
    ])
    .arg(worker("flaky.py"))
    .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    assert!(!dir.path().join("attempt1_rank0").exists());
}

#[test]
fn worker_killed_by_signal_is_reported_with_the_signal_name() {
    let mut c = drun();
    c.args([
        "--standalone",
        "--no-python",
        "python3",
        "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ]);
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("exitcode  : -9 (pid: "), "{err}");
    assert!(err.contains("Signal 9 (SIGKILL) received by PID"), "{err}");
}

#[test]
fn sigkill_of_the_agent_leaves_no_worker_or_grandchild_alive() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .arg(worker("spawner.py"))
        .arg(dir.path())
        .arg("sleep");
    let agent = Agent::start(c);
    wait_for(
        "both workers to write their pids",
        Duration::from_secs(30),
        || (0..2).all(|r| dir.path().join(format!("pids_{r}.json")).exists()),
    );
    let pids = pids_in(dir.path(), 2);
    assert!(pids.iter().all(|p| alive(*p)), "all started: {pids:?}");
    agent.signal(Signal::SIGKILL);
    wait_for(
        "workers and their children to die after SIGKILL of the agent",
        Duration::from_secs(2),
        || pids.iter().all(|p| !alive(*p)),
    );
}

#[test]
fn crashed_worker_leaves_no_grandchild_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "1"])
        .arg(worker("spawner.py"))
        .arg(dir.path())
        .arg("crash");
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    let pids = pids_in(dir.path(), 1);
    assert!(
        pids.iter().all(|p| !alive(*p)),
        "left alive: {:?}",
        pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
}

#[test]
fn sigterm_is_forwarded_once_and_a_3s_save_completes_before_the_agent_exits() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "10",
    ])
    .arg(worker("trap.py"))
    .arg(dir.path())
    .arg("3");
    let agent = Agent::start(c);
    wait_for("workers ready", Duration::from_secs(30), || {
        (0..2).all(|r| dir.path().join(format!("ready_{r}")).exists())
    });
    let worker_pids: Vec<i32> = (0..2)
        .map(|r| {
            std::fs::read_to_string(dir.path().join(format!("ready_{r}")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    agent.signal(Signal::SIGTERM);
    let (code, _, err) = agent.wait(Duration::from_secs(30));
    assert_eq!(code, 128 + 15, "{err}");
    for r in 0..2 {
        assert!(
            dir.path().join(format!("saved_{r}")).exists(),
            "rank {r} finished its save: {err}"
        );
        assert_eq!(
            signals_of(dir.path(), r),
            ["SIGTERM"],
            "forwarded exactly once"
        );
    }
    assert!(
        worker_pids.iter().all(|p| !alive(*p)),
        "reaped before the agent exited"
    );
}

#[test]
fn grace_period_ends_in_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--shutdown-timeout", "1"])
        .arg(worker("trap.py"))
        .arg(dir.path())
        .arg("60");
    let agent = Agent::start(c);
    wait_for("worker ready", Duration::from_secs(30), || {
        dir.path().join("ready_0").exists()
    });
    agent.signal(Signal::SIGHUP);
    let (code, _, err) = agent.wait(Duration::from_secs(20));
    assert_eq!(code, 128 + 1, "{err}");
    assert_eq!(
        signals_of(dir.path(), 0),
        ["SIGHUP"],
        "the received signal itself is forwarded"
    );
    assert!(
        !dir.path().join("saved_0").exists(),
        "SIGKILLed before the 60 s save ended"
    );
    assert!(err.contains("sending SIGKILL"), "{err}");
}

#[test]
fn second_ctrl_c_escalates_to_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--shutdown-timeout", "60"])
        .arg(worker("trap.py"))
        .arg(dir.path())
        .arg("60");
    let agent = Agent::start(c);
    wait_for("worker ready", Duration::from_secs(30), || {
        dir.path().join("ready_0").exists()
    });
    agent.signal(Signal::SIGINT);
    wait_for("SIGINT forwarded", Duration::from_secs(10), || {
        signals_of(dir.path(), 0) == ["SIGINT"]
    });
    agent.signal(Signal::SIGINT);
    let (code, _, err) = agent.wait(Duration::from_secs(20));
    assert_eq!(code, 130, "{err}");
    assert!(err.contains("second SIGINT"), "{err}");
    assert!(!dir.path().join("saved_0").exists());
}

#[test]
fn usr1_is_relayed_without_teardown() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "10",
    ])
    .arg(worker("trap.py"))
    .arg(dir.path())
    .arg("0");
    let agent = Agent::start(c);
    wait_for("workers ready", Duration::from_secs(30), || {
        (0..2).all(|r| dir.path().join(format!("ready_{r}")).exists())
    });
    agent.signal(Signal::SIGUSR1);
    wait_for(
        "SIGUSR1 relayed to both ranks",
        Duration::from_secs(10),
        || (0..2).all(|r| signals_of(dir.path(), r) == ["SIGUSR1"]),
    );
    assert!(alive(agent.pid()), "agent keeps running");
    agent.signal(Signal::SIGTERM);
    let (code, _, err) = agent.wait(Duration::from_secs(30));
    assert_eq!(code, 143, "{err}");
    assert_eq!(signals_of(dir.path(), 0), ["SIGUSR1", "SIGTERM"]);
}

#[test]
fn partial_success_past_the_peer_exit_wait_is_a_failure() {
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--peer-exit-wait",
        "1",
        "--shutdown-timeout",
        "3",
    ])
    .arg(worker("exit_code.py"))
    .args(["0", "0"]);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("partial success"), "{err}");
    assert!(
        err.contains("ranks [0] exited 0 but ranks [1] still ran"),
        "{err}"
    );
}
