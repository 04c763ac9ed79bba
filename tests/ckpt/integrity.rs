//! Integrity of the ledger: a corrupted shard, a rank killed mid-write, misaligned cursors, a stale
//! agent.

use super::*;

// --- A corrupted shard -------------------------------------------------------------------------

fn corrupted_shard_falls_back(store: Store) {
    let d = dirs();
    let r = rdzv(store, "ckpt-corrupt", "1");
    let a = agent(
        0,
        &r,
        &d,
        2,
        &["--max-restarts", "2", "--ckpt-verify", "digest"],
        &[("CKPT_HOLD_AT", "6"), ("CKPT_STEPS", "10")],
    );
    wait_for(
        "both ranks to hold after step 6",
        Duration::from_secs(30),
        || count(&events(&d), "holding", |_| true) == 2 && latest_step(&d) == 6,
    );
    // Flip one byte of rank 1's sealed file: same size, different content.
    let m = latest(&d).unwrap();
    let f = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["rank"] == 1)
        .unwrap()["path"]
        .as_str()
        .unwrap()
        .to_string();
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[10] ^= 0x55;
    std::fs::write(&f, &bytes).unwrap();
    std::fs::write(d.out.join("crash"), b"").unwrap();

    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "recovered and finished:\n{err}");
    let line = super::fallback_line(&err);
    assert!(
        line.starts_with("drun: checkpoint step 6 (generation 1) failed verification:")
            && line.contains("(rank 1) has digest"),
        "{line}"
    );
    let evs = events(&d);
    let last_gen = super::last_gen(&evs);
    assert!(
        last_gen >= 3,
        "gen 2 was re-formed away without starting workers"
    );
    for e in evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"] == last_gen)
    {
        assert_eq!(e["resume_step"], 4, "every rank resumes from step 4: {e}");
        assert_eq!(e["env_resume"]["DRUN_RESUME_STEP"], "4");
    }
    assert_eq!(count(&evs, "start", |e| e["gen"] == last_gen), 2);
    assert_eq!(
        count(&evs, "start", |e| e["gen"] == 2),
        0,
        "no worker resumed from the corrupt step"
    );
    assert_eq!(count(&evs, "done", |_| true), 2);
    assert_eq!(latest_step(&d), 10);
}

#[test]
fn corrupted_shard_falls_back_memory() {
    corrupted_shard_falls_back(Store::Memory);
}

#[test]
fn corrupted_shard_falls_back_etcd() {
    corrupted_shard_falls_back(Store::Etcd);
}

// --- A relaunch whose `latest` failed verification ---------------------------------------------

/// A relaunch on a fresh store (standalone, same run id) whose `latest` checkpoint is corrupt
/// falls back to the run's previous checkpoint on disk, not to step 0; the bad one is marked
/// next to its manifest, so the launch after that neither verifies it again nor points at it.
#[test]
fn a_relaunch_whose_latest_fails_verification_resumes_from_the_previous_checkpoint() {
    let d = dirs();
    let r = Rdzv {
        _etcd: None,
        _server: None,
        args: ["--standalone", "--rdzv-id", "relaunch"]
            .map(String::from)
            .to_vec(),
        status: vec![],
    };
    let launch = |steps: &str| {
        let a = agent(0, &r, &d, 2, &[], &[("CKPT_STEPS", steps)]);
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 0, "{err}");
        err
    };
    launch("6");
    assert_eq!(latest_step(&d), 6);
    // Truncate rank 0's file of step 6.
    let m = latest(&d).unwrap();
    let f = m["files"].as_array().unwrap()[0]["path"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(&f, b"x").unwrap();

    let err = launch("10");
    let line = super::fallback_line(&err);
    assert!(line.contains("checkpoint step 6 (generation 1)"), "{line}");
    assert!(
        err.contains("offering the run's newest usable checkpoint, step 4"),
        "{err}"
    );
    let evs = events(&d);
    let last_gen = super::last_gen(&evs);
    let starts: Vec<&Value> = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"] == last_gen)
        .collect();
    assert_eq!(starts.len(), 2, "{starts:?}");
    for e in starts {
        assert_eq!(e["resume_step"], 4, "every rank resumes from step 4: {e}");
    }
    assert_eq!(latest_step(&d), 10, "latest moved past the bad checkpoint");

    // The mark persists: the next relaunch resumes from step 10 without verifying step 6.
    let err = launch("12");
    assert!(!err.contains("failed verification"), "{err}");
    assert!(err.contains("resuming from checkpoint step 10"), "{err}");
}

