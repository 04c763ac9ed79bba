//! Replicas on peers (`--ckpt-replicas 1`): three agents, each node's staged step reaches its
//! ring neighbour's agent with identical bytes, `status` says so, and the flag without
//! `--ckpt-memory` is a usage error.

use super::*;

/// Every file under `dir` whose path contains `part`.
fn files_with(dir: &Path, part: &str) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(part))
        .collect()
}

/// The rank of a `rank<R>.pt` file.
fn rank_of(p: &Path) -> u32 {
    let name = p.file_name().unwrap().to_string_lossy();
    name.trim_start_matches("rank")
        .trim_end_matches(".pt")
        .parse()
        .unwrap()
}

#[test]
fn each_staged_step_reaches_the_ring_neighbour_with_identical_bytes() {
    let d = dirs();
    let run = "ckpt-replicas";
    let r = rdzv(Store::Memory, run, "3");
    let shm: Vec<PathBuf> = (0..3)
        .map(|i| {
            let p = d.out.parent().unwrap().join(format!("shm{i}"));
            std::fs::create_dir_all(&p).unwrap();
            p
        })
        .collect();
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let mut c: Command = drun();
            c.args(&r.args)
                .nproc(1)
                .node(i)
                .args(["--shutdown-timeout", "5"])
                .args(["--ckpt-memory", "64M", "--ckpt-replicas", "1", "--ckpt-dir"])
                .arg(&d.ckpt)
                .arg(worker("ckpt_worker.py"))
                .env("CKPT_OUT", &d.out)
                .env("CKPT_HOLD_AT", "6")
                .env("DRUN_CKPT_STAGE_PARENT", &shm[i])
                // About 2.8 KB a step at 2000 B/s: the disk stays behind the training.
                .env("DRUN_CKPT_PERSIST_RATE", "2000");
            Agent::start(c)
        })
        .collect();
    wait_for(
        "the three ranks hold after step 6",
        Duration::from_secs(90),
        || count(&events(&d), "holding", |e| e["step"] == 6) == 3,
    );
    // Each node holds its own rank's file of step 6 and, as a replica, its ring
    // predecessor's: three different ranks, byte for byte what the rank wrote.
    let mut held = Vec::new();
    wait_for(
        "each node holds a replica of step 6",
        Duration::from_secs(30),
        || {
            held = shm
                .iter()
                .map(|s| files_with(s, ".replicas"))
                .filter(|f| {
                    f.iter()
                        .any(|p| p.to_string_lossy().contains("step-00000006-"))
                })
                .collect();
            held.len() == 3
        },
    );
    let mut replica_ranks = Vec::new();
    for (i, s) in shm.iter().enumerate() {
        let own: Vec<u32> = files_with(s, "step-00000006-")
            .iter()
            .filter(|p| !p.to_string_lossy().contains(".replicas"))
            .map(|p| rank_of(p))
            .collect();
        let replica: Vec<PathBuf> = files_with(s, "step-00000006-")
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(".replicas"))
            .collect();
        assert_eq!(
            own.len(),
            1,
            "node {i}: its own rank's staged file: {own:?}"
        );
        assert_eq!(replica.len(), 1, "node {i}: one replica: {replica:?}");
        let q = rank_of(&replica[0]);
        assert_ne!(q, own[0], "node {i} holds another node's rank");
        let want = format!("rank {q} step 6 ").repeat(200);
        assert_eq!(
            std::fs::read(&replica[0]).unwrap(),
            want.as_bytes(),
            "node {i}: the replica of rank {q} is the bytes the rank wrote"
        );
        replica_ranks.push(q);
    }
    replica_ranks.sort();
    assert_eq!(replica_ranks, [0, 1, 2], "every rank has one replica");
    // `status` says so per step and per holder.
    let status = |json: bool| {
        let mut c = Command::new(crate::harness::cluster::rendezvous_bin());
        c.args(["status", run]).args(&r.status);
        if json {
            c.arg("--json");
        }
        String::from_utf8(c.output().unwrap().stdout).unwrap()
    };
    let mut json = Value::Null;
    wait_for("status shows the replicas", Duration::from_secs(30), || {
        json = serde_json::from_str(&status(true)).unwrap_or(Value::Null);
        let Some(nodes) = json["reports"]["staging"].as_object() else {
            return false;
        };
        nodes.len() == 3
            && nodes.values().all(|n| {
                let sent = n["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["step"] == 6 && s["replica"] == "replicated");
                let holds = n["replicas"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|h| h["step"] == 6);
                sent && holds
            })
    });
    let text = status(false);
    assert!(
        text.contains("(replicated)") && text.contains("holds replicas of step"),
        "{text}"
    );
    drop(agents);
}

#[test]
fn replicas_without_memory_are_a_usage_error() {
    super::memory::refused(
        // Checkpoints in memory are on by default: off on purpose, replicas have nothing to copy.
        &["--ckpt-memory", "off", "--ckpt-replicas", "1"],
        "--ckpt-replicas",
        "give --ckpt-memory SIZE|auto",
    );
}
