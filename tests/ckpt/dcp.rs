//! `torch.distributed.checkpoint` through `drun.dcp` (real torch, gloo on CPU): a node killed
//! mid-run, a corrupted `.distcp` file, and `async_save` whose write never finished.

use super::*;

/// Training steps, checkpoint period and the step the first generation holds at.
const STEPS: &str = "24";
const EVERY: &str = "4";
const HOLD_AT: &str = "14";

/// An agent on loopback address 127.0.0.(i+1) running `dcp_train.py` with `nproc` workers,
/// started cold (`--warm-workers off`): warm interpreters are `tests/warm.rs`'s subject, and here
/// most would import torch for a generation that never comes (the killed node's, the one after
/// the last), a third of the test's CPU time.
fn dcp_agent(
    python: &Path,
    i: usize,
    r: &Rdzv,
    d: &Dirs,
    nproc: u32,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Agent {
    let mut c: Command = drun();
    c.python(python)
        .args(&r.args)
        .nproc(nproc)
        .node(i)
        .args([
            "--max-restarts",
            "3",
            "--shutdown-timeout",
            "5",
            "--warm-workers",
            "off",
            "--ckpt-dir",
        ])
        .arg(&d.ckpt)
        .args(extra)
        .arg(worker("dcp_train.py"))
        .env("DCP_OUT", &d.out)
        .env("DCP_STEPS", STEPS)
        .env("DCP_EVERY", EVERY);
    for (k, v) in env {
        c.env(k, v);
    }
    Agent::start(c)
}

/// The same training without faults on one node of 4 workers; its `final.pt`. Without warm
/// workers: nothing restarts, so a waiting interpreter per rank would import torch for nothing.
fn fault_free(python: &Path) -> PathBuf {
    fault_free_on(python, "4")
}

/// The same training without faults on one node of `nproc` workers; its `final.pt`, trained once
/// per nextest run for every test that compares with it.
fn fault_free_on(python: &Path, nproc: &str) -> PathBuf {
    let name = format!("dcp-train-{nproc}-ranks-{STEPS}-steps-every-{EVERY}");
    let dir = crate::harness::reference::shared(&name, |dir| {
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let mut c = drun();
        c.python(python)
            .args([
                "--standalone",
                "--nproc-per-node",
                nproc,
                "--warm-workers",
                "off",
            ])
            .arg("--ckpt-dir")
            .arg(dir.join("ckpt"))
            .arg(worker("dcp_train.py"))
            .env("DCP_OUT", &out)
            .env("DCP_STEPS", STEPS)
            .env("DCP_EVERY", EVERY);
        let (code, _, err) = crate::harness::run(c, Duration::from_secs(300));
        assert_eq!(code, 0, "fault-free run:\n{err}");
    });
    dir.join("out/final.pt")
}

/// The `start` events of the newest generation that started workers.
fn last_starts(evs: &[Value]) -> Vec<Value> {
    let last = evs
        .iter()
        .filter(|e| e["event"] == "start")
        .map(|e| e["gen"].as_u64().unwrap())
        .max()
        .expect("workers started");
    evs.iter()
        .filter(|e| e["event"] == "start" && e["gen"] == last)
        .cloned()
        .collect()
}

/// The sealed manifest lists every file of its DCP directory exactly once, `.metadata` under
/// rank 0, each with its true size.
fn assert_lists_the_directory(m: &Value) {
    let files = m["files"].as_array().unwrap();
    let dir = Path::new(files[0]["path"].as_str().unwrap())
        .parent()
        .unwrap();
    let mut listed: Vec<String> = files
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    let n = listed.len();
    listed.dedup();
    assert_eq!(listed.len(), n, "each file once: {m}");
    let mut on_disk: Vec<String> = files_under(dir)
        .iter()
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("drun-manifest-")
        })
        .map(|p| p.display().to_string())
        .collect();
    on_disk.sort();
    assert_eq!(listed, on_disk, "the manifest lists the step's directory");
    for f in files {
        let p = f["path"].as_str().unwrap();
        assert_eq!(
            std::fs::metadata(p).unwrap().len(),
            f["bytes"].as_u64().unwrap()
        );
        if p.ends_with("/.metadata") {
            assert_eq!(f["rank"], 0, "DCP's shared metadata is rank 0's: {f}");
        }
    }
    assert!(listed.iter().any(|p| p.ends_with("/.metadata")), "{m}");
}

fn assert_same_model(python: &Path, faults: &Path, clean: &Path) {
    let cmp = check(
        python,
        &[
            "compare",
            faults.to_str().unwrap(),
            clean.to_str().unwrap(),
            "--tol",
            "1e-5",
        ],
    );
    eprintln!("final model vs fault-free run: {cmp}");
}

