//! `drun doctor` in a simulated TrainJob pod: settings with their sources, and the traps.

use std::time::Duration;

use crate::harness::{drun, run};

#[test]
fn doctor_prints_each_setting_with_its_source_and_the_traps() {
    // The port node rank 0 would serve the workers' store on is taken.
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut c = drun();
    c.args(["doctor", "--max-restarts", "2"])
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        // kubeflow/trainer torch.go, node 0 of TrainJob "llm".
        .env("PET_NNODES", "2")
        .env("PET_NPROC_PER_NODE", "3")
        .env("PET_NODE_RANK", "0")
        .env("PET_MASTER_ADDR", "llm-node-0-0.llm.invalid")
        .env("PET_MASTER_PORT", &port)
        .env("JOB_COMPLETION_INDEX", "0")
        .env("WORLD_SIZE", "6")
        .env("PET_STANDALONE", "")
        .env("PET_SHUTDOWN_TIMEOUT", "40");
    let (code, out, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let row = |name: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} row in:\n{out}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        out.starts_with("drun doctor: kubernetes: Kubeflow TrainJob"),
        "{out}"
    );
    assert_eq!(row("nnodes"), "2:2 env PET_NNODES (Kubeflow TrainJob)");
    assert_eq!(
        row("nproc-per-node"),
        "3 env PET_NPROC_PER_NODE (Kubeflow TrainJob)"
    );
    assert_eq!(row("node-rank"), "0 env PET_NODE_RANK (Kubeflow TrainJob)");
    assert_eq!(row("max-restarts"), "2 flag");
    assert_eq!(row("run-id"), "llm Kubeflow TrainJob");
    assert_eq!(
        row("shutdown-timeout"),
        "40 s env PET_SHUTDOWN_TIMEOUT (Kubeflow TrainJob)"
    );
    for trap in [
        "PET_STANDALONE is set but empty",
        "WORLD_SIZE=6 in the environment",
        "the master name llm-node-0-0.llm.invalid:",
        &format!("port {port} (the master port (node rank 0 serves the workers' store)) is already taken"),
        "--shutdown-timeout 40 s leaves drun less than 5 s",
    ] {
        assert!(out.contains(&format!("warning: {trap}")), "{trap} in:\n{out}");
    }
    // Said once, in the table (a trial saw it twice: stderr had it too).
    assert!(!err.contains("PET_STANDALONE is set but empty"), "{err}");
    drop(taken);
}

#[test]
fn doctor_refuses_what_the_agent_would_refuse() {
    let mut c = drun();
    c.args(["doctor", "--nnodes", "3:2"]);
    let (code, out, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{out}");
    assert!(err.contains("--nnodes"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
