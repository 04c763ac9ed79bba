//! A new run adopting a failed run's checkpoint: the copy it is given, and a corrupt one refused.

use super::*;

// --- Adopting another run's checkpoint ----------------------------------------------------------

/// Run A fails right after sealing step 6; run B (another run id, same --ckpt-dir, a store that
/// never saw A) starts from A's step 6 with `--ckpt-resume-from`, keeps only its own newest
/// checkpoint, and leaves A's files and manifest exactly as they were.
fn a_new_run_adopts_a_failed_runs_checkpoint(store: Store) {
    let d = dirs();
    std::fs::write(d.out.join("crash"), b"").unwrap(); // rank 0 fails right after step 6
    let ra = rdzv(store, "adopt-a", "1");
    let a = agent(
        0,
        &ra,
        &d,
        2,
        &["--rdzv-id", "adopt-a", "--max-restarts", "0"],
        &[("CKPT_HOLD_AT", "6"), ("CKPT_STEPS", "12")],
    );
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 1, "run A failed:\n{err}");
    drop(ra);
    let old = latest(&d).expect("run A sealed a checkpoint");
    assert_eq!(
        (old["run_id"].as_str(), old["step"].as_u64()),
        (Some("adopt-a"), Some(6))
    );
    let old_manifest = latest_file(&d).unwrap();
    let old_bytes = std::fs::read(&old_manifest).unwrap();
    let old_files: Vec<PathBuf> = old["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| PathBuf::from(f["path"].as_str().unwrap()))
        .collect();
    std::fs::rename(d.out.join("events.jsonl"), d.out.join("events-a.jsonl")).unwrap();
    std::fs::remove_file(d.out.join("crash")).unwrap();

    let rb = rdzv(store, "adopt-b", "1");
    let from = d.ckpt.to_str().unwrap().to_string();
    let b = agent(
        0,
        &rb,
        &d,
        2,
        &[
            "--rdzv-id",
            "adopt-b",
            "--ckpt-resume-from",
            &from,
            "--ckpt-keep-last",
            "1",
        ],
        &[("CKPT_STEPS", "12")],
    );
    let (code, _, err) = b.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "run B finished:\n{err}");
    assert!(
        err.contains("resuming from checkpoint step 6 of run adopt-a (--ckpt-resume-from)"),
        "{err}"
    );
    let evs = events(&d);
    assert_eq!(count(&evs, "start", |_| true), 2, "{evs:?}");
    for e in evs.iter().filter(|e| e["event"] == "start") {
        assert_eq!(e["resume_step"], 6, "{e}");
        assert_eq!(e["resume_samples"], 48, "6 steps of global batch 8: {e}");
        assert_eq!(e["env_resume"]["DRUN_RESUME_STEP"], "6");
        assert_eq!(
            e["env_resume"]["DRUN_RESUME_MANIFEST"],
            old_manifest.to_str().unwrap(),
            "workers read run A's own manifest file"
        );
    }
    let steps: Vec<u64> = evs
        .iter()
        .filter(|e| e["event"] == "committed" && e["rank"] == 0)
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [8, 10, 12], "B continues after A's step 6");
    let new = latest(&d).unwrap();
    assert_eq!(
        (new["run_id"].as_str(), new["step"].as_u64()),
        (Some("adopt-b"), Some(12))
    );
    assert!(
        new.get("adopted_from").is_none(),
        "B's own checkpoint: {new}"
    );
    assert_eq!(
        std::fs::read(&old_manifest).unwrap(),
        old_bytes,
        "A's manifest file is not rewritten"
    );
    for f in &old_files {
        assert!(
            f.exists(),
            "retention of run B deleted run A's {}",
            f.display()
        );
    }
    // B's own retention did run: only its newest checkpoint is left of B.
    assert_eq!(
        manifest_files(&d)
            .into_iter()
            .filter(|&(s, _)| s > 6)
            .collect::<Vec<_>>(),
        [(12, 1)]
    );
    // `latest` now names B's checkpoint, yet a relaunch of A still resumes A's own step 6.
    std::fs::rename(d.out.join("events.jsonl"), d.out.join("events-b.jsonl")).unwrap();
    let ra = rdzv(store, "adopt-a", "1");
    let a = agent(
        0,
        &ra,
        &d,
        2,
        &["--rdzv-id", "adopt-a"],
        &[("CKPT_STEPS", "8")],
    );
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "run A relaunched:\n{err}");
    let evs = events(&d);
    assert_eq!(
        count(&evs, "start", |e| e["resume_step"] == 6),
        2,
        "A resumes its own step 6: {evs:?}"
    );
}

