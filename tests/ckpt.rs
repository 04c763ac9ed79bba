//! The checkpoint ledger end to end: real agents, real workers committing real files through
//! `DRUN_AGENT_SOCK`, on the in-memory store and on etcd (design §4, failure cases 13, 34, 35).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::{alive, drun, read_json, wait_for, worker, Agent, DrunCmd};

/// Lease TTL of these tests, seconds.
const TTL: u64 = 3;

#[derive(Clone, Copy, Debug)]
enum Store {
    Memory,
    Etcd,
}

/// A rendezvous for the test: the store's processes and the agent flags that reach it.
struct Rdzv {
    _etcd: Option<Etcd>,
    _server: Option<RdzvServer>,
    args: Vec<String>,
    /// `drun-rendezvous status` flags that reach the same store.
    status: Vec<String>,
}

fn rdzv(store: Store, run: &str, nnodes: &str) -> Rdzv {
    let conf = format!("lease_ttl={TTL},last_call_timeout=0.5");
    let base = |more: Vec<String>| -> Vec<String> {
        let mut v: Vec<String> = ["--nnodes", nnodes, "--rdzv-id", run, "--rdzv-conf", &conf]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(more);
        v
    };
    match (store, nnodes == "1") {
        (Store::Memory, true) => Rdzv {
            _etcd: None,
            _server: None,
            args: vec!["--standalone".into()],
            status: vec![],
        },
        (Store::Memory, false) => {
            let server = RdzvServer::start(&["--store", "memory"]);
            let args = base(vec!["--rdzv-endpoint".into(), server.endpoint.clone()]);
            Rdzv {
                _etcd: None,
                status: vec!["--endpoint".into(), server.endpoint.clone()],
                _server: Some(server),
                args,
            }
        }
        (Store::Etcd, _) => {
            let etcd = Etcd::start();
            let args = base(vec![
                "--rdzv-backend".into(),
                "etcd".into(),
                "--rdzv-endpoint".into(),
                etcd.endpoint.clone(),
            ]);
            Rdzv {
                status: vec!["--etcd-endpoints".into(), etcd.endpoint.clone()],
                _etcd: Some(etcd),
                _server: None,
                args,
            }
        }
    }
}

/// A test's directories: worker events in `out`, checkpoints in `ckpt`.
struct Dirs {
    _tmp: tempfile::TempDir,
    out: PathBuf,
    ckpt: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let ckpt = tmp.path().join("ckpt");
    std::fs::create_dir_all(&out).unwrap();
    Dirs {
        out,
        ckpt,
        _tmp: tmp,
    }
}

/// An agent on loopback address 127.0.0.(i+1) running `ckpt_worker.py`.
fn agent(i: usize, r: &Rdzv, d: &Dirs, nproc: u32, extra: &[&str], env: &[(&str, &str)]) -> Agent {
    let mut c: Command = drun();
    c.args(&r.args)
        .nproc(nproc)
        .node(i)
        .quick_shutdown()
        .arg("--ckpt-dir")
        .arg(&d.ckpt)
        .args(extra)
        .arg(worker("ckpt_worker.py"))
        .env("CKPT_OUT", &d.out);
    for (k, v) in env {
        c.env(k, v);
    }
    Agent::start(c)
}

fn events(d: &Dirs) -> Vec<Value> {
    std::fs::read_to_string(d.out.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("event line is JSON"))
        .collect()
}

fn count(evs: &[Value], event: &str, pred: impl Fn(&Value) -> bool) -> usize {
    evs.iter()
        .filter(|e| e["event"] == event && pred(e))
        .count()
}

/// The manifest file `<ckpt>/latest` points at (the pointer is relative to `<ckpt>`).
fn latest_file(d: &Dirs) -> Option<PathBuf> {
    let p = std::fs::read_to_string(d.ckpt.join("latest")).ok()?;
    Some(d.ckpt.join(p.trim()))
}

/// The manifest `<ckpt>/latest` points at.
fn latest(d: &Dirs) -> Option<Value> {
    Some(read_json(&latest_file(d)?))
}

