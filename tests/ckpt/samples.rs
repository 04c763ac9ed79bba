//! The data promise with real torch (no sample skipped or repeated across world sizes) and shell
//! workers through `drun-ckpt`.

use super::*;

// --- No sample skipped, none repeated, across 4 → 2 → 4 workers (real torch) ------------------

fn no_skip_no_duplicate(store: Store) {
    let Some(python) = crate::harness::torch_python() else {
        return;
    };
    let d = dirs();
    let r = rdzv(store, "ckpt-torch", "1:2");
    // Cold agents join at once, so the first world has both nodes: a warm agent joins once its
    // interpreters imported torch, and on a loaded machine one of them formed alone (`1:2`,
    // a 0.5 s last call) and trained the whole run before the other was admitted.
    let cold = ["--warm-workers", "off"];
    let a = example_agent_with(&python, 0, &r, &d, "faults", &cold, &[]);
    let b = example_agent_with(&python, 1, &r, &d, "faults", &cold, &[]);
    wait_for(
        "a checkpoint sealed by 4 workers",
        Duration::from_secs(120),
        || latest(&d).is_some_and(|m| m["world_size"] == 4 && m["step"].as_u64().unwrap() >= 12),
    );
    b.signal(Signal::SIGKILL);
    drop(b);
    wait_for(
        "a checkpoint sealed by the 2 survivors",
        Duration::from_secs(120),
        || latest(&d).is_some_and(|m| m["world_size"] == 2),
    );
    // The newcomer starts cold too: a warm one joins once its interpreters imported torch, and
    // on a loaded machine the survivors could finish the run meanwhile.
    let b2 = example_agent_with(&python, 1, &r, &d, "faults", &cold, &[]);
    let (ca, oa, ea) = a.wait(Duration::from_secs(240));
    let (cb, _, eb) = b2.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (0, 0), "A:\n{ea}\nB':\n{eb}");
    assert!(oa.contains("resumed at step="), "{oa}");
    assert!(
        ea.contains("resuming from checkpoint step"),
        "the agent says what it resumes from:\n{ea}"
    );

    // The ledger as the operator sees it.
    let o = Command::new(crate::harness::cluster::rendezvous_bin())
        .args(["status", "ckpt-torch", "--json"])
        .args(&r.status)
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("status JSON: {e}: {}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(status["checkpoints"]["latest"]["step"], 128, "{status}");
    assert_eq!(status["checkpoints"]["latest"]["world_size"], 4, "{status}");
    assert_eq!(
        status["checkpoints"]["latest"]["cursor"]["epoch"], 2,
        "{status}"
    );

    let prefix = d.out.join("idx");
    let mut args = vec!["indices", prefix.to_str().unwrap()];
    args.extend(crate::harness::EXAMPLE_DATA_ARGS);
    let summary = check(&python, &args);
    // World sizes by generation that ran workers: 4, then 2 (node lost), then 4 (scaled back).
    let worlds: Vec<usize> = summary["generations"]
        .as_object()
        .unwrap()
        .values()
        .map(|r| r.as_array().unwrap().len())
        .collect();
    let shape: Vec<usize> = worlds.iter().fold(Vec::new(), |mut v, w| {
        if v.last() != Some(w) {
            v.push(*w);
        }
        v
    });
    assert!(
        shape.windows(3).any(|w| w == [4, 2, 4]),
        "ran at 4, then 2, then 4 workers: {summary}"
    );

    // The same job without faults, at the same global batch: the same model.
    let cmp = check(
        &python,
        &[
            "compare",
            d.out.join("faults/final.pt").to_str().unwrap(),
            example_reference(&python).to_str().unwrap(),
            "--tol",
            "1e-5",
        ],
    );
    eprintln!("data order: {summary}; final model vs no-fault run: {cmp}");
}

#[test]
fn torch_no_sample_skipped_or_repeated_across_world_sizes_etcd() {
    no_skip_no_duplicate(Store::Etcd);
}

#[test]
fn torch_no_sample_skipped_or_repeated_across_world_sizes_memory() {
    no_skip_no_duplicate(Store::Memory);
}

// --- Shell workers through drun-ckpt -------------------------------------------------------------

