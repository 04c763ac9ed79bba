//! Pods start at different times: a rendezvous name that resolves only later is waited for.

use std::time::Duration;

use crate::harness::cluster::free_port;
use crate::harness::{node_cmd, read_json, wait_for, worker, Agent};

/// Two agents are given `rdzv-late.test:PORT` while no resolver knows that name (the
/// `DRUN_HOSTS_FILE` override is empty, as DNS is before the index-0 pod runs); both say what
/// they wait for. Once the name appears they form the group of 2 nodes and finish.
#[test]
fn agents_wait_for_a_rendezvous_name_and_form_once_it_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "# the headless Service has no record yet\n").unwrap();
    let out = dir.path().join("out");
    let endpoint = format!("rdzv-late.test:{}", free_port());
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = node_cmd(
                i,
                "late-dns",
                "2",
                &["--rdzv-backend", "c10d", "--rdzv-endpoint", &endpoint],
            );
            c.env("DRUN_HOSTS_FILE", &hosts)
                .arg(worker("envdump.py"))
                .arg(&out);
            Agent::start(c)
        })
        .collect();
    wait_for(
        "both agents to wait for the name",
        Duration::from_secs(30),
        || {
            agents.iter().all(|a| {
            a.stderr_so_far()
                .contains("waiting for the rendezvous name to resolve: rdzv-late.test does not resolve yet")
        })
        },
    );
    assert!(
        !out.exists(),
        "no worker may start before the rendezvous name resolves"
    );
    std::fs::write(&hosts, "127.0.0.1\trdzv-late.test\n").unwrap();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "agent {i}: {err}");
    }
    let mut ranks: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| {
            read_json(&e.path())["env"]["WORLD_SIZE"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    ranks.sort();
    assert_eq!(
        ranks,
        ["4", "4", "4", "4"],
        "one group of 2 nodes × 2 workers"
    );
}

/// Two pods of a Kubeflow TrainJob (the `PET_*` of kubeflow/trainer torch.go): each waits for
/// the master name `llm-node-0-0.llm`, then starts its workers at its node rank once it resolves.
#[test]
fn trainjob_pods_wait_for_the_master_name() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "").unwrap();
    let out = dir.path().join("out");
    let port = free_port().to_string();
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = crate::harness::drun();
            c.env("DRUN_HOSTS_FILE", &hosts)
                .env("PET_NNODES", "2")
                .env("PET_NPROC_PER_NODE", "1")
                .env("PET_NODE_RANK", i.to_string())
                .env("PET_MASTER_ADDR", "llm-node-0-0.llm")
                .env("PET_MASTER_PORT", &port)
                .env("JOB_COMPLETION_INDEX", i.to_string())
                .arg(worker("envdump.py"))
                .arg(&out);
            Agent::start(c)
        })
        .collect();
    wait_for(
        "both pods to wait for the master",
        Duration::from_secs(30),
        || {
            agents.iter().all(|a| {
            let err = a.stderr_so_far();
            err.contains("kubernetes: Kubeflow TrainJob: run id llm")
                && err.contains("waiting for the master name to resolve: llm-node-0-0.llm does not resolve yet")
        })
        },
    );
    assert!(
        !out.exists(),
        "no worker may start before the master name resolves"
    );
    std::fs::write(&hosts, "127.0.0.1 llm-node-0-0.llm\n").unwrap();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 0, "pod {i}: {err}");
    }
    for rank in 0..2 {
        let env = &read_json(&out.join(format!("env_{rank}.json")))["env"];
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["MASTER_ADDR"], "llm-node-0-0.llm");
        assert_eq!(env["TORCHELASTIC_RUN_ID"], "llm");
    }
}