fn latest_step(d: &Dirs) -> u64 {
    latest(d).map_or(0, |m| m["step"].as_u64().unwrap())
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every manifest file under the checkpoint directory: (step, generation).
fn manifest_files(d: &Dirs) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = files_under(&d.ckpt)
        .iter()
        .filter_map(|f| {
            let name = f.file_name()?.to_string_lossy().into_owned();
            let rest = name.strip_prefix("drun-manifest-")?.strip_suffix(".json")?;
            let (s, g) = rest.split_once('-')?;
            Some((s.parse().ok()?, g.parse().ok()?))
        })
        .collect();
    v.sort_unstable();
    v
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

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
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("drun: ") && l.contains("failed verification"))
        .collect();
    assert_eq!(lines.len(), 1, "said once, in one line:\n{err}");
    assert!(
        lines[0].starts_with("drun: checkpoint step 6 (generation 1) failed verification:")
            && lines[0].contains("(rank 1) has sha256")
            && lines[0].ends_with("falling back to the previous checkpoint"),
        "{}",
        lines[0]
    );
    let evs = events(&d);
    let last_gen = evs
        .iter()
        .map(|e| e["gen"].as_u64().unwrap())
        .max()
        .unwrap();
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

fn misaligned_cursor_is_refused(store: Store) {
    let d = dirs();
    let r = rdzv(store, "ckpt-misaligned", "2");
    let env = [("CKPT_BAD_CURSOR", "1:4"), ("CKPT_STEPS", "40")];
    let a = agent(0, &r, &d, 1, &[], &env);
    let b = agent(1, &r, &d, 1, &[], &env);
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
        count(&evs, "refused", |e| e["step"] == 4
            && e["error"].as_str().unwrap().contains("misaligned data"))
            >= 1
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
    misaligned_cursor_is_refused(Store::Memory);
}

#[test]
fn misaligned_cursor_is_refused_etcd() {
    misaligned_cursor_is_refused(Store::Etcd);
}

// --- A stale agent ------------------------------------------------------------------------------