#[test]
fn shell_workers_commit_with_drun_ckpt() {
    let d = dirs();
    let script = d.out.join("worker.sh");
    std::fs::write(
        &script,
        r#"set -eu
f="$DRUN_CKPT_DIR/step-3-rank$RANK.bin"
printf 'weights of rank %s' "$RANK" > "$f"
"$DRUN_CKPT_BIN" commit --step 3 --samples 24 "$f" > "$OUT/commit$RANK.json"
if "$DRUN_CKPT_BIN" should-save; then exit 9; fi
"$DRUN_CKPT_BIN" resume > "$OUT/resume$RANK.json"
# Step 5: rank 1 wrote nothing of its own, and there is no data cursor.
if [ "$RANK" = 0 ]; then
  g="$DRUN_CKPT_DIR/step-5-rank0.bin"
  printf 'step 5' > "$g"
  "$DRUN_CKPT_BIN" commit --step 5 "$g" > "$OUT/five$RANK.json"
else
  "$DRUN_CKPT_BIN" commit --step 5 > "$OUT/five$RANK.json"
fi
"#,
    )
    .unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2", "--ckpt-dir"])
        .arg(&d.ckpt)
        .args(["--no-python", "bash"])
        .arg(&script)
        .env("DRUN_CKPT_BIN", env!("CARGO_BIN_EXE_drun-ckpt"))
        .env("OUT", &d.out);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let answers: Vec<Value> = (0..2)
        .map(|r| read_json(&d.out.join(format!("commit{r}.json"))))
        .collect();
    // One node: its batched record completes the step, so both ranks hear "sealed".
    assert!(
        answers
            .iter()
            .all(|a| a["sealed"] == true && a["manifest"] == answers[0]["manifest"]),
        "{answers:?}"
    );
    let m = read_json(Path::new(answers[0]["manifest"].as_str().unwrap()));
    assert_eq!(m["step"], 3);
    assert_eq!(m["cursor"]["consumed_in_epoch"], 24);
    assert_eq!(
        m["cursor"]["consumed_total"], 24,
        "--samples is a cursor of epoch 0"
    );
    assert_eq!(m["files"].as_array().unwrap().len(), 2);
    let five = latest(&d).expect("latest points at step 5's manifest");
    assert_eq!(five["step"], 5, "sealed with a rank that committed no file");
    let files = five["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{five}");
    assert_eq!(files[0]["rank"], 0);
    assert_eq!(five["cursor"]["consumed_in_epoch"], 0, "no cursor: {five}");
    assert!(read_json(&d.out.join("five1.json"))["sealed"] == true);
    let resume = read_json(&d.out.join("resume0.json"));
    assert_eq!(
        resume["resume"],
        Value::Null,
        "first generation starts fresh"
    );
    assert_eq!(resume["world_size"], 2);
    // Outside drun the client says so and exits 2.
    let o = Command::new(env!("CARGO_BIN_EXE_drun-ckpt"))
        .arg("resume")
        .env_remove("DRUN_AGENT_SOCK")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        "drun-ckpt: not running under drun (DRUN_AGENT_SOCK is unset)"
    );
    operator_commands_read_the_directory_the_run_left(&d);
}

/// `drun-ckpt list` and `verify` on the `--ckpt-dir` the run above left, with no agent: both
/// steps listed and `latest` marked; the latest checkpoint verified; then a byte of it changed
/// on disk, and `verify` names the file (exit 1).
fn operator_commands_read_the_directory_the_run_left(d: &Dirs) {
    let ckpt = |args: &[&str], path: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_drun-ckpt"))
            .args(args)
            .arg(path)
            .env_remove("DRUN_AGENT_SOCK")
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, out, err) = ckpt(&["list"], &d.ckpt);
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].contains(" 3 ") && !rows[0].ends_with("latest"),
        "{out}"
    );
    assert!(
        rows[1].contains(" 5 ") && rows[1].ends_with("latest"),
        "{out}"
    );
    let (code, out, err) = ckpt(&["verify"], &d.ckpt);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("checkpoint step 5 (generation 1) of run ")
            && out.contains("1 file(s)")
            && out.contains("every size and digest as its manifest records"),
        "{out}"
    );
    let five = latest(d).unwrap();
    let file = five["files"][0]["path"].as_str().unwrap().to_string();
    std::fs::write(&file, "step 6").unwrap();
    let (code, _, err) = ckpt(&["verify"], &d.ckpt);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.starts_with(&format!("drun-ckpt: {file} (rank 0) has digest ")),
        "{err}"
    );
    let (code, _, err) = ckpt(&["verify"], &d.out);
    assert_eq!(code, Some(2), "no checkpoint there: {err}");
}