/// 2 nodes × 2 workers save with DCP every 4 steps; node 1 is SIGKILLed while the first
/// generation holds after step 12 sealed (with `async_save`, the write of step 12 never
/// finishes, so step 8 is the newest sealed one). Returns the step every rank resumed from.
fn node_killed(async_write: bool) -> Option<u64> {
    let python = crate::harness::torch_python()?;
    let d = dirs();
    let r = rdzv(Store::Etcd, "dcp-kill", "2");
    let mut env = vec![("DCP_HOLD_AT", HOLD_AT)];
    if async_write {
        env.extend([("DCP_ASYNC", "1"), ("DCP_SLOW_STEP", "12")]);
    }
    let a = dcp_agent(&python, 0, &r, &d, 2, &[], &env);
    let b = dcp_agent(&python, 1, &r, &d, 2, &[], &env);
    let sealed = if async_write { 8 } else { 12 };
    wait_for(
        "4 ranks holding at step 14 with the checkpoint sealed",
        Duration::from_secs(300),
        || {
            count(&events(&d), "holding", |_| true) == 4
                && latest_step(&d) == sealed
                && (!async_write
                    || (0..4).all(|r| d.out.join(format!("writing-12-rank{r}")).exists()))
        },
    );
    let m = latest(&d).unwrap();
    assert_eq!(m["world_size"], 4);
    assert_lists_the_directory(&m);
    b.signal(Signal::SIGKILL);
    drop(b);
    let b2 = dcp_agent(&python, 1, &r, &d, 2, &[], &env);
    let (ca, _, ea) = a.wait(Duration::from_secs(300));
    let (cb, _, eb) = b2.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (0, 0), "A:\n{ea}\nB':\n{eb}");

    let evs = events(&d);
    let starts = last_starts(&evs);
    assert_eq!(starts.len(), 4, "{starts:?}");
    for s in &starts {
        assert_eq!(
            s["resume_step"], sealed,
            "every rank resumes the sealed step: {s}"
        );
        assert_eq!(
            s["resume_path"], starts[0]["resume_path"],
            "from the same directory"
        );
    }
    let dir = starts[0]["resume_path"].as_str().unwrap();
    assert!(
        dir.ends_with(&format!("/step-{sealed:08}-g1")),
        "the step's DCP directory: {dir}"
    );
    assert!(
        !evs.iter()
            .any(|e| e["event"] == "start" && e["resume_step"] == 12 && async_write),
        "no rank resumed from the unfinished async write"
    );
    if async_write {
        assert!(
            !manifest_files(&d).contains(&(12, 1)),
            "the unfinished step 12 of generation 1 was never sealed: {:?}",
            manifest_files(&d)
        );
    }
    assert_eq!(count(&evs, "done", |_| true), 4);
    assert_same_model(&python, &d.out.join("final.pt"), &fault_free(&python));
    Some(sealed)
}

#[test]
fn dcp_node_killed_every_rank_resumes_the_same_sealed_directory() {
    node_killed(false);
}

#[test]
fn dcp_async_save_unfinished_write_is_never_resumed_from() {
    node_killed(true);
}

#[test]
fn dcp_corrupted_distcp_falls_back_to_the_previous_step() {
    let Some(python) = crate::harness::torch_python() else {
        return;
    };
    let d = dirs();
    let r = rdzv(Store::Memory, "dcp-corrupt", "2");
    let verify = ["--ckpt-verify", "digest"];
    let hold = [("DCP_HOLD_AT", HOLD_AT)];
    let a = dcp_agent(&python, 0, &r, &d, 2, &verify, &hold);
    let b = dcp_agent(&python, 1, &r, &d, 2, &verify, &hold);
    wait_for(
        "4 ranks holding with step 12 sealed",
        Duration::from_secs(300),
        || count(&events(&d), "holding", |_| true) == 4 && latest_step(&d) == 12,
    );
    let m = latest(&d).unwrap();
    assert_lists_the_directory(&m);
    let f = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .find(|p| p.ends_with(".distcp"))
        .expect("a .distcp file");
    let mut bytes = std::fs::read(&f).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&f, &bytes).unwrap();
    std::fs::write(d.out.join("crash"), b"").unwrap();

    let (code_a, _, err_a) = a.wait(Duration::from_secs(300));
    let (code_b, _, err_b) = b.wait(Duration::from_secs(60));
    assert_eq!(
        (code_a, code_b),
        (0, 0),
        "recovered and finished:\nA:\n{err_a}\nB:\n{err_b}"
    );
    // Both nodes verify the shared step (digest): the one that finds the damage first marks it
    // bad and says so in one line (both may, when they verify at the same moment); the other
    // re-forms onto the previous step.
    let said = |err: &str| {
        err.lines()
            .filter(|l| l.starts_with("drun: ") && l.contains("failed verification"))
            .count()
    };
    assert!(
        said(&err_a) <= 1 && said(&err_b) <= 1,
        "at most once per node:\nA:\n{err_a}\nB:\n{err_b}"
    );
    let line = super::fallback_line(if said(&err_a) == 1 { &err_a } else { &err_b });
    assert!(
        line.starts_with("drun: checkpoint step 12 (generation 1) failed verification:")
            && line.contains(".distcp"),
        "{line}"
    );
    let evs = events(&d);
    for s in last_starts(&evs) {
        assert_eq!(s["resume_step"], 8, "every rank resumes from step 8: {s}");
    }
    assert_eq!(count(&evs, "done", |_| true), 4);
    assert_eq!(latest_step(&d), 24);
}

