//! Checkpoints staged in memory and persisted behind the training (`--ckpt-memory`): the
//! commit returns before the disk has the files, the step seals once they are persisted, a
//! worker failure resumes from the staged copy, the end of the run waits for the disk, and a
//! budget the node cannot hold is a usage error.

use super::*;

/// The agent of a one-node run with `--ckpt-memory 64M`, its tmpfs replaced by `stage` and its
/// persister slowed to `rate` bytes per second, so the disk lags the training visibly.
fn memory_agent(d: &Dirs, stage: &Path, rate: &str, env: &[(&str, &str)]) -> Agent {
    let mut c = memory_cmd(d, stage, &[]);
    c.env("DRUN_CKPT_PERSIST_RATE", rate);
    for (k, v) in env {
        c.env(k, v);
    }
    Agent::start(c)
}

/// The command of [`memory_agent`], with `extra` drun flags and the persister at its default
/// rate.
fn memory_cmd(d: &Dirs, stage: &Path, extra: &[&str]) -> Command {
    let mut c: Command = drun();
    c.args(["--standalone", "--rdzv-id", "ckpt-memory"])
        .nproc(2)
        .args(["--shutdown-timeout", "30", "--max-restarts", "1"])
        .args(extra)
        .args(["--ckpt-memory", "64M", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out)
        .env("DRUN_CKPT_STAGE_PARENT", stage);
    c
}

/// The run's staging directory (the tmpfs stand-in), created.
fn staging_dir(d: &Dirs) -> PathBuf {
    let stage = d.out.parent().unwrap().join("shm");
    std::fs::create_dir_all(&stage).unwrap();
    stage
}

/// A memory agent whose steps reach the disk about 1.4 s after their commit (5.6 KB a step at
/// 4000 B/s), once both ranks hold after step 6.
fn holding_at_step_6(d: &Dirs, stage: &Path) -> Agent {
    let a = memory_agent(d, stage, "4000", &[("CKPT_HOLD_AT", "6")]);
    wait_for(
        "both ranks hold after step 6",
        Duration::from_secs(60),
        || count(&events(d), "holding", |e| e["step"] == 6) == 2,
    );
    a
}

#[test]
fn a_staged_step_is_answered_at_once_persisted_behind_and_resumed_from_memory() {
    let d = dirs();
    let stage = staging_dir(&d);
    // About 5.6 KB a step at 4000 B/s: each step reaches the disk some 1.4 s after its commit.
    let a = holding_at_step_6(&d, &stage);
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

/// `--ckpt-verify digest` hashes what the restarted ranks read: a staged copy in memory that
/// is no longer what its manifest says (overwritten here after its step was sealed) is not
/// resumed from; the ranks read the copy on disk, which the check verified, and the warning
/// names the file.
#[test]
fn a_staged_copy_that_differs_from_its_manifest_is_not_resumed_under_digest_verification() {
    let d = dirs();
    let stage = staging_dir(&d);
    let mut c = memory_cmd(&d, &stage, &["--ckpt-verify", "digest"]);
    c.env("CKPT_HOLD_AT", "6");
    let a = Agent::start(c);
    wait_for(
        "both ranks hold after step 6, sealed on disk",
        Duration::from_secs(60),
        || count(&events(&d), "holding", |e| e["step"] == 6) == 2 && latest_step(&d) == 6,
    );
    let staged: Vec<PathBuf> = files_under(&stage)
        .into_iter()
        .filter(|p| {
            let p = p.to_string_lossy();
            p.contains("step-00000006-g1") && p.ends_with("rank0.pt")
        })
        .collect();
    assert_eq!(staged.len(), 1, "{:?}", files_under(&stage));
    let mut bytes = std::fs::read(&staged[0]).unwrap();
    bytes[7] ^= 0x55;
    std::fs::write(&staged[0], &bytes).unwrap();
    std::fs::write(d.out.join("crash"), b"").unwrap();
    let (code, _, err) = a.wait(Duration::from_secs(120));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "the staged copy in memory of checkpoint step 6 is not what its manifest says"
        ) && err.contains("rank0.pt (rank 0) has digest"),
        "{err}"
    );
    let starts: Vec<Value> = events(&d)
        .into_iter()
        .filter(|e| e["event"] == "start" && e["gen"] == 2)
        .collect();
    assert_eq!(starts.len(), 2, "{starts:?}");
    for e in &starts {
        assert_eq!(e["resume_step"], 6, "{e}");
        let path = e["env_resume"]["DRUN_RESUME_PATH"].as_str().unwrap();
        assert!(
            Path::new(path).starts_with(&d.ckpt),
            "resumed from --ckpt-dir, not the staged copy: {path}"
        );
    }
}

