//! Checkpoint ledger costs: commit and seal latency, and digest verification throughput.
//!
//! `cargo bench --bench ckpt` prints:
//! 1. ledger commit latency (one node's record that does not seal) and seal latency (the record
//!    that completes the step: shard write, completeness read, seal transaction), in-process on
//!    the in-memory store and on a real etcd (`etcd` on PATH), for 2 and 8 nodes;
//! 2. end-to-end `drun.commit()` latency seen by a Python rank through `DRUN_AGENT_SOCK`
//!    (2 local ranks, embedded store): local barrier + record + seal + manifest file;
//! 3. `--ckpt-verify digest` throughput (MB/s) on one large file and on 8 files, against
//!    `sha256sum` on the same files in the same run.
//!
//! 4. the training's stall per save (`drun.atomic_save` + `drun.commit`, and `drun.dcp.save`
//!    with gloo; 2 local ranks) with
//!    `--ckpt-memory off` and with `--ckpt-memory` on, against `torch.save` to `--ckpt-dir` plus
//!    fsync measured in the same workers, and how long the staged step took to be persisted and
//!    sealed behind the training (its manifest file appearing).
//!
//! `DRUN_BENCH_MB` sets the verification data size (default 512 MB in total);
//! `DRUN_BENCH_STALL_MB` the state per rank of 4. (default 256 MB), saved with torch when the
//! worker interpreter (`DRUN_TORCH_PYTHON`, else `python3`) has it, else as raw bytes.

mod common;
use common::Etcd;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drun_launcher::ckpt::verify::{sha256_file, verify};
use drun_launcher::ckpt::VerifyMode;
use drun_rendezvous::store::keys::RunKeys;
use drun_rendezvous::{
    assign, Candidate, Cursor, EtcdStore, Ledger, Manifest, MemoryStore, NodeCommit, Retention,
    ShardFile, Store,
};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn ledger_latency(store: Arc<dyn Store>, nodes: usize, steps: u64) -> (Duration, Duration) {
    let run = format!("bench-{nodes}");
    let keys = RunKeys::new(&run);
    let cands: Vec<Candidate> = (0..nodes)
        .map(|i| Candidate {
            node_id: format!("n{i:03}"),
            advertise_addr: "127.0.0.1".into(),
            slots: 8,
            requested_node_rank: None,
            master_port: 1,
            probe_port: 0,
        })
        .collect();
    let plan = assign(&run, 1, &cands, 0, 0).unwrap();
    store
        .put(&keys.gen_current(), b"1".to_vec(), None)
        .await
        .unwrap();
    let lease = store.lease_grant(Duration::from_secs(60)).await.unwrap();
    for c in &cands {
        store
            .put(&keys.member(1, &c.node_id), b"{}".to_vec(), Some(lease))
            .await
            .unwrap();
    }
    let ledger = Ledger::new(store, &run);
    let (mut commit, mut seal) = (Vec::new(), Vec::new());
    for step in 1..=steps {
        for (i, m) in plan.members.iter().enumerate() {
            let rec = NodeCommit {
                node_id: m.node_id.clone(),
                generation: 1,
                step,
                ranks: (m.base_rank..m.base_rank + m.slots).collect(),
                cursor: Cursor {
                    consumed_in_epoch: step * 512,
                    ..Cursor::default()
                },
                files: (m.base_rank..m.base_rank + m.slots)
                    .map(|r| ShardFile {
                        rank: r,
                        path: format!("/ckpt/step-{step}/rank{r}.pt"),
                        bytes: 1 << 30,
                        sha256: "0".repeat(64),
                    })
                    .collect(),
                save_started_ms: None,
                staged_ms: None,
            };
            let t = Instant::now();
            ledger
                .commit(
                    &plan,
                    &rec,
                    Retention {
                        keep_last: 3,
                        keep_every: 0,
                    },
                )
                .await
                .unwrap();
            if i + 1 == plan.members.len() {
                seal.push(t.elapsed());
            } else {
                commit.push(t.elapsed());
            }
        }
    }
    (median(commit), median(seal))
}