/// A relaunch (same run id) from a checkpoint directory that was moved elsewhere resumes its
/// latest step, read where the directory is now: the manifests' recorded paths name the old
/// place, and nothing is verified, marked or written there (a user saw a relaunch train from
/// step 0, after marking the step bad at the old place).
#[test]
fn a_relaunch_from_a_moved_checkpoint_directory_resumes_its_latest_step() {
    let mut d = dirs();
    let r = Rdzv {
        _etcd: None,
        _server: None,
        args: ["--standalone", "--rdzv-id", "moved"]
            .map(String::from)
            .to_vec(),
        status: vec![],
    };
    let a = agent(0, &r, &d, 2, &[], &[("CKPT_STEPS", "6")]);
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert_eq!(latest_step(&d), 6);
    let moved = d.ckpt.with_file_name("moved-ckpt");
    std::fs::rename(&d.ckpt, &moved).unwrap();
    let old = std::mem::replace(&mut d.ckpt, moved.clone());

    let a = agent(0, &r, &d, 2, &[], &[("CKPT_STEPS", "10")]);
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("resuming from checkpoint step 6"), "{err}");
    assert!(!err.contains("failed verification"), "{err}");
    // Each launch is generation 1 of its own store: the relaunch's are the last two starts.
    let evs = events(&d);
    let starts: Vec<&Value> = evs.iter().filter(|e| e["event"] == "start").collect();
    assert_eq!(starts.len(), 4, "{starts:?}");
    for e in &starts[2..] {
        assert_eq!(e["resume_step"], 6, "every rank resumes from step 6: {e}");
    }
    assert_eq!(latest_step(&d), 10);
    assert!(
        !old.exists(),
        "something was written where the directory was"
    );
}

// --- A rank killed while writing its shard ------------------------------------------------------

fn killed_mid_write_never_seals(store: Store) {
    let d = dirs();
    let r = rdzv(store, "ckpt-midwrite", "1");
    let a = agent(
        0,
        &r,
        &d,
        2,
        &["--max-restarts", "1"],
        &[("CKPT_DIE_MIDWRITE", "1:4"), ("CKPT_STEPS", "8")],
    );
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    let evs = events(&d);
    assert_eq!(
        count(&evs, "dying", |e| e["rank"] == 1 && e["step"] == 4),
        1
    );
    assert_eq!(
        count(&evs, "committed", |e| e["gen"] == 1 && e["step"] == 4),
        0,
        "rank 0's commit of step 4 waits for rank 1 and never completes"
    );
    assert!(
        !manifest_files(&d).contains(&(4, 1)),
        "no manifest of step 4 in generation 1: {:?}",
        manifest_files(&d)
    );
    for e in evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"] == 2)
    {
        assert_eq!(e["resume_step"], 2, "previous checkpoint used: {e}");
        assert_eq!(e["resume_samples"], 16);
    }
    assert_eq!(count(&evs, "start", |e| e["gen"] == 2), 2);
    assert!(
        !files_under(&d.ckpt)
            .iter()
            .any(|f| f.ends_with("step-00000004-g1/rank1.pt")),
        "the half-written file never reached its final name"
    );
    assert_eq!(latest_step(&d), 8);
}

#[test]
fn killed_mid_write_never_seals_memory() {
    killed_mid_write_never_seals(Store::Memory);
}

