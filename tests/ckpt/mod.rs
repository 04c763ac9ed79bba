//! The checkpoint ledger end to end: real agents, real workers committing real files through
//! `DRUN_AGENT_SOCK`, on the in-memory store and on etcd (docs/architecture.md §4).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::{alive, drun, read_json, wait_for, worker, Agent, DrunCmd};

mod adoption;
mod dcp;
mod frameworks;
mod hang;
mod integrity;
mod interval;
mod memory;
mod replicas;
mod samples;
mod scale_up;

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
    rdzv_with_last_call(store, run, nnodes, "0.5")
}

/// [`rdzv`] with a last call of `last_call` seconds: with a minimum below the maximum, the
/// time within which every agent the test starts must have joined for them to form the first
/// generation together (a full group forms at once whatever it is).
fn rdzv_with_last_call(store: Store, run: &str, nnodes: &str, last_call: &str) -> Rdzv {
    let conf = format!("lease_ttl={TTL},last_call_timeout={last_call}");
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

/// The newest generation any worker event was logged in.
fn last_gen(evs: &[Value]) -> u64 {
    evs.iter()
        .map(|e| e["gen"].as_u64().unwrap())
        .max()
        .unwrap()
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

/// `--ckpt-memory`'s end state: every sealed manifest's files are on disk with their recorded
/// sizes, no temporary file of the persister is left in `--ckpt-dir`, and the agent's staging
/// directories under `stage` went with it. Returns the sealed steps, oldest first.
fn assert_all_persisted(d: &Dirs, stage: &Path) -> Vec<u64> {
    let all = files_under(&d.ckpt);
    let mut steps = Vec::new();
    for f in all.iter().filter(|f| {
        f.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("drun-manifest-"))
    }) {
        let m = read_json(f);
        for file in m["files"].as_array().unwrap() {
            let p = file["path"].as_str().unwrap();
            let len = std::fs::metadata(p).map(|m| m.len());
            assert_eq!(
                len.ok(),
                file["bytes"].as_u64(),
                "{p} of sealed step {} is on disk with its size",
                m["step"]
            );
        }
        steps.push(m["step"].as_u64().unwrap());
    }
    steps.sort_unstable();
    let temps: Vec<&PathBuf> = all
        .iter()
        .filter(|f| f.to_string_lossy().contains(".drun-persist-"))
        .collect();
    assert!(temps.is_empty(), "no temporary file is left: {temps:?}");
    let left: Vec<PathBuf> = std::fs::read_dir(stage)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "the staging directory goes with the agent: {left:?}"
    );
    steps
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

// --- The torch example under drun (used by several topics) -----------------------------------

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

/// An agent on loopback address 127.0.0.(i+1) running `examples/train_ddp.py` with 2 workers,
/// `EXAMPLE_ARGS`, more drun flags and more training arguments (which win over `EXAMPLE_ARGS`:
/// argparse keeps the last).
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

/// `examples/train_ddp.py` without faults on one node of 2 workers, `EXAMPLE_ARGS` without the
/// step sleep; its `final.pt`, trained once per nextest run for every test that compares with
/// it (how often a run checkpoints does not change its model). Without warm workers: nothing
/// restarts, so waiting interpreters would import torch for nothing.
fn example_reference(python: &Path) -> PathBuf {
    example_reference_with(python, 2, &[])
}

/// [`example_reference`] at `ranks` workers with more training arguments (`train_extra`, which
/// win over `EXAMPLE_ARGS`), trained once per nextest run for each set of both.
fn example_reference_with(python: &Path, ranks: usize, train_extra: &[&str]) -> PathBuf {
    let mut name = format!("train-ddp-{ranks}-ranks");
    for a in train_extra {
        name.push('-');
        name.push_str(a.trim_start_matches('-'));
    }
    let dir = crate::harness::reference::shared(&name, |dir| {
        let mut c = drun();
        c.python(python)
            .args(["--standalone", "--nproc-per-node"])
            .arg(ranks.to_string())
            .args(["--warm-workers", "off"])
            .arg("--ckpt-dir")
            .arg(dir.join("ckpt"))
            .arg(crate::harness::root().join("examples/train_ddp.py"))
            .args(EXAMPLE_ARGS)
            .args(train_extra)
            .args(["--step-sleep", "0", "--out"])
            .arg(dir.join("clean"));
        let (code, _, err) = crate::harness::run(c, Duration::from_secs(240));
        assert_eq!(code, 0, "fault-free run:\n{err}");
    });
    dir.join("clean/final.pt")
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

/// The one line an agent printed about a checkpoint that failed verification (asserts there is
/// exactly one, and that it says it falls back).
pub fn fallback_line(err: &str) -> &str {
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("drun: ") && l.contains("failed verification"))
        .collect();
    assert_eq!(lines.len(), 1, "said once, in one line:\n{err}");
    assert!(
        lines[0].ends_with("falling back to the newest earlier checkpoint that verifies, if any"),
        "{}",
        lines[0]
    );
    lines[0]
}