/// `--ckpt-memory` on one node of 2 workers, its persister slowed so the disk lags the training:
/// `drun.dcp.save` (or `async_save`) writes the step's staged directory in memory and the commit
/// is answered staged, not sealed; rank 0 fails after step 12 was staged; the failure waits for
/// the persister, and the restarted ranks load step 12 from memory. The final model is the
/// fault-free run's exactly; at the end every sealed step is on disk, whole, with no temporary
/// file left and the staging directory gone.
fn dcp_staged_step_resumed_exactly(async_write: bool) {
    let Some(python) = crate::harness::torch_python() else {
        eprintln!("skipped: no torch interpreter (DRUN_TORCH_PYTHON)");
        return;
    };
    let d = dirs();
    let stage = d.out.parent().unwrap().join("shm");
    std::fs::create_dir_all(&stage).unwrap();
    let mut c: Command = drun();
    c.python(&python)
        .args(["--standalone", "--rdzv-id", "dcp-memory"])
        .nproc(2)
        .args(["--max-restarts", "1", "--shutdown-timeout", "60"])
        .args(["--ckpt-memory", "64M", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(worker("dcp_train.py"))
        .env("DCP_OUT", &d.out)
        .env("DCP_STEPS", STEPS)
        .env("DCP_EVERY", EVERY)
        .env("DCP_HOLD_AT", HOLD_AT)
        .env("DRUN_CKPT_STAGE_PARENT", &stage)
        // About 22 KB a step (DCP's metadata) at 4000 B/s: each step reaches the disk some
        // 5 s after its commit, long after the failure. Once the workers stop (the failure,
        // the run's end) the agent's wait for the disk is what is checked, not its speed.
        .env("DRUN_CKPT_PERSIST_RATE", "4000")
        .env("DRUN_CKPT_PERSIST_RATE_HELD", "1G");
    if async_write {
        c.env("DCP_ASYNC", "1").env("DCP_WAIT_HOLD", "1");
    }
    let a = Agent::start(c);
    wait_for(
        "both ranks hold at step 14 with step 12 committed",
        Duration::from_secs(300),
        || {
            let evs = events(&d);
            count(&evs, "holding", |_| true) == 2
                && count(&evs, "committed", |e| e["step"] == 12) == 2
        },
    );
    assert!(
        latest_step(&d) < 12,
        "step 12 is not sealed yet: the disk lags"
    );
    std::fs::write(d.out.join("crash"), b"").unwrap();
    let (code, _, err) = a.wait(Duration::from_secs(300));
    assert_eq!(code, 0, "{err}");
    let evs = events(&d);
    for e in evs.iter().filter(|e| e["event"] == "committed") {
        assert_eq!(e["staged"], true, "answered staged: {e}");
        assert_eq!(e["sealed"], false, "not sealed before it is on disk: {e}");
    }
    assert!(
        err.contains("for the staged checkpoints to be persisted"),
        "the failure waited for the disk: {err}"
    );
    let from_memory = err
        .lines()
        .find(|l| l.contains("resuming from the staged copy in memory"))
        .unwrap_or_else(|| panic!("resumed from memory: {err}"));
    assert!(from_memory.contains("step=12"), "{from_memory}");
    let starts = last_starts(&evs);
    assert_eq!(starts.len(), 2, "{starts:?}");
    for s in &starts {
        assert_eq!(s["resume_step"], 12, "{s}");
        let path = s["resume_path"].as_str().unwrap();
        assert!(
            Path::new(path).starts_with(&stage) && path.ends_with("/step-00000012-g1"),
            "DCP loaded the staged directory in memory, not {path}"
        );
    }
    assert_eq!(count(&evs, "done", |_| true), 2);
    assert_eq!(latest_step(&d), 24, "the end waited for every step");
    assert_eq!(assert_all_persisted(&d, &stage), [4, 8, 12, 16, 20, 24]);
    assert_lists_the_directory(&latest(&d).unwrap());

    let clean = fault_free_on(&python, "2");
    let cmp = check(
        &python,
        &[
            "compare",
            d.out.join("final.pt").to_str().unwrap(),
            clean.to_str().unwrap(),
            "--tol",
            "0",
        ],
    );
    assert_eq!(cmp["max_abs_diff"], 0.0, "{cmp}");
}

#[test]
fn dcp_save_in_memory_a_worker_failure_resumes_the_staged_step_exactly() {
    dcp_staged_step_resumed_exactly(false);
}

#[test]
fn dcp_async_save_in_memory_a_worker_failure_resumes_the_staged_step_exactly() {
    dcp_staged_step_resumed_exactly(true);
}
