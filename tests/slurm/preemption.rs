//! Preemption: the warning signal, a coordinated save, requeue and resume; scancel.

use super::*;

#[test]
fn slurm_preemption_warning_checkpoints_requeues_and_resumes_at_the_same_sample() {
    preemption(&["--signal=USR1"]);
}

#[test]
fn slurm_preemption_warning_to_the_batch_shell_only_works_too() {
    // `scancel -b` / `--signal=B:USR1@N`: the example's batch script passes it to srun.
    preemption(&["-b", "--signal=USR1"]);
}

fn preemption(scancel: &[&str]) {
    if !cluster() {
        return;
    }
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("idx");
    // No periodic checkpoint: the only one is the coordinated save of the warning.
    let args = format!(
        "--epochs 2 --global-batch 64 --ckpt-every 100000 --step-sleep 0.05 --record-indices {}",
        idx.display()
    );
    let env = example_env(&python, dir.path(), &args);
    let id = submit_example(dir.path(), &env);
    let _c = Cancel(id.clone());
    wait_for("training to be under way", Duration::from_secs(120), || {
        out_of(dir.path()).contains("[rank0]:step=20 ")
    });
    assert!(Command::new("scancel")
        .args(scancel)
        .arg(&id)
        .status()
        .unwrap()
        .success());
    wait_for("the job to be requeued", Duration::from_secs(60), || {
        job(&id).get("Restarts").is_some_and(|r| r == "1")
    });
    // Skip the requeue delay (cred_expire + 1 s) as slurm.md describes.
    wait_for(
        "the requeued job to be pending",
        Duration::from_secs(60),
        || state(&id) == "PENDING",
    );
    // slurmd refuses a credential issued in the same whole second as the requeue revoked the
    // job's old one, and the job then fails at launch (seen in CI: FAILED 1:0, no output from the
    // second run). The requeue happened before we saw PENDING, so once the clock has moved on to
    // the next second, a start now gets a credential the revocation does not cover. (A start
    // time in the future is not used: the scheduler only looks again after up to a minute.)
    let seen = unix_seconds();
    wait_for("the next second", Duration::from_secs(3), || {
        unix_seconds() > seen
    });
    let _ = Command::new("scontrol")
        .args(["update", &format!("JobId={id}"), "StartTime=now"])
        .status();
    let text = completes(&id, &dir.path().join("job.out"), Duration::from_secs(240));
    let sealed = text
        .lines()
        .find_map(|l| l.split("drun: preempted: checkpoint step ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("a coordinated checkpoint was sealed:\n{text}"))
        .to_string();
    assert!(
        text.contains(&format!("[rank0]:resumed at step={sealed} ")),
        "the requeued job resumes from step {sealed}:\n{text}"
    );
    assert!(text.contains("(requeued, restart 1)"), "{text}");
    let check = Command::new(&python)
        .arg(worker("check_indices.py"))
        .args(["indices"])
        .arg(&idx)
        .arg(format!("{}.r1", idx.display()))
        .args(crate::harness::EXAMPLE_DATA_ARGS)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "no sample skipped or repeated across the requeue: {summary}"
    );
    eprintln!("sealed at step {sealed}; data order: {summary}");
}

fn logs(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn scancel_lets_workers_save(proctrack: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (id, out) = submit_worker_job("slow_save.py", dir.path());
    let _c = Cancel(id.clone());
    wait_for("4 workers running", Duration::from_secs(60), || {
        logs(dir.path()).len() == 4
    });
    let t = Instant::now();
    assert!(Command::new("scancel").arg(&id).status().unwrap().success());
    wait_for("the job to end", Duration::from_secs(60), || {
        !matches!(state(&id).as_str(), "RUNNING" | "COMPLETING")
    });
    let took = t.elapsed();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    for (name, log) in logs(dir.path()) {
        assert!(
            log.contains("term 1"),
            "{proctrack}: {name} got SIGTERM:\n{log}\n{text}"
        );
        assert!(
            log.trim_end().ends_with("saved"),
            "{proctrack}: {name} finished its 3 s save before the SIGKILL:\n{log}\n{text}"
        );
    }
    // Nothing of the job is left on any virtual node.
    let left = Command::new("pgrep")
        .args(["-f", &format!("slow_save.py {}", dir.path().display())])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "{proctrack}: workers left behind"
    );
    eprintln!("{proctrack}: scancel to job end {took:?}");
}

#[test]
fn slurm_scancel_forwards_sigterm_and_waits_for_the_save() {
    if !cluster() {
        return;
    }
    let proctrack = std::fs::read_to_string(
        std::env::var("SLURM_CONF").unwrap_or_else(|_| "/etc/slurm/slurm.conf".into()),
    )
    .unwrap_or_default()
    .lines()
    .find_map(|l| {
        l.strip_prefix("ProctrackType=proctrack/")
            .map(str::to_string)
    })
    .unwrap_or_default();
    scancel_lets_workers_save(&proctrack);
}