/// A second Ctrl-C while the end waits for the disk: the agent exits now (130), names the
/// staged steps it leaves unpersisted, and leaves no temporary file in --ckpt-dir (a user saw
/// it persist on, silently, after "second SIGINT: killing workers now").
#[test]
fn a_second_sigint_ends_the_wait_for_the_disk_and_names_what_is_left() {
    let d = dirs();
    let stage = staging_dir(&d);
    // About 5.6 KB a step at 1000 B/s: step 6 reaches the disk some 17 s after the holds.
    let a = memory_agent(&d, &stage, "1000", &[("CKPT_HOLD_AT", "6")]);
    wait_for(
        "both ranks hold after step 6",
        Duration::from_secs(60),
        || count(&events(&d), "holding", |e| e["step"] == 6) == 2,
    );
    let ranks: Vec<i32> = events(&d)
        .iter()
        .filter(|e| e["event"] == "holding")
        .map(|e| e["pid"].as_i64().unwrap() as i32)
        .collect();
    a.signal(Signal::SIGINT);
    wait_for("the ranks to exit", Duration::from_secs(30), || {
        ranks.iter().all(|p| !alive(*p))
    });
    assert!(
        latest_step(&d) < 6,
        "step 6 is on disk already: the persister is too fast"
    );
    a.signal(Signal::SIGINT);
    let second = std::time::Instant::now();
    let (code, _, err) = a.wait(Duration::from_secs(60));
    let took = second.elapsed();
    assert_eq!(code, 130, "{err}");
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after the second SIGINT:\n{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("(a second SIGINT) checkpoint step(s)"))
        .unwrap_or_else(|| panic!("the line: {err}"));
    assert!(line.contains("6 (generation 1)"), "{line}");
    assert!(
        !files_under(&d.ckpt)
            .iter()
            .any(|f| f.to_string_lossy().contains(".drun-persist-")),
        "no temporary file of the persister is left"
    );
}

#[test]
fn a_memory_budget_larger_than_the_node_is_a_usage_error() {
    refused(&["--ckpt-memory", "1000TiB"], "--ckpt-memory", "of RAM");
}

/// `drun --standalone ARGS --ckpt-dir DIR ckpt_worker.py` exits 2 with one line naming `flag`
/// that says `needle`, and starts nothing.
pub(super) fn refused(args: &[&str], flag: &str, needle: &str) {
    let d = dirs();
    let mut c: Command = drun();
    c.arg("--standalone")
        .args(args)
        .arg("--ckpt-dir")
        .arg(&d.ckpt)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(flag)).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(needle), "{err}");
    assert!(
        !d.out.exists() || std::fs::read_dir(&d.out).unwrap().next().is_none(),
        "a worker ran: {err}"
    );
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
    let stage = staging_dir(&d);
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
        // after the failure one step later. Once the workers stop (the failure, the run's end)
        // the agent's wait for the disk is what is checked, not its speed.
        .env("DRUN_CKPT_PERSIST_RATE", "40K")
        .env("DRUN_CKPT_PERSIST_RATE_HELD", "1G");
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

    let cmp = check(
        &python,
        &[
            "compare",
            d.out.join("faults/final.pt").to_str().unwrap(),
            example_reference(&python).to_str().unwrap(),
            "--tol",
            "0",
        ],
    );
    assert_eq!(cmp["max_abs_diff"], 0.0, "{cmp}");
}

/// `drun --standalone` with 2 `ckpt_worker.py` ranks of 6 steps, `--ckpt-dir` and `args`,
/// its tmpfs replaced by `stage`: the exit code and stderr.
fn six_steps(d: &Dirs, stage: &Path, args: &[&str]) -> (i32, String) {
    let mut c: Command = drun();
    c.args(["--standalone", "--rdzv-id", "ckpt-default"])
        .nproc(2)
        .args(["--shutdown-timeout", "30"])
        .args(args)
        .arg("--ckpt-dir")
        .arg(&d.ckpt)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out)
        .env("CKPT_STEPS", "6")
        .env("DRUN_CKPT_STAGE_PARENT", stage);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(60));
    (code, err)
}

