//! `--gpu-health` on a node whose `nvidia-smi` is a fixture: a script first on `PATH` that
//! answers the health query with a file the test writes (the rows a real `nvidia-smi` prints
//! for that query) and the fingerprint's query with one model. The agents, the rendezvous, the
//! workers and the re-checks are real.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::cluster::rendezvous_bin;
use crate::harness::cluster::RdzvServer;
use crate::harness::fake_smi::{FakeSmi, ECC, HEALTHY};
use crate::harness::scrape::{announced, scrape};
use crate::harness::{drun, node_cmd, run, wait_for, worker, Agent};

/// `drun-rendezvous status RUN --endpoint SERVER`, as text.
fn status_text(run: &str, endpoint: &str) -> String {
    let out = std::process::Command::new(rendezvous_bin())
        .args(["status", run, "--endpoint", endpoint])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes `OUT/ran_<RANK>` and exits 0.
fn ran_script(dir: &Path) -> PathBuf {
    let p = dir.join("ran.py");
    std::fs::write(
        &p,
        "import os, sys\nopen(os.path.join(sys.argv[1], 'ran_' + os.environ['RANK']), 'w').close()\n",
    )
    .unwrap();
    p
}

/// `drun --standalone --nproc-per-node NPROC --warm-workers off EXTRA...` on a node whose
/// `nvidia-smi` is `smi` (the script and its arguments follow).
fn standalone_on(smi: &FakeSmi, nproc: &str, extra: &[&str]) -> std::process::Command {
    let mut c = drun();
    c.env("PATH", smi.path())
        .env_remove("CUDA_VISIBLE_DEVICES")
        .args([
            "--standalone",
            "--nproc-per-node",
            nproc,
            "--warm-workers",
            "off",
        ])
        .args(extra);
    c
}

fn standalone(smi: &FakeSmi, out: &Path) -> (i32, String, String) {
    let mut c = standalone_on(smi, "2", &[]);
    c.arg(ran_script(out)).arg(out);
    run(c, Duration::from_secs(60))
}

/// Healthy GPUs: one line says they pass and the job runs.
#[test]
fn healthy_gpus_are_said_to_pass_and_the_job_runs() {
    let smi = FakeSmi::new(HEALTHY);
    let out = tempfile::tempdir().unwrap();
    let (code, _, err) = standalone(&smi, out.path());
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("GPU health: 2 GPU(s) pass"), "{err}");
    assert!(out.path().join("ran_0").exists() && out.path().join("ran_1").exists());
}

/// A run of a fixed size whose node has a failing GPU ends before any worker starts: exit 6,
/// one line naming the GPU, the reason and what to do.
#[test]
fn a_failing_gpu_in_a_run_of_fixed_size_ends_it_naming_the_gpu_exit_6() {
    let smi = FakeSmi::new(ECC);
    let out = tempfile::tempdir().unwrap();
    let (code, _, err) = standalone(&smi, out.path());
    assert_eq!(code, 6, "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s)"))
        .collect();
    assert_eq!(lines.len(), 1, "one line names the GPU:\n{err}");
    assert!(
        lines[0].contains("the run's size is fixed (1 node)")
            && lines[0].contains("CUDA_VISIBLE_DEVICES can leave this one out"),
        "{}",
        lines[0]
    );
    assert!(
        !out.path().join("ran_0").exists() && !out.path().join("ran_1").exists(),
        "no worker ran"
    );
}

/// A worker fails and its GPU with it (the worker writes the failing rows before it exits 1):
/// the check that starts with the failure keeps the node from restarting onto the GPU, although
/// restarts are left; the run's size is fixed, so it ends with exit 6 after one attempt.
#[test]
fn a_worker_failure_with_a_failing_gpu_is_not_restarted_onto_it() {
    let smi = FakeSmi::new(HEALTHY);
    let out = tempfile::tempdir().unwrap();
    let script = out.path().join("breaks.py");
    std::fs::write(
        &script,
        format!(
            "import os, sys\nopen(os.path.join(sys.argv[1], 'ran_' + os.environ['RANK'] + '_' + os.environ['TORCHELASTIC_RESTART_COUNT']), 'w').close()\nopen('{tmp}', 'w').write(sys.argv[2]); os.rename('{tmp}', '{csv}')\nsys.exit(1)\n",
            tmp = smi.csv().with_extension("w").display(),
            csv = smi.csv().display()
        ),
    )
    .unwrap();
    let mut c = standalone_on(&smi, "1", &["--max-restarts", "3"]);
    c.arg(&script).arg(out.path()).arg(ECC);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s)"),
        "{err}"
    );
    assert!(out.path().join("ran_0_0").exists(), "the first attempt ran");
    assert!(
        !out.path().join("ran_0_1").exists(),
        "no restart onto the failing GPU:\n{err}"
    );
}