fn e2e_commit_latency() -> Option<f64> {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("w.py");
    let helper = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    std::fs::write(
        &script,
        format!(
            r#"import os, sys, time, json
sys.path.insert(0, {helper:?})
import drun
lat = []
for step in range(1, 101):
    p = drun.shard_path(step)
    drun.atomic_save(p, lambda f: f.write(b"x" * 65536))
    t = time.perf_counter()
    drun.commit(step, [p], {{"epoch": 0, "consumed_in_epoch": step * 64}})
    lat.append(time.perf_counter() - t)
lat.sort()
if os.environ["RANK"] == "0":
    print(json.dumps({{"median_ms": lat[len(lat) // 2] * 1e3}}))
"#
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_drun"))
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "-q",
            "--ckpt-keep-last",
            "2",
            "--ckpt-dir",
        ])
        .arg(dir.path().join("ckpt"))
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("median_ms"))?;
    let json = &line[line.find('{')?..];
    serde_json::from_str::<serde_json::Value>(json).ok()?["median_ms"].as_f64()
}

/// Medians over a run's saves, seconds: (torch.save + fsync to --ckpt-dir, drun's save and
/// commit, the staged step's persistence lag or 0), and what was saved.
fn save_stall(mb: u64, memory: &str, path: &str) -> Option<(f64, f64, f64, String)> {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("w.py");
    let helper = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    std::fs::write(
        &script,
        format!(
            r#"import json, os, sys, time
sys.path.insert(0, {helper:?})
import drun
mb, saves, how = {mb}, 4, {path:?}
try:
    import torch
    state = {{"w": torch.randn(mb * (1 << 18))}}
    dump, kind = (lambda f: torch.save(state, f)), "torch.save"
except ImportError:
    if how == "dcp":
        sys.exit(0)
    blob = os.urandom(mb << 20)
    dump, kind = (lambda f: f.write(blob)), "bytes"
if how == "dcp":
    import torch.distributed as dist
    import drun.dcp
    dist.init_process_group("gloo")
rank, gen = int(os.environ["RANK"]), int(os.environ["DRUN_GENERATION"])
base, ours, lag = [], [], []
for step in range(1, saves + 1):
    p = os.path.join(os.environ["DRUN_CKPT_DIR"], "baseline-%d.pt" % rank)
    t = time.perf_counter()
    with open(p, "wb") as f:
        dump(f)
        f.flush()
        os.fsync(f.fileno())
    base.append(time.perf_counter() - t)
    os.unlink(p)
    path = drun.shard_path(step)
    t = time.perf_counter()
    if how == "dcp":
        drun.dcp.save(state, step)
    else:
        drun.atomic_save(path, dump)
        drun.commit(step, [path])
    done = time.perf_counter()
    ours.append(done - t)
    manifest = os.path.join(os.path.dirname(path), "drun-manifest-%d-%d.json" % (step, gen))
    while not os.path.exists(manifest) and time.perf_counter() - done < 120:
        time.sleep(0.005)
    lag.append(time.perf_counter() - done)
med = lambda v: sorted(v)[len(v) // 2]
if rank == 0:
    print(json.dumps({{"base": med(base), "ours": med(ours), "lag": med(lag), "kind": kind}}))
"#
        ),
    )
    .unwrap();
    let python = std::env::var("DRUN_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(env!("CARGO_BIN_EXE_drun"))
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "-q",
            "--python",
            &python,
        ])
        .args([
            "--ckpt-keep-last",
            "1",
            "--ckpt-memory",
            memory,
            "--ckpt-dir",
        ])
        .arg(dir.path().join("ckpt"))
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("\"base\""))?;
    let v: serde_json::Value = serde_json::from_str(&line[line.find('{')?..]).ok()?;
    Some((
        v["base"].as_f64()?,
        v["ours"].as_f64()?,
        v["lag"].as_f64()?,
        v["kind"].as_str()?.to_string(),
    ))
}

fn verify_throughput(total_mb: u64) {
    let dir = tempfile::tempdir().unwrap();
    for (label, files) in [("1 file", 1u64), ("8 files", 8)] {
        let each = total_mb * (1 << 20) / files;
        let mut shards = Vec::new();
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 31 % 251) as u8).collect();
        for r in 0..files {
            let p = dir
                .path()
                .join(format!("{label}-{r}.bin").replace(' ', "_"));
            let mut f = std::fs::File::create(&p).unwrap();
            let mut left = each;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                std::io::Write::write_all(&mut f, &chunk[..n]).unwrap();
                left -= n as u64;
            }
            drop(f);
            let (sha256, bytes) = sha256_file(&p).unwrap(); // also warms the page cache
            shards.push(ShardFile {
                rank: r as u32,
                path: p.display().to_string(),
                bytes,
                sha256,
            });
        }
        let m = Manifest {
            run_id: "bench".into(),
            step: 1,
            generation: 1,
            world_size: files as u32,
            cursor: Cursor::default(),
            files: shards.clone(),
            sealed_at_ms: 0,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        };
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let t = Instant::now();
        verify(&m, VerifyMode::Digest, threads).expect("verifies");
        let ours = t.elapsed();
        let t = Instant::now();
        let ok = Command::new("sha256sum")
            .args(shards.iter().map(|s| &s.path))
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let theirs = t.elapsed();
        let mb = (each * files) as f64 / 1e6;
        let ours_mbs = mb / ours.as_secs_f64();
        if ok {
            let theirs_mbs = mb / theirs.as_secs_f64();
            println!(
                "  {label:8} {mb:7.0} MB: drun digest {ours_mbs:7.0} MB/s, sha256sum {theirs_mbs:7.0} MB/s, ratio {:.2}",
                ours_mbs / theirs_mbs
            );
        } else {
            println!("  {label:8} {mb:7.0} MB: drun digest {ours_mbs:7.0} MB/s (no sha256sum)");
        }
        for s in &shards {
            let _ = std::fs::remove_file(&s.path);
        }
    }
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!(
        "ledger latency (median; commit = a record that does not seal, seal = the one that does)"
    );
    for nodes in [2, 8] {
        let (c, s) = rt.block_on(ledger_latency(Arc::new(MemoryStore::new()), nodes, 50));
        println!(
            "  memory {nodes} nodes x 8 ranks: commit {:.3} ms, seal {:.3} ms",
            ms(c),
            ms(s)
        );
    }
    let etcd = std::panic::catch_unwind(Etcd::start).ok();
    match &etcd {
        Some(e) => {
            for nodes in [2, 8] {
                let (c, s) = rt.block_on(async {
                    let store = EtcdStore::connect(std::slice::from_ref(&e.endpoint))
                        .await
                        .unwrap();
                    ledger_latency(Arc::new(store), nodes, 50).await
                });
                println!(
                    "  etcd   {nodes} nodes x 8 ranks: commit {:.3} ms, seal {:.3} ms",
                    ms(c),
                    ms(s)
                );
            }
        }
        None => println!("  etcd: not measured (no etcd on PATH)"),
    }
    match e2e_commit_latency() {
        Some(v) => println!(
            "drun.commit() seen by a rank (2 local ranks, embedded store, 64 KiB files): median {v:.2} ms"
        ),
        None => println!("drun.commit() end to end: not measured (python3 missing?)"),
    }
    let stall_mb: u64 = std::env::var("DRUN_BENCH_STALL_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    println!(
        "the training's stall per save, {stall_mb} MB per rank, 2 local ranks (median of 4 saves)"
    );
    for (path, memory) in [
        ("atomic", "off"),
        ("atomic", "4G"),
        ("dcp", "off"),
        ("dcp", "4G"),
    ] {
        let call = if path == "dcp" {
            "drun.dcp.save"
        } else {
            "drun.atomic_save+commit"
        };
        match save_stall(stall_mb, memory, path) {
            Some((base, ours, lag, kind)) => println!(
                "  --ckpt-memory {memory:3}: {call} {:.3} s, {kind} + fsync to --ckpt-dir {:.3} s (same run), ratio {:.2}; sealed {:.3} s after the save returned",
                ours,
                base,
                ours / base,
                lag
            ),
            None => println!("  --ckpt-memory {memory}: {call} not measured (python3 or torch missing?)"),
        }
    }
    let total_mb: u64 = std::env::var("DRUN_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    println!("--ckpt-verify digest throughput (files in page cache), same files as sha256sum");
    verify_throughput(total_mb);
}