/// Checkpoints in memory are the default: with `--ckpt-dir` and no `--ckpt-memory`, every save
/// is staged, its commit answered before it is sealed, and the end of the run leaves every step
/// sealed on disk and no staging directory behind.
#[test]
fn checkpoints_are_staged_in_memory_by_default() {
    let d = dirs();
    let stage = staging_dir(&d);
    let (code, err) = six_steps(&d, &stage, &[]);
    assert_eq!(code, 0, "{err}");
    let evs = events(&d);
    let committed: Vec<&Value> = evs.iter().filter(|e| e["event"] == "committed").collect();
    assert_eq!(committed.len(), 6, "steps 2, 4, 6 on both ranks: {evs:?}");
    for e in &committed {
        assert_eq!(e["staged"], true, "{e}");
        assert_eq!(e["sealed"], false, "{e}");
    }
    assert_eq!(assert_all_persisted(&d, &stage), [2, 4, 6]);
    assert_eq!(latest_step(&d), 6);
}

/// `--ckpt-memory off` keeps the direct path: nothing is staged (no staging directory is made),
/// each commit answers once its step is sealed with its file on disk.
#[test]
fn ckpt_memory_off_saves_straight_to_disk_and_the_commit_answers_sealed() {
    let d = dirs();
    let stage = staging_dir(&d);
    let (code, err) = six_steps(&d, &stage, &["--ckpt-memory", "off"]);
    assert_eq!(code, 0, "{err}");
    let evs = events(&d);
    let committed: Vec<&Value> = evs.iter().filter(|e| e["event"] == "committed").collect();
    assert_eq!(committed.len(), 6, "steps 2, 4, 6 on both ranks: {evs:?}");
    for e in &committed {
        assert_eq!(e["staged"], false, "{e}");
        assert_eq!(e["sealed"], true, "{e}");
        assert_eq!(e["on_disk"], true, "{e}");
    }
    assert!(
        !err.contains("persisted to --ckpt-dir"),
        "no wait for a persister: {err}"
    );
    assert_eq!(
        std::fs::read_dir(&stage).unwrap().count(),
        0,
        "nothing staged"
    );
    assert_eq!(latest_step(&d), 6);
}

/// Runs a `--standalone` agent of 2 ranks saving 6 steps, with `--ckpt-memory`'s tmpfs a real
/// 1 MiB tmpfs mounted at `shm` in a user and mount namespace (like a container's small
/// `/dev/shm`), filled up first when `fill`; `extra` flags go before `--ckpt-dir`. Its exit code
/// and stderr, or `None` (skipped with a note) where there are no such namespaces; required
/// where CI requires namespaces (`DRUN_REQUIRE_NETNS=1`).
fn in_small_tmpfs(
    d: &Dirs,
    shm: &Path,
    fill: bool,
    run_id: &str,
    extra: &[&str],
) -> Option<(i32, String)> {
    std::fs::create_dir_all(shm).unwrap();
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg(format!("mount -t tmpfs -o size=1m tmpfs {}", shm.display()))
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert_ne!(
            std::env::var("DRUN_REQUIRE_NETNS").as_deref(),
            Ok("1"),
            "DRUN_REQUIRE_NETNS=1 but no user and mount namespaces to mount a small tmpfs"
        );
        eprintln!("skipped: no unprivileged user and mount namespaces to mount a small tmpfs");
        return None;
    }
    let fill = if fill {
        format!(
            " && {{ dd if=/dev/zero of={}/fill bs=4k 2>/dev/null; true; }}",
            shm.display()
        )
    } else {
        String::new()
    };
    let mut c = crate::harness::clean_env(Command::new("unshare"));
    c.args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size=1m tmpfs {}{fill} && exec \"$0\" \"$@\"",
            shm.display()
        ))
        .arg(crate::harness::drun_bin())
        .args(["--standalone", "--rdzv-id", run_id])
        .nproc(2)
        .args(["--shutdown-timeout", "30"])
        .args(extra)
        .arg("--ckpt-dir")
        .arg(&d.ckpt)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out)
        .env("CKPT_STEPS", "6")
        .env("DRUN_CKPT_STAGE_PARENT", shm);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(60));
    Some((code, err))
}