/// The checks while the node trains see its own workers' GPU memory: that is not "another
/// process" (the fake reports 40 GB in use while the worker's marker exists).
#[test]
fn the_workers_own_gpu_memory_is_not_held_against_the_node() {
    let smi = FakeSmi::new(HEALTHY);
    let out = tempfile::tempdir().unwrap();
    let marker = out.path().join("training");
    let busy = HEALTHY.replace(", 1, 143771,", ", 40000, 143771,");
    let busy_csv = out.path().join("busy.csv");
    std::fs::write(&busy_csv, busy).unwrap();
    std::fs::write(
        smi.script(),
        format!(
            "#!/bin/sh\ncase \"$*\" in\n  *name,driver_version*) echo 'NVIDIA H200, 550.54.15' ;;\n  *) if [ -e '{}' ]; then cat '{}'; else cat '{}'; fi ;;\nesac\n",
            marker.display(),
            busy_csv.display(),
            smi.csv().display()
        ),
    )
    .unwrap();
    let script = out.path().join("trains.py");
    std::fs::write(
        &script,
        "import os, sys, time\nm = sys.argv[1]\nopen(m, 'w').close()\ntime.sleep(4)\nos.remove(m)\n",
    )
    .unwrap();
    let mut c = standalone_on(&smi, "1", &["--gpu-health", "1"]);
    c.arg(&script).arg(&marker);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("in use by another process"), "{err}");
    assert!(
        !err.contains("not checked"),
        "no check may read as failed or timed out:\n{err}"
    );
}

/// `--gpu-health off` turns the check off: the same node trains.
#[test]
fn gpu_health_off_does_not_check() {
    let smi = FakeSmi::new(ECC);
    let out = tempfile::tempdir().unwrap();
    let mut c = standalone_on(&smi, "1", &["--gpu-health", "off"]);
    c.arg(ran_script(out.path())).arg(out.path());
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("GPU health"), "{err}");
}

/// An elastic run: the node whose GPU fails stands by (one line, the metric says 1), the other
/// trains alone; once the GPU passes again the node joins at its next check and the group
/// re-forms with both.
#[test]
fn a_node_with_a_failing_gpu_stands_by_and_joins_once_it_passes() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = server.quick_rdzv();
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let good = FakeSmi::new(HEALTHY);
    let bad = FakeSmi::new(ECC);
    let start = |i: usize, smi: &FakeSmi| {
        let mut c = node_cmd(i, "gpu-standby", "1:2", &rdzv);
        c.env("PATH", smi.path())
            .env_remove("CUDA_VISIBLE_DEVICES")
            .args([
                "--gpu-health",
                "1",
                "--warm-workers",
                "off",
                "--metrics-port",
                "0",
            ])
            .arg(worker("trap.py"))
            .arg(dirs[i].path())
            .arg("0");
        Agent::start(c)
    };
    let ready = |i: usize, r: u32| dirs[i].path().join(format!("ready_{r}")).exists();
    let a = start(0, &good);
    let b = start(1, &bad);
    wait_for("node 0 to train alone", Duration::from_secs(60), || {
        ready(0, 0) && ready(0, 1)
    });
    wait_for(
        "node 1 to say it stands by",
        Duration::from_secs(30),
        || {
            b.stderr_so_far().contains(
            "GPU health: GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s) since the driver loaded: this node stands by",
        )
        },
    );
    let addr = announced(&b.stderr_so_far()).expect("node 1 announces its metrics");
    let unhealthy = || {
        scrape(&addr)
            .and_then(|s| s.into_iter().find(|s| s.name == "drun_gpu_unhealthy"))
            .map(|s| s.value)
    };
    wait_for(
        "the metric to show the failing GPU",
        Duration::from_secs(10),
        || unhealthy() == Some(1.0),
    );
    wait_for(
        "status to name the failing GPU",
        Duration::from_secs(10),
        || {
            status_text("gpu-standby", &server.endpoint).contains(
            "stands by: GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s) since the driver loaded",
        )
        },
    );
    assert!(
        std::fs::read_dir(dirs[1].path()).unwrap().next().is_none(),
        "node 1 runs no worker while it stands by"
    );
    let said = b.stderr_so_far().matches("this node stands by").count();
    assert_eq!(
        said,
        1,
        "said once, not at every check:\n{}",
        b.stderr_so_far()
    );
    bad.set(HEALTHY);
    wait_for(
        "node 1 to join once its GPU passes",
        Duration::from_secs(60),
        || (0..4).any(|r| ready(1, r)),
    );
    assert!(b
        .stderr_so_far()
        .contains("GPU health: all 2 GPU(s) pass now"));
    assert_eq!(unhealthy(), Some(0.0));
    wait_for(
        "status to drop the GPU line",
        Duration::from_secs(10),
        || !status_text("gpu-standby", &server.endpoint).contains("gpu node"),
    );
    drop((a, b));
}