#[test]
fn killed_mid_write_never_seals_etcd() {
    killed_mid_write_never_seals(Store::Etcd);
}

// --- Misaligned cursors across nodes ----------------------------------------------------------

/// `extra`: `--ckpt-memory off` for the direct path, where the refused rank hears it on its
/// commit of step 4; at the default (in memory) that commit was answered staged, and the
/// refusal answers the rank's commit of its next step, naming step 4.
fn misaligned_cursor_is_refused(store: Store, extra: &[&str]) {
    let direct = extra.contains(&"off");
    let d = dirs();
    let r = rdzv(store, "ckpt-misaligned", "2");
    let env = [("CKPT_BAD_CURSOR", "1:4"), ("CKPT_STEPS", "40")];
    let a = agent(0, &r, &d, 1, extra, &env);
    let b = agent(1, &r, &d, 1, extra, &env);
    let (ca, _, ea) = a.wait(Duration::from_secs(60));
    let (cb, _, eb) = b.wait(Duration::from_secs(60));
    assert_eq!(
        (ca, cb),
        (1, 1),
        "the refused rank exits 3, the job fails:\n{ea}\n{eb}"
    );
    let both = format!("{ea}\n{eb}");
    let line = both
        .lines()
        .find(|l| l.contains("misaligned data"))
        .unwrap_or_else(|| panic!("the refusal is reported:\n{both}"));
    assert!(
        line.contains("step 4 not sealed")
            && line.contains("rank 0 report cursor")
            && line.contains("rank 1 report cursor")
            && line.contains("\"consumed_in_epoch\":33"),
        "{line}"
    );
    let evs = events(&d);
    // The node whose record completes the step is told (both, when they complete it at once).
    assert!(
        count(&evs, "refused", |e| {
            let error = e["error"].as_str().unwrap();
            error.contains("misaligned data")
                && if direct {
                    e["step"] == 4
                } else {
                    e["step"].as_u64() > Some(4)
                        && error.contains("checkpoint step 4 was refused after this node answered it staged in memory")
                }
        }) >= 1,
        "{evs:?}"
    );
    let sealed = manifest_files(&d);
    assert!(sealed.contains(&(2, 1)), "{sealed:?}");
    assert!(
        sealed.iter().all(|(s, _)| *s != 4),
        "step 4 never sealed: {sealed:?}"
    );
}

#[test]
fn misaligned_cursor_is_refused_memory() {
    misaligned_cursor_is_refused(Store::Memory, &[]);
}

#[test]
fn misaligned_cursor_is_refused_etcd() {
    misaligned_cursor_is_refused(Store::Etcd, &[]);
}

/// The direct path (`--ckpt-memory off`): the refusal answers the commit of step 4 itself.
#[test]
fn misaligned_cursor_is_refused_on_the_direct_path() {
    misaligned_cursor_is_refused(Store::Memory, &["--ckpt-memory", "off"]);
}

// --- A stale agent ------------------------------------------------------------------------------