/// A tmpfs with no room left (a real 1 MiB tmpfs filled up, in a user and mount namespace), at
/// the default `--ckpt-memory`: one warning line, nothing staged, every save goes straight to
/// disk and every step is sealed.
#[test]
fn a_full_tmpfs_is_one_warning_and_saves_go_to_disk() {
    let d = dirs();
    let shm = d.out.parent().unwrap().join("full-shm");
    let Some((code, err)) = in_small_tmpfs(&d, &shm, true, "ckpt-memory-full", &[]) else {
        return;
    };
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("--ckpt-memory"))
        .collect();
    assert_eq!(lines.len(), 1, "one line:\n{err}");
    let want = format!("drun: warning: --ckpt-memory: {} is full (", shm.display());
    assert!(
        lines[0].starts_with(&want) && lines[0].contains("saved straight to --ckpt-dir"),
        "{}\nwant: {want}…",
        lines[0]
    );
    assert!(!err.contains("cannot stage"), "{err}");
    let evs = events(&d);
    for e in evs.iter().filter(|e| e["event"] == "committed") {
        assert_eq!(e["staged"], false, "{e}");
        assert_eq!(e["sealed"], true, "{e}");
        assert_eq!(e["on_disk"], true, "{e}");
    }
    assert_eq!(count(&evs, "committed", |_| true), 6);
    assert_eq!(latest_step(&d), 6);
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

/// A budget the node can hold but its tmpfs has no room for (a real 1 MiB tmpfs, mounted in a
/// user and mount namespace, like a container's small `/dev/shm`): one warning line naming both
/// and what drun does, and the run stages and seals every step as usual (they fit in 1 MiB).
#[test]
fn a_budget_larger_than_the_tmpfs_has_free_is_one_warning_naming_both() {
    let d = dirs();
    let shm = d.out.parent().unwrap().join("small-shm");
    let Some((code, err)) = in_small_tmpfs(
        &d,
        &shm,
        false,
        "ckpt-memory-shm",
        &["--ckpt-memory", "64M"],
    ) else {
        return;
    };
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("has free")).collect();
    assert_eq!(lines.len(), 1, "one line:\n{err}");
    let want = format!(
        "drun: warning: --ckpt-memory 64 MiB is more than {} has free (",
        shm.display()
    );
    assert!(
        lines[0].starts_with(&want)
            && lines[0].contains("): this agent stages at most ")
            && lines[0].contains("a save that does not fit goes straight to --ckpt-dir"),
        "{}\nwant: {want}…",
        lines[0]
    );
    let evs = events(&d);
    for e in evs.iter().filter(|e| e["event"] == "committed") {
        assert_eq!(e["staged"], true, "a few KB still fit: {e}");
    }
    assert_eq!(count(&evs, "committed", |_| true), 6);
    assert_eq!(latest_step(&d), 6);
}

/// A run stopped by SIGTERM while its staged steps are still being written: the agent persists
/// them before it exits (within --shutdown-timeout), says how long it waited, and every step the
/// ranks committed is sealed on disk.
#[test]
fn sigterm_waits_for_the_staged_steps_and_says_how_long() {
    let d = dirs();
    let stage = staging_dir(&d);
    let a = holding_at_step_6(&d, &stage);
    assert!(latest_step(&d) < 6, "step 6 is not on disk yet");
    a.signal(Signal::SIGTERM);
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 128 + 15, "{err}");
    let waited = err
        .lines()
        .find(|l| l.contains("for the staged checkpoints to be persisted to --ckpt-dir"))
        .unwrap_or_else(|| panic!("says how long it waited:\n{err}"));
    assert!(waited.starts_with("drun: waited "), "{waited}");
    assert_eq!(latest_step(&d), 6, "the last committed step is sealed");
    assert_eq!(assert_all_persisted(&d, &stage), [2, 4, 6]);
}

