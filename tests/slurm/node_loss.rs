//! The loss of a node inside a Slurm job, on the in-memory store and on etcd.

use super::*;

/// The drun agent of `job` running on virtual node `node` (all nodes share one PID space).
fn agent_on(job: &str, node: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "drun" {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let vars: Vec<String> = env
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        let has = |kv: &str| vars.iter().any(|v| v == kv);
        // The agent itself, not its guard (same binary): the guard has no DRUN_AGENT_ID child env
        // of its own but the same environment; tell them apart by argv.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if has(&format!("SLURM_JOB_ID={job}"))
            && has(&format!("SLURMD_NODENAME={node}"))
            && !String::from_utf8_lossy(&cmdline).contains("__drun_guard")
        {
            return Some(pid);
        }
    }
    None
}

#[test]
fn slurm_job_survives_the_loss_of_a_node() {
    let Some((_python, dir, id, _c)) =
        start_example("--epochs 2 --global-batch 64 --ckpt-every 8 --step-sleep 0.05")
    else {
        return;
    };
    wait_for(
        "a checkpoint at world size 4",
        Duration::from_secs(120),
        || out_of(dir.path()).contains("checkpoint step 16 (generation 1) sealed"),
    );
    let victim = agent_on(&id, "n2").expect("the agent on n2");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (_, _) = wait_done(&id, Duration::from_secs(240));
    let text = out_of(dir.path());
    // The task killed on n2 makes srun (and so the job) report a failure; the training itself
    // went on at world size 2 from the last checkpoint and finished.
    assert!(
        text.contains("world formed: 1 node(s)") && text.contains("world size 2"),
        "the survivor re-formed alone:\n{text}"
    );
    assert!(text.contains("resuming from checkpoint step 16"), "{text}");
    assert!(
        text.contains("[rank0]:done steps=128") && text.contains("world_size=2"),
        "{text}"
    );
}

/// Records `gen<g>_rank<r>.json` of `tests/workers/elastic.py` for generation `g`.
fn elastic_records(dir: &Path, g: u64) -> Vec<serde_json::Value> {
    let mut v = crate::harness::gen_records(dir, g);
    v.sort_by_key(|r| r["rank"].as_str().unwrap().parse::<u32>().unwrap());
    v
}

/// The newest generation after `after` whose records show `world` ranks of that world size.
fn newest_world(dir: &Path, after: u64, world: usize) -> Option<(u64, Vec<serde_json::Value>)> {
    (after + 1..after + 50).rev().find_map(|g| {
        let r = elastic_records(dir, g);
        (r.len() == world
            && r.iter()
                .all(|x| x["world_size"].as_str() == Some(world.to_string().as_str())))
        .then_some((g, r))
    })
}

/// Node name → node rank in `records` (one worker per node).
fn node_ranks(records: &[serde_json::Value]) -> Vec<(String, String)> {
    records
        .iter()
        .map(|r| {
            (
                r["label"].as_str().unwrap().to_string(),
                r["group_rank"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn slurm_etcd_job_survives_the_loss_of_node_rank_0() {
    // The documented HA setup: node ranks pinned from SLURM_NODEID, the rendezvous in an external
    // etcd. Losing the node with SLURM_NODEID 0 must re-form the other two (pins are an order).
    if !cluster_of(3) {
        return;
    }
    let etcd = crate::harness::cluster::Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    // One worker per node, labelled with its node's name.
    let body = format!(
        "srun --kill-on-bad-exit=0 bash -c 'exec {} --nnodes 2:3 --nproc-per-node 1 --rdzv-backend etcd --rdzv-endpoint {} --rdzv-conf lease_ttl=3,last_call_timeout=2 --shutdown-timeout 3 {} {} \"$SLURMD_NODENAME\"'",
        drun_bin().display(),
        etcd.endpoint,
        worker("elastic.py"),
        dir.path().display()
    );
    let (id, out) = submit_script(dir.path(), &body, 3);
    let _c = Cancel(id.clone());
    let text = || std::fs::read_to_string(&out).unwrap_or_default();
    wait_for("3 nodes formed", Duration::from_secs(90), || {
        newest_world(dir.path(), 0, 3).is_some()
    });
    let (g1, first) = newest_world(dir.path(), 0, 3).unwrap();
    assert_eq!(
        node_ranks(&first),
        [("n1", "0"), ("n2", "1"), ("n3", "2")].map(|(n, r)| (n.to_string(), r.to_string())),
        "node ranks from SLURM_NODEID:\n{}",
        text()
    );
    let victim = agent_on(&id, "n1").expect("the agent on n1");
    let victim_worker = first[0]["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for(
        "the survivors to re-form at world 2",
        Duration::from_secs(60),
        || newest_world(dir.path(), g1, 2).is_some(),
    );
    let (_, second) = newest_world(dir.path(), g1, 2).unwrap();
    assert_eq!(
        node_ranks(&second),
        [("n2", "0"), ("n3", "1")].map(|(n, r)| (n.to_string(), r.to_string())),
        "the gap left by node rank 0 closed up:\n{}",
        text()
    );
    assert!(
        !crate::harness::alive(victim_worker),
        "the killed agent's worker is gone"
    );
    assert!(!text().contains("cannot assign node ranks"), "{}", text());
    // End the job: the survivors stop their workers on Slurm's SIGTERM.
    assert!(Command::new("scancel").arg(&id).status().unwrap().success());
    wait_done(&id, Duration::from_secs(60));
}
