//! Checkpoints staged in memory and persisted behind the training (`--ckpt-memory`): the
//! commit returns before the disk has the files, the step seals once they are persisted, a
//! worker failure resumes from the staged copy, the end of the run waits for the disk, and a
//! budget the node cannot hold is a usage error.

use super::*;

/// The agent of a one-node run with `--ckpt-memory 64M`, its tmpfs replaced by `stage` and its
/// persister slowed to `rate` bytes per second, so the disk lags the training visibly.
fn memory_agent(d: &Dirs, stage: &Path, rate: &str, env: &[(&str, &str)]) -> Agent {
    let mut c: Command = drun();
    c.args(["--standalone", "--rdzv-id", "ckpt-memory"])
        .nproc(2)
        .args(["--shutdown-timeout", "30", "--max-restarts", "1"])
        .args(["--ckpt-memory", "64M", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out)
        .env("DRUN_CKPT_STAGE_PARENT", stage)
        .env("DRUN_CKPT_PERSIST_RATE", rate);
    for (k, v) in env {
        c.env(k, v);
    }
    Agent::start(c)
}

#[test]
fn a_staged_step_is_answered_at_once_persisted_behind_and_resumed_from_memory() {
    let d = dirs();
    let stage = d.out.parent().unwrap().join("shm");
    std::fs::create_dir_all(&stage).unwrap();
    // About 5.6 KB a step at 4000 B/s: each step reaches the disk some 1.4 s after its commit.
    let a = memory_agent(&d, &stage, "4000", &[("CKPT_HOLD_AT", "6")]);
    wait_for(
        "both ranks hold after step 6",
        Duration::from_secs(60),
        || count(&events(&d), "holding", |e| e["step"] == 6) == 2,
    );
    // Rank 0 fails at once: step 6 is staged, not yet on disk.
    std::fs::write(d.out.join("crash"), b"").unwrap();
    let (code, _, err) = a.wait(Duration::from_secs(120));
    assert_eq!(code, 0, "{err}");
    let evs = events(&d);
    let committed: Vec<&Value> = evs
        .iter()
        .filter(|e| e["event"] == "committed" && e["gen"] == 1)
        .collect();
    assert_eq!(
        committed.len(),
        6,
        "steps 2, 4, 6 on both ranks: {committed:?}"
    );
    for e in &committed {
        assert_eq!(e["staged"], true, "{e}");
        assert_eq!(e["sealed"], false, "{e}");
    }
    assert!(
        committed
            .iter()
            .any(|e| e["step"] == 6 && e["on_disk"] == false),
        "the commit of step 6 returned before its file was on disk: {committed:?}"
    );
    // The failure waited for the disk, so generation 2 resumes step 6 — from memory.
    assert!(
        err.contains("for the staged checkpoints to be persisted"),
        "{err}"
    );
    let starts: Vec<&Value> = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"] == 2)
        .collect();
    assert_eq!(starts.len(), 2, "{evs:?}");
    for e in starts {
        assert_eq!(e["resume_step"], 6, "{e}");
        assert_eq!(e["resume_samples"], 48, "{e}");
        let path = e["env_resume"]["DRUN_RESUME_PATH"].as_str().unwrap();
        assert!(
            Path::new(path).starts_with(&stage),
            "resumed from the staged copy in memory, not {path}"
        );
    }
    // The end of the run waited for steps 8..12: every step sealed, every file on disk.
    assert_eq!(latest_step(&d), 12);
    let steps: Vec<u64> = manifest_files(&d).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, [2, 4, 6, 8, 10, 12]);
    let m = latest(&d).unwrap();
    for f in m["files"].as_array().unwrap() {
        let p = f["path"].as_str().unwrap();
        let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        assert_eq!(len, f["bytes"].as_u64().unwrap(), "{p}");
    }
    assert!(
        !files_under(&d.ckpt)
            .iter()
            .any(|f| f.to_string_lossy().contains(".drun-persist-")),
        "no temporary file of the persister is left"
    );
    assert_eq!(
        std::fs::read_dir(&stage).unwrap().count(),
        0,
        "the staging directory goes with the agent"
    );
}