/// The same with a --shutdown-timeout too short for the disk: the agent gives up at the limit
/// and names the steps it could not persist; none of them is sealed, nothing half-written is a
/// resume point.
#[test]
fn sigterm_waits_at_most_the_shutdown_timeout_and_names_what_is_not_persisted() {
    let d = dirs();
    let stage = staging_dir(&d);
    let mut c: Command = drun();
    c.args(["--standalone", "--rdzv-id", "ckpt-memory-bounded"])
        .nproc(2)
        .args([
            "--shutdown-timeout",
            "2",
            "--ckpt-memory",
            "64M",
            "--ckpt-dir",
        ])
        .arg(&d.ckpt)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out)
        .env("CKPT_HOLD_AT", "6")
        .env("DRUN_CKPT_STAGE_PARENT", &stage)
        // About 5.6 KB a step at 500 B/s: 11 s a step, far past the 2 s limit.
        .env("DRUN_CKPT_PERSIST_RATE", "500");
    let a = Agent::start(c);
    wait_for(
        "both ranks hold after step 6",
        Duration::from_secs(60),
        || count(&events(&d), "holding", |e| e["step"] == 6) == 2,
    );
    a.signal(Signal::SIGTERM);
    let t = std::time::Instant::now();
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 128 + 15, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "bounded by --shutdown-timeout: {:?}",
        t.elapsed()
    );
    let line = err
        .lines()
        .find(|l| l.contains("are not persisted to --ckpt-dir"))
        .unwrap_or_else(|| panic!("names what it could not persist:\n{err}"));
    assert!(
        line.contains("(--shutdown-timeout) checkpoint step(s) ")
            && line.contains("6 (generation 1)"),
        "{line}"
    );
    assert_eq!(
        err.matches("are not persisted to --ckpt-dir").count(),
        1,
        "said once:\n{err}"
    );
    let sealed = manifest_files(&d);
    assert!(
        !sealed.iter().any(|(s, _)| *s == 6),
        "step 6 never reached the disk and is not sealed: {sealed:?}"
    );
    // The persister stopped with the agent: the file it was writing left no temporary file
    // (the next agent on the node used to report it as a killed agent's).
    let temps: Vec<_> = files_under(&d.ckpt)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".drun-persist-"))
        })
        .collect();
    assert!(temps.is_empty(), "temporary files left: {temps:?}");
}

/// The agent SIGKILLed while it is writing a staged step to --ckpt-dir: no half step becomes a
/// resume point. The run (etcd) re-forms with a new agent on the node, which removes the killed
/// agent's temporary files and its staging directory at its start (one line each), resumes the
/// last step sealed before the kill, and trains to the end.
#[test]
fn an_agent_killed_mid_persist_leaves_no_half_step_to_resume() {
    let d = dirs();
    let stage = staging_dir(&d);
    let r = rdzv(Store::Etcd, "ckpt-memory-kill", "1");
    let start = |rate: &str, hold: bool| {
        let mut c: Command = drun();
        c.args(&r.args)
            .nproc(2)
            .node(0)
            .args([
                "--shutdown-timeout",
                "30",
                "--ckpt-memory",
                "64M",
                "--ckpt-dir",
            ])
            .arg(&d.ckpt)
            .arg(worker("ckpt_worker.py"))
            .env("CKPT_OUT", &d.out)
            .env("DRUN_CKPT_STAGE_PARENT", &stage)
            .env("DRUN_CKPT_PERSIST_RATE", rate);
        if hold {
            c.env("CKPT_HOLD_AT", "6");
        }
        Agent::start(c)
    };
    // About 5.6 KB a step at 1000 B/s: each step takes ~3 s to reach the disk.
    let a = start("1000", true);
    let mut half = None;
    wait_for(
        "step 2 sealed and a later step half-written to --ckpt-dir",
        Duration::from_secs(60),
        || {
            half = files_under(&d.ckpt)
                .into_iter()
                .find(|f| f.to_string_lossy().contains(".drun-persist-"));
            latest_step(&d) >= 2 && half.is_some()
        },
    );
    a.signal(Signal::SIGKILL);
    drop(a);
    let sealed_before = latest_step(&d);
    let half = half.unwrap();
    let half_step = half
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap();
    let half_step: u64 = half_step
        .strip_prefix("step-")
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(half_step > sealed_before, "{half_step} vs {sealed_before}");
    assert!(
        manifest_files(&d).iter().all(|(s, _)| *s <= sealed_before),
        "nothing after step {sealed_before} is sealed: {:?}",
        manifest_files(&d)
    );

    assert!(half.exists(), "the killed agent left {}", half.display());
    let killed_stage: Vec<PathBuf> = std::fs::read_dir(&stage)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(
        killed_stage.len(),
        1,
        "the killed agent left its staging directory: {killed_stage:?}"
    );
    let b = start("1G", false);
    let (code, _, err) = b.wait(Duration::from_secs(120));
    assert_eq!(code, 0, "{err}");
    // The new agent removed the killed one's temporary files at its start, in one line.
    let removed: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("temporary file") && l.contains("left in"))
        .collect();
    assert_eq!(removed.len(), 1, "{err}");
    assert!(
        removed[0].starts_with("drun: removed ")
            && removed[0].contains(&half.display().to_string()),
        "{}",
        removed[0]
    );
    assert!(!half.exists(), "{} was removed", half.display());
    // And its staging directory on the tmpfs (its staged copies held memory), in one line.
    let swept: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("staging director"))
        .collect();
    assert_eq!(swept.len(), 1, "{err}");
    assert!(
        swept[0].starts_with("drun: removed 1 staging directory (")
            && swept[0].contains(&killed_stage[0].display().to_string()),
        "{}",
        swept[0]
    );
    assert_eq!(
        std::fs::read_dir(&stage).unwrap().count(),
        0,
        "no staging directory is left"
    );
    let temps: Vec<PathBuf> = files_under(&d.ckpt)
        .into_iter()
        .filter(|f| f.to_string_lossy().contains(".drun-persist-"))
        .collect();
    assert!(temps.is_empty(), "no temporary file is left: {temps:?}");
    let evs = events(&d);
    let resumed: Vec<&Value> = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"].as_u64() > Some(1))
        .collect();
    assert!(!resumed.is_empty(), "{evs:?}");
    for s in &resumed {
        assert_eq!(
            s["resume_step"], sealed_before,
            "resumed the last step sealed before the kill, not the half-written {half_step}: {s}"
        );
    }
    assert!(
        !manifest_files(&d).contains(&(half_step, 1)),
        "the half-written step of generation 1 was never sealed: {:?}",
        manifest_files(&d)
    );
    // The half-written file is named by no manifest: the new generation's steps are its own.
    for f in files_under(&d.ckpt).iter().filter(|f| {
        f.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("drun-manifest-"))
    }) {
        let m = read_json(f);
        assert!(
            !m.to_string().contains(".drun-persist-"),
            "a manifest names a temporary file: {m}"
        );
    }
    assert_eq!(latest_step(&d), 12);
}

