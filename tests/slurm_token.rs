//! The Slurm-derived rendezvous token (issue 15), with a Slurm job simulated by its SLURM_*
//! variables: the agents of one job, given no token, authenticate to the rendezvous their first
//! node hosts; an agent of another job of the same user, aiming at that rendezvous and run id,
//! is refused (exit 3) and never joins; `drun --status` inside the job is let in.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::cluster::free_port;
use crate::harness::{drun, run, wait_for, worker, Agent};

/// `drun` as node `i` (127.0.0.(i+1)) of simulated 2-node Slurm job `job`, its rendezvous at
/// `endpoint` (hosted by node 0), secret file `secret`; no script yet.
fn slurm_drun(job: &str, i: usize, endpoint: &str, secret: &Path) -> Command {
    let mut c = drun();
    for k in ["DRUN_RDZV_TOKEN", "DRUN_RDZV_TOKEN_FILE"] {
        c.env_remove(k);
    }
    c.env("SLURM_JOB_ID", job)
        .env("SLURM_JOB_NUM_NODES", "2")
        .env("SLURM_JOB_NODELIST", "127.0.0.1,127.0.0.2")
        .env("SLURM_NODEID", i.to_string())
        .env("SLURMD_NODENAME", format!("127.0.0.{}", i + 1))
        .env("DRUN_SLURM_SECRET", secret)
        .args(["--rdzv-backend", "embedded", "--rdzv-endpoint", endpoint]);
    c
}

/// [`slurm_drun`] running one `envdump.py out` worker.
fn slurm_node(job: &str, i: usize, endpoint: &str, secret: &Path, out: &Path) -> Command {
    let mut c = slurm_drun(job, i, endpoint, secret);
    c.args(["--rdzv-conf", "join_timeout=30", "--nproc-per-node", "1"])
        .args(["--max-restarts", "0", "--shutdown-timeout", "3"])
        .arg(worker("envdump.py"))
        .arg(out);
    c
}

#[test]
fn agents_of_one_slurm_job_share_a_derived_token_and_another_job_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let secret = d.join("home/.drun/slurm-secret");
    let job = format!("{}", 600_000 + std::process::id() % 100_000);
    let other_job = format!("{}", 700_000 + std::process::id() % 100_000);
    let endpoint = format!("127.0.0.1:{}", free_port());
    let out = d.join("out");

    let host = Agent::start(slurm_node(&job, 0, &endpoint, &secret, &out));
    wait_for(
        "the first node to host the rendezvous",
        Duration::from_secs(30),
        || std::net::TcpStream::connect(&endpoint).is_ok(),
    );
    assert!(secret.exists(), "{}", host.stderr_so_far());

    // Another job of the same user aims at this job's rendezvous and run id: its token is
    // derived from its own job id, so the host refuses it.
    let mut intruder = slurm_node(&other_job, 1, &endpoint, &secret, &d.join("intruder"));
    intruder.args(["--rdzv-id", &job]);
    let (code, _, err) = run(intruder, Duration::from_secs(60));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not accepted"), "{err}");
    assert!(!d.join("intruder").exists());

    // `drun --status` inside the job derives the same token. The run is listed once the host
    // joined (after its warm interpreters tried to import torch).
    let mut listed = None;
    wait_for(
        "the job's run listed by --status",
        Duration::from_secs(60),
        || {
            let mut status = slurm_drun(&job, 1, &endpoint, &secret);
            status.arg("--status");
            let (code, so, err) = run(status, Duration::from_secs(30));
            assert!(!err.contains("not accepted"), "{err}");
            listed = Some(so);
            code == 0
        },
    );
    let so = listed.unwrap();
    assert!(so.contains(&job), "{so}");
    let mut status = slurm_drun(&other_job, 1, &endpoint, &secret);
    status.args(["--status", "--rdzv-id", &job]);
    let (code, so, err) = run(status, Duration::from_secs(30));
    assert_ne!(code, 0, "{so}{err}");
    assert!(err.contains("not accepted"), "{err}");

    let node1 = Agent::start(slurm_node(&job, 1, &endpoint, &secret, &out));
    for (name, a) in [("node 0", host), ("node 1", node1)] {
        let (code, so, se) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 0, "{name}: stdout {so}\nstderr {se}");
        if name == "node 0" {
            assert!(
                se.contains("rendezvous token derived from the job id"),
                "{se}"
            );
        }
    }
    let secret_text = std::fs::read_to_string(&secret).unwrap();
    for rank in 0..2 {
        let env = std::fs::read_to_string(out.join(format!("env_{rank}.json"))).unwrap();
        assert!(!env.contains("DRUN_SLURM_SECRET"), "rank {rank}: {env}");
        assert!(!env.contains(secret_text.trim()), "rank {rank}");
    }
}