/// `--ckpt-resume-from` names a copy of the checkpoint directory: the copy's files are used (the
/// original is corrupt here, and `--ckpt-verify digest` would say so). Naming the corrupt
/// original is refused in one line, exit 2, and no worker starts from scratch instead.
#[test]
fn adopting_uses_the_copy_it_is_given_and_refuses_a_corrupt_checkpoint() {
    let d = dirs();
    let ra = rdzv(Store::Memory, "copy-a", "1");
    let a = agent(
        0,
        &ra,
        &d,
        2,
        &["--rdzv-id", "copy-a"],
        &[("CKPT_STEPS", "4")],
    );
    let (code, _, err) = a.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    let copy = d.out.join("copy");
    assert!(Command::new("cp")
        .arg("-a")
        .arg(&d.ckpt)
        .arg(&copy)
        .status()
        .unwrap()
        .success());
    let m = latest(&d).unwrap();
    let original = m["files"][0]["path"].as_str().unwrap().to_string();
    let mut bytes = std::fs::read(&original).unwrap();
    bytes[3] ^= 0x20;
    std::fs::write(&original, &bytes).unwrap();
    std::fs::rename(d.out.join("events.jsonl"), d.out.join("events-a.jsonl")).unwrap();

    let b = |from: &Path, run: &str| {
        let r = rdzv(Store::Memory, run, "1");
        let from = from.to_str().unwrap().to_string();
        let c = agent(
            0,
            &r,
            &d,
            2,
            &[
                "--rdzv-id",
                run,
                "--ckpt-verify",
                "digest",
                "--ckpt-resume-from",
                &from,
            ],
            &[("CKPT_STEPS", "6")],
        );
        c.wait(Duration::from_secs(60))
    };
    let (code, _, err) = b(&copy, "copy-b");
    assert_eq!(code, 0, "the copy verifies:\n{err}");
    let evs = events(&d);
    for e in evs.iter().filter(|e| e["event"] == "start") {
        assert_eq!(e["resume_step"], 4, "{e}");
        let path = e["env_resume"]["DRUN_RESUME_PATH"].as_str().unwrap();
        assert!(path.starts_with(copy.to_str().unwrap()), "{e}");
    }
    std::fs::rename(d.out.join("events.jsonl"), d.out.join("events-b.jsonl")).unwrap();

    // B shares the directory, so `<ckpt>/latest` is B's now; `<ckpt>/copy-a/` holds A's pointer.
    let (code, _, err) = b(&d.ckpt.join("copy-a"), "copy-c");
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("drun: ")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("--ckpt-resume-from")
            && lines[0].contains("checkpoint step 4 of run copy-a failed verification")
            && lines[0].contains("not starting run copy-c from the beginning"),
        "{}",
        lines[0]
    );
    assert!(events(&d).is_empty(), "no worker started from scratch");
    eprintln!("refused: {}", lines[0]);
}

#[test]
fn a_new_run_adopts_a_failed_runs_checkpoint_memory() {
    a_new_run_adopts_a_failed_runs_checkpoint(Store::Memory);
}

#[test]
fn a_new_run_adopts_a_failed_runs_checkpoint_etcd() {
    a_new_run_adopts_a_failed_runs_checkpoint(Store::Etcd);
}