/// A `--standalone` run of 2 ranks of the torch worker `script` staging in 64 MiB of memory
/// (`more` drun flags before the checkpoint's), which must succeed; each rank's JSON report
/// (`rank<R>.json` in `d.out`).
fn staged_torch_reports(
    python: &Path,
    d: &Dirs,
    run: &str,
    more: &[&str],
    script: &str,
) -> Vec<Value> {
    let stage = staging_dir(d);
    let mut c = drun();
    c.python(python)
        .args(["--standalone", "--rdzv-id", run])
        .nproc(2)
        .args(more)
        .args(["--ckpt-memory", "64M", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(worker(script))
        .env("CKPT_OUT", &d.out)
        .env("DRUN_CKPT_STAGE_PARENT", &stage);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(180));
    assert_eq!(code, 0, "{err}");
    (0..2)
        .map(|rank| {
            let text = std::fs::read_to_string(d.out.join(format!("rank{rank}.json")))
                .unwrap_or_else(|e| panic!("rank {rank} wrote no report ({e}): {err}"));
            serde_json::from_str(&text).unwrap()
        })
        .collect()
}

/// Real torch: a staged `torch.save` skips its zip CRC-32s (the agent's SHA-256 covers the
/// file) and writes over staging memory allocated ahead (a spare file per rank), a smaller
/// state than its spare and a larger one alike; every persisted copy loads back exactly.
#[test]
fn torch_staged_saves_skip_the_zip_crc_and_write_over_spare_memory_exactly() {
    let Some(python) = crate::harness::torch_python() else {
        eprintln!("skipped: no torch interpreter (DRUN_TORCH_PYTHON)");
        return;
    };
    let d = dirs();
    let more = ["--ckpt-keep-last", "8"];
    for r in staged_torch_reports(&python, &d, "ckpt-memory-spare", &more, "staged_saves.py") {
        assert_eq!(
            r["spare_before"],
            serde_json::json!([false, true, true, true]),
            "every save after the first had its spare staging memory ready: {r}"
        );
        let steps = r["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 4, "{r}");
        for s in steps {
            assert_eq!(
                s["equal"], true,
                "the persisted copy loads back exactly: {s}"
            );
            assert_eq!(
                s["crcs"],
                serde_json::json!([0]),
                "no CRC-32 computed in the training's thread: {s}"
            );
        }
        let bytes: Vec<u64> = steps.iter().map(|s| s["bytes"].as_u64().unwrap()).collect();
        assert!(
            bytes[1] < bytes[0] && bytes[2] > bytes[0] && bytes[3] == bytes[1],
            "a save over a larger spare is cut to its own size: {bytes:?}"
        );
    }
}

/// Once the budget is full, a step released from memory (on disk already) becomes its ranks'
/// spares: the rank's next save is written over that file's pages, not over freshly allocated
/// ones, and every persisted copy still holds exactly its own bytes (a smaller save over a
/// larger released file is cut to its size).
#[test]
fn a_released_step_on_disk_becomes_the_ranks_next_spares_and_every_copy_stays_exact() {
    let d = dirs();
    let stage = staging_dir(&d);
    let mut c = drun();
    // 1 MiB per rank: a step of the node is 2 MiB, and each rank's spare about 2 MiB
    // (`_stage.py`: the size, 1/64 more and 1 MiB). 9 MiB holds two steps and the two spares
    // for the next save, and at the third save the first step (sealed, so on disk) leaves
    // memory to make room for the spares.
    c.args(["--standalone", "--rdzv-id", "ckpt-memory-recycle"])
        .nproc(2)
        .args(["--ckpt-keep-last", "8", "--ckpt-memory", "9M", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(worker("staged_recycle.py"))
        .env("CKPT_OUT", &d.out)
        .env("DRUN_CKPT_STAGE_PARENT", &stage);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(120));
    assert_eq!(code, 0, "{err}");
    for rank in 0..2 {
        let text = std::fs::read_to_string(d.out.join(format!("rank{rank}.json")))
            .unwrap_or_else(|e| panic!("rank {rank} wrote no report ({e}): {err}"));
        let r: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            r["equal"],
            serde_json::json!([true, true, true, true, true]),
            "rank {rank}: every persisted copy holds its own bytes: {r}"
        );
        let spare = r["spare_ino"].as_array().unwrap();
        let staged = r["staged_ino"].as_array().unwrap();
        assert!(
            spare[0].is_null(),
            "rank {rank}: no spare before the first save: {r}"
        );
        // The spare before save 2 was allocated fresh (nothing had left memory), and it became
        // step 2's staged file.
        assert!(spare[1].is_u64(), "rank {rank}: {r}");
        assert_eq!(
            spare[1], staged[1],
            "rank {rank}: save 2 went over its spare: {r}"
        );
        // Save 3 released step 1 and save 4 step 2: saves 4 and 5 went over their files (save
        // 5, half the size, over step 2's whole MiB).
        assert_eq!(
            spare[3], staged[0],
            "rank {rank}: save 4 over step 1's pages: {r}"
        );
        assert_eq!(
            spare[4], staged[1],
            "rank {rank}: save 5 over step 2's pages: {r}"
        );
    }
}

/// Real torch: a rank SIGKILLed halfway through a staged `torch.save` written over its spare
/// staging memory leaves nothing of that step sealed: the restart resumes the step before, whose
/// persisted copy loads back exactly, and no manifest names the half-written step.
#[test]
fn torch_a_rank_killed_mid_save_over_its_spare_leaves_the_step_unsealed() {
    let Some(python) = crate::harness::torch_python() else {
        eprintln!("skipped: no torch interpreter (DRUN_TORCH_PYTHON)");
        return;
    };
    let d = dirs();
    let more = ["--max-restarts", "1", "--shutdown-timeout", "60"];
    for r in staged_torch_reports(&python, &d, "ckpt-memory-killed", &more, "staged_kill.py") {
        assert_eq!(r["resumed"], 1, "the restart resumes the step before: {r}");
        assert_eq!(
            r["equal"], true,
            "its persisted copy loads back exactly: {r}"
        );
    }
    assert!(
        manifest_files(&d).iter().all(|&(step, _)| step == 1),
        "no manifest names the half-written step 2: {:?}",
        manifest_files(&d)
    );
}
