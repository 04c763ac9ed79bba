//! drun inside real Slurm jobs: the cluster of `slurm-up.sh` (slurmctld, munge, slurmd "nodes"
//! n1, n2, n3 on 127.0.2.x; most jobs use 2 nodes, the loss of node rank 0 needs 3). Skipped
//! when no cluster answers, unless `DRUN_REQUIRE_SLURM=1` (CI brings up 3 nodes in `.ci/test`
//! and sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{drun_bin, read_json, root, torch_python, wait_for, worker};

mod jobs;
mod node_loss;
mod preemption;

/// Whether a Slurm cluster with 2 idle nodes answers.
fn cluster() -> bool {
    cluster_of(2)
}

/// Whether a Slurm cluster with `n` idle nodes answers.
fn cluster_of(n: usize) -> bool {
    let idle = Command::new("sinfo")
        .args(["-h", "-N", "-o", "%T"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| matches!(l.trim(), "idle" | "mixed" | "allocated"))
                .count()
        })
        .unwrap_or(0);
    if idle < n {
        assert_ne!(
            std::env::var("DRUN_REQUIRE_SLURM").as_deref(),
            Ok("1"),
            "DRUN_REQUIRE_SLURM=1 but no {n}-node Slurm cluster answers (run slurm-up.sh up 3)"
        );
        eprintln!("skipping: no {n}-node Slurm cluster (slurm-up.sh up 3)");
    }
    idle >= n
}

fn sbatch(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut c = Command::new("sbatch");
    c.arg("--parsable").args(args).current_dir(root());
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("sbatch");
    assert!(
        o.status.success(),
        "sbatch: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

/// `scontrol show job` as key → value (empty once the job is forgotten).
fn job(id: &str) -> std::collections::BTreeMap<String, String> {
    let o = Command::new("scontrol")
        .args(["show", "job", "-o", id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn state(id: &str) -> String {
    job(id).get("JobState").cloned().unwrap_or_default()
}

/// What Slurm knows about job `id`, for a failure message: `scontrol show job` and the lines of
/// slurmctld's and the slurmds' log files that name it.
fn slurm_trace(id: &str) -> String {
    let show = Command::new("scontrol")
        .args(["show", "job", "-o", id])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let config = Command::new("scontrol")
        .args(["show", "config"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let setting = |key: &str| {
        config
            .lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_string())
    };
    let mut logs: Vec<String> = setting("SlurmctldLogFile").into_iter().collect();
    if let Some(slurmd) = setting("SlurmdLogFile") {
        logs.extend(["n1", "n2", "n3"].map(|n| slurmd.replace("%n", n)));
    }
    let needles = [
        format!("JobId={id} "),
        format!("job {id} "),
        format!("job {id}\n"),
        format!("[{id}."),
        format!("StepId={id}."),
    ];
    let mut out = format!("scontrol show job: {show}");
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        out.push_str(&format!("--- {log}\n"));
        for line in text.lines() {
            let l = format!("{line}\n");
            if needles.iter().any(|n| l.contains(n.as_str())) {
                out.push_str(&l);
            }
        }
    }
    out
}

/// Whole seconds since the Unix epoch (the resolution of Slurm's credential revocation).
fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Waits for a terminal state; returns (state, ExitCode).
fn wait_done(id: &str, timeout: Duration) -> (String, String) {
    let deadline = Instant::now() + timeout;
    loop {
        let j = job(id);
        let st = j.get("JobState").cloned().unwrap_or_default();
        if matches!(
            st.as_str(),
            "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY"
        ) {
            return (st, j.get("ExitCode").cloned().unwrap_or_default());
        }
        if Instant::now() > deadline {
            let _ = Command::new("scancel").arg(id).status();
            panic!("job {id} still {st} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits up to `timeout` for job `id` to end and asserts it COMPLETED with exit 0 (else panics
/// with its output file `out` and Slurm's trace); returns the output.
fn completes(id: &str, out: &Path, timeout: Duration) -> String {
    let (st, code) = wait_done(id, timeout);
    let text = std::fs::read_to_string(out).unwrap_or_default();
    assert_eq!(
        (st.as_str(), code.as_str()),
        ("COMPLETED", "0:0"),
        "{text}\n{}",
        slurm_trace(id)
    );
    text
}

/// Cancels the job if the test fails half-way.
struct Cancel(String);

impl Drop for Cancel {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = Command::new("scancel").arg(&self.0).status();
        }
    }
}

fn out_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("job.out")).unwrap_or_default()
}

fn example_env<'a>(python: &'a Path, dir: &'a Path, train_args: &'a str) -> Vec<(&'a str, String)> {
    vec![
        ("DRUN", drun_bin().display().to_string()),
        ("DRUN_PYTHON", python.display().to_string()),
        ("CKPT_DIR", dir.join("ckpt").display().to_string()),
        ("TRAIN_ARGS", train_args.to_string()),
    ]
}

/// Submits the example batch script with `train_args`: (python, job dir, job id, cancel guard);
/// `None` when the test is skipped (no cluster or no torch).
fn start_example(train_args: &str) -> Option<(PathBuf, tempfile::TempDir, String, Cancel)> {
    if !cluster() {
        return None;
    }
    let python = torch_python()?;
    let dir = tempfile::tempdir().unwrap();
    let env = example_env(&python, dir.path(), train_args);
    let id = submit_example(dir.path(), &env);
    let cancel = Cancel(id.clone());
    Some((python, dir, id, cancel))
}

fn submit_example(dir: &Path, env: &[(&str, String)]) -> String {
    let out = dir.join("job.out");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    sbatch(
        &[
            "-N",
            "2",
            "-o",
            out.to_str().unwrap(),
            "examples/slurm/train.sbatch",
        ],
        &env,
    )
}

/// Submits a 2-node job whose step is `srun drun --nproc-per-node 2 <worker> <dir>`; returns the
/// job id and its output file.
fn submit_worker_job(worker_name: &str, dir: &Path) -> (String, PathBuf) {
    let body = format!(
        "srun {} --nproc-per-node 2 {} {}",
        drun_bin().display(),
        worker(worker_name),
        dir.display()
    );
    submit_script(dir, &body, 2)
}

/// Writes `body` as `dir/job.sbatch` and submits it on `nodes` nodes, one task each: the job id
/// and its output file.
fn submit_script(dir: &Path, body: &str, nodes: u32) -> (String, PathBuf) {
    let script = dir.join("job.sbatch");
    std::fs::write(&script, format!("#!/bin/bash\n{body}\n")).unwrap();
    let out = dir.join("job.out");
    let id = sbatch(
        &[
            "-N",
            &nodes.to_string(),
            "--ntasks-per-node",
            "1",
            "-o",
            out.to_str().unwrap(),
            script.to_str().unwrap(),
        ],
        &[],
    );
    (id, out)
}