/// `drun` for node `i` of a run of a fixed size (`--nnodes 2`) on rendezvous `rdzv`, whose
/// `nvidia-smi` is `smi`; the join timeout is 300 s, so a node left waiting for the other would
/// outlast the test's bounds.
fn fixed_node(i: usize, run: &str, rdzv: &[&str], smi: &FakeSmi, out: &Path) -> Agent {
    let mut c = node_cmd(i, run, "2", rdzv);
    c.env("PATH", smi.path())
        .env_remove("CUDA_VISIBLE_DEVICES")
        .args(["--rdzv-conf", "join_timeout=300", "--warm-workers", "off"])
        .arg(ran_script(out))
        .arg(out);
    Agent::start(c)
}

/// The node's exit-6 line names `node`'s failing GPU, and that the run cannot form without it.
fn names_the_unfit_node(err: &str) {
    assert!(
        err.lines().any(
            |l| l.contains("GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s)")
                && l.contains("the run's size is fixed (2 nodes), so it cannot form without node")
        ),
        "one line names the GPU and the node:\n{err}"
    );
}

/// A run of a fixed size on a rendezvous server, one node of which has a failing GPU: that node
/// ends the run for every agent, so the healthy node also ends with exit 6 and the same line
/// within seconds, instead of waiting for the join timeout (300 s here); no worker starts.
#[test]
fn a_failing_gpu_in_a_fixed_multi_node_run_ends_every_node_naming_it() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = ["--rdzv-endpoint", server.endpoint.as_str()];
    let out = tempfile::tempdir().unwrap();
    let good = FakeSmi::new(HEALTHY);
    let bad = FakeSmi::new(ECC);
    let a = fixed_node(0, "gpu-unfit", &rdzv, &good, out.path());
    let b = fixed_node(1, "gpu-unfit", &rdzv, &bad, out.path());
    let (code_b, _, err_b) = b.wait(Duration::from_secs(60));
    assert_eq!(code_b, 6, "{err_b}");
    names_the_unfit_node(&err_b);
    let (code_a, _, err_a) = a.wait(Duration::from_secs(60));
    assert_eq!(code_a, 6, "the healthy node ends too:\n{err_a}");
    names_the_unfit_node(&err_a);
    assert!(
        std::fs::read_dir(out.path())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with("ran_")),
        "no worker ran"
    );
}

/// The same with a c10d-style rendezvous hosted by the node whose GPU fails, and the healthy
/// node started only once that node has said it cannot join: the host keeps serving the ended
/// run until the other node has connected and learned it, then both end with exit 6.
#[test]
fn a_c10d_host_with_a_failing_gpu_ends_the_run_for_a_node_that_comes_later() {
    let endpoint = format!("127.0.0.1:{}", crate::harness::etcd::free_port());
    let rdzv = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint.as_str(),
    ];
    let out = tempfile::tempdir().unwrap();
    let good = FakeSmi::new(HEALTHY);
    let bad = FakeSmi::new(ECC);
    let host = fixed_node(0, "gpu-unfit-c10d", &rdzv, &bad, out.path());
    wait_for(
        "the host to say it serves the ended run for the nodes to come",
        Duration::from_secs(30),
        || {
            host.stderr_so_far()
                .contains("so that the nodes not connected yet learn it")
        },
    );
    let late = fixed_node(1, "gpu-unfit-c10d", &rdzv, &good, out.path());
    let (code, _, err) = late.wait(Duration::from_secs(60));
    assert_eq!(code, 6, "the late node learns the end:\n{err}");
    names_the_unfit_node(&err);
    let (code, _, err) = host.wait(Duration::from_secs(30));
    assert_eq!(code, 6, "{err}");
    names_the_unfit_node(&err);
}