fn stale_agent_cannot_commit(store: Store) {
    let d = dirs();
    let r = rdzv(store, "ckpt-stale", "1:2");
    let env = [
        ("CKPT_EVERY", "1"),
        ("CKPT_SLEEP", "0.2"),
        ("CKPT_STEPS", "100000"),
        ("CKPT_REFUSED_EXIT", "0"),
        ("CKPT_PROGRESS", "0"),
    ];
    let a = agent(0, &r, &d, 1, &[], &env);
    let b = agent(1, &r, &d, 1, &[], &env);
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
    // B's worker wakes first and asks its agent, stale by now, to commit its next step.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(b_worker), Signal::SIGCONT).unwrap();
    wait_for(
        "B's worker to ask for a commit after its lease expired",
        Duration::from_secs(10),
        || {
            count(&events(&d), "committing", |e| {
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
    assert_eq!(
        count(&evs, "committed", |e| e["pid"] == b_worker
            && e["t"].as_f64().unwrap() > stopped_at),
        0,
        "the stale agent's commit was not accepted"
    );
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
    stale_agent_cannot_commit(Store::Memory);
}

#[test]
fn stale_agent_cannot_commit_etcd() {
    stale_agent_cannot_commit(Store::Etcd);
}

// --- No sample skipped, none repeated, across 4 → 2 → 4 workers (real torch) ------------------

const EXAMPLE_ARGS: &[&str] = &[
    "--epochs",
    "2",
    "--global-batch",
    "64",
    "--ckpt-every",
    "4",
    "--step-sleep",
    "0.05",
];

fn example_agent(python: &Path, i: usize, r: &Rdzv, d: &Dirs, out: &str) -> Agent {
    example_agent_with(python, i, r, d, out, &[], &[])
}

/// [`example_agent`] with more drun flags and more training arguments (which win over
/// `EXAMPLE_ARGS`: argparse keeps the last).
fn example_agent_with(
    python: &Path,
    i: usize,
    r: &Rdzv,
    d: &Dirs,
    out: &str,
    drun_extra: &[&str],
    train_extra: &[&str],
) -> Agent {
    let mut c: Command = drun();
    c.python(python)
        .args(&r.args)
        .args(drun_extra)
        .nproc(2)
        .node(i)
        .args([
            "--max-restarts",
            "3",
            "--shutdown-timeout",
            "5",
            "--ckpt-dir",
        ])
        .arg(&d.ckpt)
        .arg(crate::harness::root().join("examples/train_ddp.py"))
        .args(EXAMPLE_ARGS)
        .args(train_extra)
        .arg("--record-indices")
        .arg(d.out.join("idx"))
        .arg("--out")
        .arg(d.out.join(out));
    Agent::start(c)
}

fn check(python: &Path, args: &[&str]) -> Value {
    let o = Command::new(python)
        .arg(worker("check_indices.py"))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(text.trim()).unwrap()
}

fn no_skip_no_duplicate(store: Store) {
    let Some(python) = crate::harness::torch_python() else {
        return;
    };
    let d = dirs();
    let r = rdzv(store, "ckpt-torch", "1:2");
    let a = example_agent(&python, 0, &r, &d, "faults");
    let b = example_agent(&python, 1, &r, &d, "faults");
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
    let b2 = example_agent(&python, 1, &r, &d, "faults");
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
        .args(["status", "ckpt-torch"])
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
    let base = dirs();
    let mut c = drun();
    c.python(&python)
        .args(["--standalone", "--nproc-per-node", "2", "--ckpt-dir"])
        .arg(&base.ckpt)
        .arg(crate::harness::root().join("examples/train_ddp.py"))
        .args(EXAMPLE_ARGS)
        .args(["--step-sleep", "0", "--out"])
        .arg(base.out.join("clean"));
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(240));
    assert_eq!(code, 0, "{err}");
    let cmp = check(
        &python,
        &[
            "compare",
            d.out.join("faults/final.pt").to_str().unwrap(),
            base.out.join("clean/final.pt").to_str().unwrap(),
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
    let m = latest(&d).expect("latest points at the manifest");
    assert_eq!(m["step"], 3);
    assert_eq!(m["cursor"]["consumed_in_epoch"], 24);
    assert_eq!(m["files"].as_array().unwrap().len(), 2);
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
}

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

// --- Scale-up: a checkpoint before admitting a newcomer (failure case 13) -----------------------

/// The torch example alone on one node (`--nnodes 1:2`, no periodic checkpoint); a second node
/// arrives mid-epoch. With `--on-scale-up checkpoint` every rank saves the same step first, the
/// group re-forms once it is sealed, and the 4 workers resume from it: no sample skipped or
/// repeated, and only the steps run between the seal and the re-form are repeated.
fn scale_up_waits_for_a_checkpoint(store: Store) {
    let Some(python) = crate::harness::torch_python() else {
        return;
    };
    let d = dirs();
    let r = rdzv(store, "scale-up-ckpt", "1:2");
    let policy = ["--on-scale-up", "checkpoint"];
    let no_periodic = ["--ckpt-every", "100000"];
    let a = example_agent_with(&python, 0, &r, &d, "scaled", &policy, &no_periodic);
    let alone = d.out.join("idx.rank0.gen1");
    wait_for(
        "the first node to train alone to step 15",
        Duration::from_secs(120),
        || std::fs::read_to_string(&alone).is_ok_and(|t| t.lines().count() >= 15),
    );
    let b = example_agent_with(&python, 1, &r, &d, "scaled", &policy, &no_periodic);
    let (ca, oa, ea) = a.wait(Duration::from_secs(240));
    let (cb, _, eb) = b.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (0, 0), "A:\n{ea}\nB:\n{eb}");
    let sealed: u64 = ea
        .lines()
        .find_map(|l| l.split("admitted after step ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the re-form waited for a checkpoint:\n{ea}"));
    assert!(
        sealed >= 15,
        "saved after the newcomer came (step {sealed})"
    );
    assert!(
        oa.contains(&format!("resumed at step={sealed} ")) && oa.contains("now 4)"),
        "the 4 workers resume from the scale-up checkpoint:\n{oa}"
    );
    let prefix = d.out.join("idx");
    let mut args = vec!["indices", prefix.to_str().unwrap()];
    args.extend(crate::harness::EXAMPLE_DATA_ARGS);
    let summary = check(&python, &args);
    let alone_steps = std::fs::read_to_string(&alone).unwrap().lines().count() as u64;
    let replayed = summary["steps_run_again"].as_u64().unwrap();
    assert_eq!(
        replayed,
        alone_steps - sealed,
        "only the steps after the seal are repeated: {summary}"
    );
    eprintln!("scale-up checkpoint at step {sealed}, {replayed} step(s) repeated: {summary}");
}

#[test]
fn torch_scale_up_waits_for_a_checkpoint_memory() {
    scale_up_waits_for_a_checkpoint(Store::Memory);
}

/// Workers that never ask `should_save`: the newcomer is admitted after
/// `--scale-up-save-timeout` anyway, and the log says there was no checkpoint.
fn scale_up_save_times_out(store: Store) {
    let d = dirs();
    let r = rdzv(store, "scale-up-timeout", "1:2");
    let extra = [
        "--on-scale-up",
        "checkpoint",
        "--scale-up-save-timeout",
        "1",
    ];
    // Generation 1 must outlast the newcomer's join plus the 1 s timeout (8 s of steps).
    let env = [("CKPT_EVERY", "1000"), ("CKPT_STEPS", "160")];
    let a = agent(0, &r, &d, 2, &extra, &env);
    wait_for("the first node's workers", Duration::from_secs(30), || {
        count(&events(&d), "start", |e| e["gen"] == 1) == 2
    });
    let b = agent(1, &r, &d, 2, &extra, &env);
    let (ca, _, ea) = a.wait(Duration::from_secs(60));
    let (cb, _, eb) = b.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (0, 0), "A:\n{ea}\nB:\n{eb}");
    assert!(
        ea.contains("no checkpoint was sealed within 1 s, re-forming without one"),
        "{ea}"
    );
    let evs = events(&d);
    assert_eq!(
        count(&evs, "start", |e| e["gen"] == 2 && e["world"] == 4),
        4,
        "{evs:?}"
    );
    assert_eq!(count(&evs, "done", |_| true), 4);
}

#[test]
fn scale_up_save_times_out_memory() {
    scale_up_save_times_out(Store::Memory);
}

#[test]
fn scale_up_save_times_out_etcd() {
    scale_up_save_times_out(Store::Etcd);
}

/// The newcomer stops waiting (SIGTERM: it leaves, its lease is revoked) while the scale-up
/// checkpoint is pending: the scale-up is called off, the running group is not re-formed, not
/// even when the timeout passes.
#[test]
fn a_scale_up_is_called_off_when_the_newcomer_leaves() {
    let d = dirs();
    let r = rdzv(Store::Etcd, "scale-up-off", "1:2");
    let extra = [
        "--on-scale-up",
        "checkpoint",
        "--scale-up-save-timeout",
        "5",
    ];
    let env = [
        ("CKPT_EVERY", "1000"),
        ("CKPT_STEPS", "240"),
        ("CKPT_SLEEP", "0.05"),
    ];
    let a = agent(0, &r, &d, 2, &extra, &env);
    wait_for("the first node's workers", Duration::from_secs(30), || {
        count(&events(&d), "start", |e| e["gen"] == 1) == 2
    });
    let b = agent(1, &r, &d, 2, &extra, &env);
    wait_for(
        "the scale-up checkpoint request",
        Duration::from_secs(30),
        || {
            a.stderr_so_far()
                .contains("is waiting to join (scale-up)); workers see should_save")
        },
    );
    b.signal(Signal::SIGTERM);
    let (cb, _, eb) = b.wait(Duration::from_secs(30));
    assert_eq!(cb, 143, "{eb}");
    let (ca, _, ea) = a.wait(Duration::from_secs(60));
    assert_eq!(ca, 0, "{ea}");
    assert!(
        ea.contains("the scale-up is called off, no re-form"),
        "{ea}"
    );
    assert!(!ea.contains("re-forming the group"), "{ea}");
    let evs = events(&d);
    assert_eq!(
        count(&evs, "start", |_| true),
        2,
        "only generation 1 ran: {evs:?}"
    );
    assert_eq!(count(&evs, "done", |e| e["gen"] == 1), 2);
}

/// A preemption warning whose checkpoint is not sealed yet survives a re-form (a node joined):
/// the new generation is asked again, saves, and every agent exits 5.
#[test]
fn a_preemption_request_survives_a_reform() {
    let d = dirs();
    let r = rdzv(Store::Memory, "preempt-reform", "1:2");
    let extra = ["--on-preempt", "checkpoint"];
    // Generation 1 ignores the request (so it is still pending when B arrives); later ones save.
    let env = [
        ("CKPT_EVERY", "1000"),
        ("CKPT_STEPS", "400"),
        ("CKPT_SAVE_ON_REQUEST_FROM_GEN", "2"),
    ];
    let a = agent(0, &r, &d, 1, &extra, &env);
    wait_for("the first node's worker", Duration::from_secs(30), || {
        count(&events(&d), "start", |e| e["gen"] == 1) == 1
    });
    a.signal(Signal::SIGUSR1);
    wait_for("the preemption request", Duration::from_secs(30), || {
        a.stderr_so_far()
            .contains("coordinated checkpoint requested (SIGUSR1")
    });
    let b = agent(1, &r, &d, 1, &extra, &env);
    let (ca, _, ea) = a.wait(Duration::from_secs(60));
    let (cb, _, eb) = b.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (5, 5), "A:\n{ea}\nB:\n{eb}");
    assert!(
        ea.contains("(generation 2) sealed; stopping the workers"),
        "{ea}"
    );
    let evs = events(&d);
    assert_eq!(count(&evs, "start", |e| e["gen"] == 2), 2, "{evs:?}");
    assert_eq!(
        count(&evs, "done", |_| true),
        0,
        "stopped, not finished: {evs:?}"
    );
}
