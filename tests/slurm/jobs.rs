//! Jobs that train: ranks from SLURM_NODEID, a worker failure recovered, a new job resuming.

use super::*;

#[test]
fn slurm_ranks_follow_the_node_id() {
    if !cluster() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (id, out) = submit_worker_job("envdump.py", dir.path());
    let _c = Cancel(id.clone());
    let text = completes(&id, &out, Duration::from_secs(60));
    for (rank, node, group) in [
        (0, "n1", "0"),
        (1, "n1", "0"),
        (2, "n2", "1"),
        (3, "n2", "1"),
    ] {
        let env = &read_json(&dir.path().join(format!("env_{rank}.json")))["env"];
        assert_eq!(env["SLURMD_NODENAME"], node, "rank {rank}");
        assert_eq!(env["GROUP_RANK"], group, "rank {rank}");
        assert_eq!(env["WORLD_SIZE"], "4");
        assert_eq!(env["TORCHELASTIC_RUN_ID"], id.as_str(), "run id = job id");
        assert_eq!(env["MASTER_ADDR"], "n1");
        for secret in ["DRUN_RDZV_TOKEN", "DRUN_SLURM_SECRET"] {
            assert!(env.get(secret).is_none(), "rank {rank} sees {secret}");
        }
    }
    assert!(
        text.contains(&format!("slurm job {id}: run id {id}, --nnodes 1:2, node rank 1, address n2, rendezvous embedded (c10d) on n1:")),
        "what was taken from Slurm is printed:\n{text}"
    );
    // The rendezvous n1 hosts took the token both nodes derived from the job id (the job trained,
    // so n2's agent was let in with it).
    assert!(
        text.contains("rendezvous token derived from the job id"),
        "{text}"
    );
}

#[test]
fn slurm_example_trains_and_recovers_a_worker_failure() {
    let Some((_python, dir, id, _c)) =
        start_example("--epochs 2 --global-batch 64 --ckpt-every 10 --fail-at-step 25")
    else {
        return;
    };
    let text = completes(&id, &dir.path().join("job.out"), Duration::from_secs(240));
    assert!(
        text.contains("rank 3: simulated failure at step 25"),
        "{text}"
    );
    assert!(
        text.contains("restarting the worker group (1/3 restarts used)"),
        "{text}"
    );
    assert!(
        text.contains("resuming from checkpoint step 20"),
        "recovered from the last sealed checkpoint:\n{text}"
    );
    assert!(text.contains("[rank0]:done steps=128"), "{text}");
    assert!(text.contains("world_size=4"), "{text}");
}

#[test]
fn slurm_a_new_job_starts_from_an_earlier_jobs_checkpoint() {
    // A new job id is a new run: without --ckpt-resume-from it would start fresh.
    let Some((python, first, id1, _c1)) =
        start_example("--epochs 1 --global-batch 64 --ckpt-every 10")
    else {
        return;
    };
    completes(
        &id1,
        &first.path().join("job.out"),
        Duration::from_secs(240),
    );
    let old_ckpt = first.path().join("ckpt");
    let pointer = std::fs::read_to_string(old_ckpt.join("latest")).unwrap();
    let step = read_json(&old_ckpt.join(pointer.trim()))["step"]
        .as_u64()
        .unwrap();
    let second = tempfile::tempdir().unwrap();
    let mut env = example_env(
        &python,
        second.path(),
        "--epochs 2 --global-batch 64 --ckpt-every 10",
    );
    env.push(("RESUME_FROM", old_ckpt.display().to_string()));
    let id2 = submit_example(second.path(), &env);
    let _c2 = Cancel(id2.clone());
    let text = completes(
        &id2,
        &second.path().join("job.out"),
        Duration::from_secs(240),
    );
    assert!(
        text.contains(&format!(
            "resuming from checkpoint step {step} of run {id1} (--ckpt-resume-from)"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("[rank0]:resumed at step={step} ")),
        "{text}"
    );
    assert!(text.contains("[rank0]:done steps=128"), "{text}");
}