#[test]
fn a_memory_budget_larger_than_the_node_is_a_usage_error() {
    let d = dirs();
    let mut c: Command = drun();
    c.args(["--standalone", "--ckpt-memory", "1000TiB", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("--ckpt-memory"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("of RAM"), "{err}");
}

/// Real torch: rank 1 fails one step after step 16 was staged (its files not on disk yet); the
/// agent persists it before the failure is reported, the restarted ranks load it from memory,
/// and the final model is the fault-free run's, exactly.
#[test]
fn torch_a_worker_failure_resumes_the_staged_step_from_memory_exactly() {
    let Some(python) = crate::harness::torch_python() else {
        eprintln!("skipped: no torch interpreter (DRUN_TORCH_PYTHON)");
        return;
    };
    let d = dirs();
    let stage = d.out.parent().unwrap().join("shm");
    std::fs::create_dir_all(&stage).unwrap();
    let train = crate::harness::root().join("examples/train_ddp.py");
    let mut c = drun();
    c.python(&python)
        .args(["--standalone", "--rdzv-id", "ckpt-memory-torch"])
        .nproc(2)
        .args(["--max-restarts", "1", "--shutdown-timeout", "60"])
        .args(["--ckpt-memory", "256M", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(&train)
        .args(EXAMPLE_ARGS)
        .args(["--ckpt-every", "8", "--fail-at-step", "17", "--out"])
        .arg(d.out.join("faults"))
        .env("DRUN_CKPT_STAGE_PARENT", &stage)
        // About 90 KB a step at 40 KiB/s: a step reaches the disk ~2 s after its commit, long
        // after the failure one step later.
        .env("DRUN_CKPT_PERSIST_RATE", "40K");
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(240));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("simulated failure at step 17"), "{err}");
    assert!(
        err.contains("for the staged checkpoints to be persisted"),
        "the failure waited for the disk: {err}"
    );
    assert!(
        err.contains("resuming from checkpoint step 16"),
        "the restart resumes the step staged before the failure: {err}"
    );
    let from_memory = err
        .lines()
        .find(|l| l.contains("resuming from the staged copy in memory"))
        .unwrap_or_else(|| panic!("resumed from memory: {err}"));
    assert!(from_memory.contains("step=16"), "{from_memory}");
    assert_eq!(
        latest_step(&d),
        128,
        "the end waited for every step to be sealed"
    );

    let base = dirs();
    let mut c = drun();
    c.python(&python)
        .args(["--standalone", "--nproc-per-node", "2", "--ckpt-dir"])
        .arg(&base.ckpt)
        .arg(&train)
        .args(EXAMPLE_ARGS)
        .args(["--ckpt-every", "8", "--step-sleep", "0", "--out"])
        .arg(base.out.join("clean"));
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(240));
    assert_eq!(code, 0, "{err}");
    let cmp = check(
        &python,
        &[
            "compare",
            d.out.join("faults/final.pt").to_str().unwrap(),
            base.out.join("clean/final.pt").to_str().unwrap(),
            "--tol",
            "0",
        ],
    );
    assert_eq!(cmp["max_abs_diff"], 0.0, "{cmp}");
}

/// No tmpfs to stage in: one warning, every save goes straight to disk, nothing is lost.
#[test]
fn a_missing_tmpfs_is_one_warning_and_saves_go_to_disk() {
    let d = dirs();
    let missing = d.out.parent().unwrap().join("no-such-tmpfs");
    let a = memory_agent(&d, &missing, "1G", &[("CKPT_STEPS", "6")]);
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("cannot stage checkpoints in"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    let evs = events(&d);
    for e in evs.iter().filter(|e| e["event"] == "committed") {
        assert_eq!(e["staged"], false, "{e}");
        assert_eq!(e["on_disk"], true, "{e}");
    }
    assert_eq!(
        count(&evs, "committed", |_| true),
        6,
        "steps 2, 4, 6 on both ranks"
    );
    assert_eq!(latest_step(&d), 6);
}