/// `extra`: `--ckpt-memory off` for the direct path, where the ledger's refusal answers the
/// stale worker's commit. At the default (in memory) its own agent answers that commit staged
/// before the ledger sees it: the answer may come, but never a seal, and nothing after it seals.
fn stale_agent_cannot_commit(store: Store, extra: &[&str]) {
    let direct = extra.contains(&"off");
    let d = dirs();
    let r = rdzv(store, "ckpt-stale", "1:2");
    let env = [
        ("CKPT_EVERY", "1"),
        ("CKPT_SLEEP", "0.2"),
        ("CKPT_STEPS", "100000"),
        ("CKPT_REFUSED_EXIT", "0"),
        ("CKPT_PROGRESS", "0"),
    ];
    let a = agent(0, &r, &d, 1, extra, &env);
    let b = agent(1, &r, &d, 1, extra, &env);
    wait_for(
        "a checkpoint sealed at world size 2",
        Duration::from_secs(30),
        || latest(&d).is_some_and(|m| m["world_size"] == 2 && m["step"].as_u64().unwrap() >= 2),
    );
    let b_worker = events(&d)
        .iter()
        .rev()
        .find(|e| e["event"] == "start" && e["rank"] == 1)
        .unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    // Stop B (agent and worker) right after one of B's commits was answered, so no commit of
    // B is in flight; its lease expires and A re-forms alone and seals in a new generation.
    wait_for(
        "a fresh answer to B's worker",
        Duration::from_secs(10),
        || {
            let evs = events(&d);
            let last = evs.iter().rev().find(|e| e["pid"] == b_worker);
            last.is_some_and(|e| {
                e["event"] == "committed" && now() - e["t"].as_f64().unwrap() < 0.08
            })
        },
    );
    b.signal(Signal::SIGSTOP);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(b_worker), Signal::SIGSTOP).unwrap();
    let stopped_at = now();
    wait_for(
        "A alone to seal a checkpoint in a new generation",
        Duration::from_secs(30),
        || latest(&d).is_some_and(|m| m["world_size"] == 1),
    );
    // B's worker wakes first and saves its next step: it asks its agent, stale by now, for
    // room in memory (the default) or to commit it (`--ckpt-memory off`).
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(b_worker), Signal::SIGCONT).unwrap();
    wait_for(
        "B's worker to save a step after its lease expired",
        Duration::from_secs(10),
        || {
            count(&events(&d), "saving", |e| {
                e["pid"] == b_worker && e["t"].as_f64().unwrap() > stopped_at
            }) == 1
        },
    );
    b.signal(Signal::SIGCONT);
    wait_for(
        "B's stale worker to be answered or stopped",
        Duration::from_secs(20),
        || !alive(b_worker) || count(&events(&d), "refused", |e| e["pid"] == b_worker) > 0,
    );
    let evs = events(&d);
    let answered: Vec<&Value> = evs
        .iter()
        .filter(|e| {
            e["event"] == "committed"
                && e["pid"] == b_worker
                && e["t"].as_f64().unwrap() > stopped_at
        })
        .collect();
    if direct {
        assert!(
            answered.is_empty(),
            "the stale agent's commit was not accepted: {answered:?}"
        );
    }
    for e in answered {
        assert!(
            e["staged"] == true && e["sealed"] == false,
            "only answered staged by its own agent, never sealed: {e}"
        );
    }
    for e in evs
        .iter()
        .filter(|e| e["event"] == "refused" && e["pid"] == b_worker)
    {
        let msg = e["error"].as_str().unwrap();
        assert!(
            msg.contains("stale") || msg.contains("stopping") || msg.contains("is over"),
            "refused as stale: {msg}"
        );
    }
    // B's last accepted commit before the stop may be sealed (its manifest file written by the
    // sealing agent a moment later); nothing after it can be.
    let b_last = evs
        .iter()
        .filter(|e| {
            e["event"] == "committed"
                && e["pid"] == b_worker
                && e["t"].as_f64().unwrap() < stopped_at
        })
        .filter_map(|e| e["step"].as_u64())
        .max()
        .unwrap_or(0);
    let stale_seals: Vec<_> = manifest_files(&d)
        .into_iter()
        .filter(|m| m.1 == 1 && m.0 > b_last)
        .collect();
    assert!(
        stale_seals.is_empty(),
        "nothing of generation 1 after step {b_last} sealed: {stale_seals:?}"
    );
    drop(a);
    drop(b);
}

#[test]
fn stale_agent_cannot_commit_memory() {
    stale_agent_cannot_commit(Store::Memory, &[]);
}

#[test]
fn stale_agent_cannot_commit_etcd() {
    stale_agent_cannot_commit(Store::Etcd, &[]);
}

/// The direct path (`--ckpt-memory off`): the ledger's refusal is the answer to the commit.
#[test]
fn stale_agent_cannot_commit_on_the_direct_path() {
    stale_agent_cannot_commit(Store::Etcd, &["--ckpt-memory", "off"]);
}
