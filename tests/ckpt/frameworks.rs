//! PyTorch Lightning and Hugging Face Accelerate scripts through the ledger (the real packages
//! from PyPI, gloo on CPU): a worker SIGKILLed mid-run, the group resumes at the sealed step.

use nix::sys::signal::kill;
use nix::unistd::Pid;

use super::*;

/// The torch venv's python, with the framework packages `.ci/setup` installs; fails (never
/// skips silently) when they are missing.
fn framework_python() -> Option<PathBuf> {
    let python = crate::harness::torch_python()?;
    let o = Command::new(&python)
        .args(["-c", "import lightning, accelerate, torchdata"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{} lacks lightning, accelerate or torchdata; run .ci/setup (it installs them into the venv): {}",
        python.display(),
        String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
    );
    Some(python)
}

/// `script` under one standalone agent with 2 workers holds after step 10 (steps 4 and 8
/// sealed); rank 1 is SIGKILLed; the restarted group resumes at step 8 with step 8's weights and
/// trains to step 16.
/// `rank1_files`: the names of the files rank 1 commits (none: a rank without files takes part).
/// With `memory` (`--ckpt-memory`, a persister slowed so the disk lags), the rank is killed as
/// soon as both hold, whether step 8 is on disk yet or not; the restarted group loads step 8
/// from the staged copy in memory, and at the end every sealed step is on disk.
fn survives_a_worker_kill(script: &str, rank1_files: &[&str], memory: bool) {
    let Some(python) = framework_python() else {
        return;
    };
    let d = dirs();
    let stage = d.out.parent().unwrap().join("shm");
    let mut c: Command = drun();
    c.python(&python)
        .args(["--standalone", "--max-restarts", "1", "--ckpt-dir"])
        .arg(&d.ckpt)
        .nproc(2)
        .env("FW_OUT", &d.out)
        .env("FW_STEPS", "16")
        .env("FW_HOLD_AT", "10");
    if memory {
        std::fs::create_dir_all(&stage).unwrap();
        c.args(["--ckpt-memory", "64M", "--shutdown-timeout", "60"])
            .env("DRUN_CKPT_STAGE_PARENT", &stage)
            .env("DRUN_CKPT_PERSIST_RATE", "16K");
    } else {
        c.quick_shutdown();
    }
    c.arg(worker(script));
    let a = Agent::start(c);
    wait_for(
        "both ranks holding after step 10 with step 8 sealed (or staged)",
        Duration::from_secs(300),
        || count(&events(&d), "holding", |_| true) == 2 && (memory || latest_step(&d) == 8),
    );
    let evs = events(&d);
    let victim = evs
        .iter()
        .find(|e| e["event"] == "holding" && e["rank"] == 1)
        .unwrap()["pid"]
        .as_i64()
        .unwrap();
    kill(Pid::from_raw(victim as i32), Signal::SIGKILL).unwrap();
    let (code, _, err) = a.wait(Duration::from_secs(300));
    assert_eq!(code, 0, "recovered and finished:\n{err}");

    let evs = events(&d);
    let first_gen = evs
        .iter()
        .map(|e| e["gen"].as_u64().unwrap())
        .min()
        .unwrap();
    let saved = evs
        .iter()
        .find(|e| e["event"] == "at" && e["step"] == 8 && e["rank"] == 0 && e["gen"] == first_gen)
        .expect("step 8's weights recorded")["weight"]
        .clone();
    let resumed: Vec<&Value> = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"] != first_gen)
        .collect();
    assert_eq!(resumed.len(), 2, "both ranks restarted once: {resumed:?}");
    for s in resumed {
        assert_eq!(s["resume_step"], 8, "resumed at the sealed step: {s}");
        if memory {
            let path = s["resume_path"].as_str().unwrap();
            assert!(
                Path::new(path).starts_with(&stage),
                "from the staged copy in memory, not {path}:\n{err}"
            );
        }
        assert_eq!(s["step"], 8, "the framework's step counter too: {s}");
        assert_eq!(s["weight"], saved, "with step 8's weights: {s}");
    }
    assert_eq!(count(&evs, "done", |e| e["step"] == 16), 2, "{evs:?}");
    let m = latest(&d).unwrap();
    assert_eq!(m["step"], 16);
    let files = m["files"].as_array().unwrap();
    assert!(!files.is_empty(), "{m}");
    let mut paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(paths.len(), files.len(), "each file once: {m}");
    let of_rank1: Vec<&str> = files
        .iter()
        .filter(|f| f["rank"] == 1)
        .map(|f| f["path"].as_str().unwrap().rsplit('/').next().unwrap())
        .collect();
    assert_eq!(of_rank1, rank1_files, "{m}");
    if memory {
        assert!(
            err.contains("resuming from the staged copy in memory"),
            "{err}"
        );
        assert_eq!(assert_all_persisted(&d, &stage), [4, 8, 12, 16]);
    }
}

#[test]
fn lightning_callback_survives_a_worker_kill() {
    survives_a_worker_kill("lightning_train.py", &[], false);
}

#[test]
fn accelerate_recipe_survives_a_worker_kill() {
    survives_a_worker_kill("accelerate_train.py", &["random_states_1.pkl"], false);
}

#[test]
fn lightning_callback_in_memory_resumes_the_staged_step() {
    survives_a_worker_kill("lightning_train.py", &[], true);
}

#[test]
fn accelerate_recipe_in_memory_resumes_the_staged_step() {
    survives_a_worker_kill("accelerate_train.py", &["random_states_1.pkl"], true);
}
