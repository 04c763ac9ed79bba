//! A world cut off from the server commits nothing, and the host resumes from what the survivors
//! sealed.

use super::*;

/// No split brain, at the defaults: three hosts checkpoint through drun's ledger (a stdlib
/// worker that keeps stepping without collectives, so the cut-off host's world goes on too)
/// and the cable of the host of node rank 2 is pulled. The survivors re-form and seal new
/// checkpoints; the cut-off world's commits are never accepted and never sealed (its agent
/// cannot reach the server, then fences at the lease TTL and stops its worker); no manifest of
/// its generation covers a step after the cut, and none lists its files. When the cable is back
/// the host rejoins by itself and every rank resumes from a checkpoint the survivors sealed.
#[test]
fn a_cut_off_world_commits_nothing_and_the_host_resumes_from_what_the_survivors_sealed() {
    let Some(Stage {
        python,
        bed,
        server,
        out,
        dir,
    }) = stage()
    else {
        return;
    };
    let ckpt = dir.path().join("ckpt");
    let agents = trainers(
        &bed,
        &["n0", "n1", "n2"],
        &server,
        &python,
        ("split", "2:3"),
        |c| {
            c.arg("--ckpt-dir")
                .arg(&ckpt)
                .arg(worker("ckpt_worker.py"))
                .env("CKPT_OUT", &out)
                .env("CKPT_STEPS", "1000000")
                .env("CKPT_SLEEP", "0.05");
        },
    );
    wait_for(
        "generation 1 seals a checkpoint",
        Duration::from_secs(120),
        || !sealed_steps(&out, &ckpt, 1).is_empty(),
    );
    // The victim: the rank of generation 1 whose worker runs on the host of node rank 2.
    let evs = ckpt_events(&out);
    let (victim_host, victim_rank) = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"] == 1)
        .find_map(|e| {
            let pid = e["pid"].as_i64()? as i32;
            let host = ["n0", "n1", "n2"]
                .into_iter()
                .find(|h| bed.pids_on(h).contains(&pid))?;
            (e["rank"] == 2).then_some((host, 2u64))
        })
        .expect("rank 2 runs on one of the hosts");
    // The cut counts from when the port is down: a commit the worker began while `ip` was
    // still taking it down may reach the ledger, and is not one sent after the cut.
    bed.pull_cable(victim_host);
    let cut_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    wait_for(
        "the survivors seal a checkpoint of their own",
        Duration::from_secs(60),
        || manifests(&ckpt).iter().any(|m| m.1 >= 2),
    );
    // Cut off, the victim's agent fences at the lease TTL and stops its worker.
    wait_for(
        "the cut-off worker is stopped",
        Duration::from_secs(TTL + 3 + 5),
        || {
            ckpt_events(&out)
                .iter()
                .filter(|e| e["event"] == "start" && e["gen"] == 1 && e["rank"] == victim_rank)
                .all(|e| !alive(e["pid"].as_i64().unwrap() as i32))
        },
    );
    bed.plug_cable(victim_host);
    wait_for(
        "the victim back in a world of 3",
        Duration::from_secs(90),
        || {
            ckpt_events(&out)
                .iter()
                .any(|e| e["event"] == "start" && e["gen"].as_u64() > Some(2) && e["world"] == 3)
        },
    );
    let evs = ckpt_events(&out);
    let victims = |e: &&serde_json::Value| e["gen"] == 1 && e["rank"] == victim_rank;
    // Commits the cut-off world sent after the cut (one in flight at the cut may land).
    let sent_after: Vec<u64> = evs
        .iter()
        .filter(victims)
        .filter(|e| e["event"] == "committing" && e["t"].as_f64() > Some(cut_at))
        .filter_map(|e| e["step"].as_u64())
        .collect();
    let last_sent_before = evs
        .iter()
        .filter(victims)
        .filter(|e| e["event"] == "committing" && e["t"].as_f64() <= Some(cut_at))
        .filter_map(|e| e["step"].as_u64())
        .max()
        .unwrap_or(0);
    // Accepted by the ledger: a commit answered by it. A staged answer is the cut-off agent's
    // own (checkpoints in memory, the default), given before the ledger sees the step; whether
    // the ledger took such a step shows as its manifest, checked below.
    let accepted: Vec<&serde_json::Value> = evs
        .iter()
        .filter(victims)
        .filter(|e| e["event"] == "committed" && e["staged"] != true)
        .filter(|e| e["step"].as_u64().is_some_and(|s| sent_after.contains(&s)))
        .collect();
    assert!(
        accepted.is_empty(),
        "a commit the cut-off world sent after the cut was accepted: {accepted:?}"
    );
    for (step, g, ranks) in manifests(&ckpt) {
        assert!(
            g != 1 || step <= last_sent_before,
            "generation 1 sealed step {step}, which its cut-off node committed after the cut"
        );
        assert!(
            g > 2 || step <= last_sent_before || !ranks.contains(&victim_rank),
            "the manifest of step {step} (generation {g}) lists the cut-off rank's files"
        );
    }
    // What was sealed: the manifests on disk, and the seals the workers heard of (retention may
    // have removed older manifests; a worker stopped right after a seal may not have said so).
    let sealed: Vec<(u64, u64)> = evs
        .iter()
        .filter(|e| e["event"] == "committed" && e["sealed"] == true)
        .filter_map(|e| Some((e["step"].as_u64()?, e["gen"].as_u64()?)))
        .chain(manifests(&ckpt).into_iter().map(|m| (m.0, m.1)))
        .collect();
    let resumed: Vec<u64> = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"].as_u64() > Some(2))
        .filter_map(|e| e["resume_step"].as_u64())
        .collect();
    assert!(
        !resumed.is_empty(),
        "the world of 3 resumed from a checkpoint"
    );
    for step in &resumed {
        assert!(
            sealed.iter().any(|(s, g)| s == step && *g == 2),
            "resumed from step {step}, not a checkpoint the survivors sealed: {sealed:?}"
        );
    }
    eprintln!(
        "cut-off world: {} commits sent after the cut, none accepted; survivors sealed up to {:?}; \
         the world of 3 resumed from step {:?}",
        sent_after.len(),
        sealed_steps(&out, &ckpt, 2).into_iter().max(),
        resumed.first()
    );
    drop(agents);
    drop(server);
}
