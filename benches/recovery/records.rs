//! The workers' timing records and the polling helpers of the recovery benchmark.

use std::path::Path;
use std::time::{Duration, Instant};

/// One worker's record, written by `benches/workers/recovery.py`.
pub(super) struct Rec {
    pub(super) rank: u64,
    pub(super) world: u64,
    pub(super) start_ns: u128,
    pub(super) imported_ns: Option<u128>,
    pub(super) init_ns: Option<u128>,
    pub(super) ready_ns: Option<u128>,
    pub(super) exit_ns: Option<u128>,
    /// Its latest step (with `RECOVERY_STEPS=1`).
    pub(super) last_ns: Option<u128>,
}

/// Every `*.json` record in `dir` that parses, with its path (one still being written is
/// skipped).
pub(super) fn json_records(dir: &Path) -> Vec<(std::path::PathBuf, serde_json::Value)> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("json"))
        .filter_map(|p| {
            let v = serde_json::from_str(&std::fs::read_to_string(&p).ok()?).ok()?;
            Some((p, v))
        })
        .collect()
}

pub(super) fn records(dir: &Path) -> Vec<Rec> {
    let mut out = Vec::new();
    for (_, v) in json_records(dir) {
        let ns = |k: &str| v[k].as_u64().map(u128::from);
        let (Some(rank), Some(world), Some(start_ns)) =
            (v["rank"].as_u64(), v["world"].as_u64(), ns("start_ns"))
        else {
            continue;
        };
        out.push(Rec {
            rank,
            world,
            start_ns,
            imported_ns: ns("imported_ns"),
            init_ns: ns("init_ns"),
            ready_ns: ns("ready_ns"),
            exit_ns: ns("exit_ns"),
            last_ns: ns("last_ns"),
        });
    }
    out
}

/// When every rank 0..world of a world-`world` group started after `t0` reached its first
/// all_reduce: (latest start, latest first all_reduce) in ns after `t0`. Per rank the worker
/// that got there first counts.
pub(super) fn group_ready(recs: &[Rec], t0: u128, world: u64) -> Option<(u128, u128)> {
    let (mut started, mut ready) = (0, 0);
    for r in picked(recs, t0, world)? {
        started = started.max(r.start_ns - t0);
        ready = ready.max(r.ready_ns? - t0);
    }
    Some((started, ready))
}

/// Per rank 0..world of a world-`world` group started after `t0`, the worker that reached its
/// first all_reduce first; `None` until every rank has one.
fn picked(recs: &[Rec], t0: u128, world: u64) -> Option<Vec<&Rec>> {
    (0..world)
        .map(|rank| {
            recs.iter()
                .filter(|r| r.rank == rank && r.world == world && r.start_ns > t0)
                .filter(|r| r.ready_ns.is_some())
                .min_by_key(|r| r.ready_ns)
        })
        .collect()
}

/// Where the seconds of a group's start after `t0` went, as [`group_ready`] picks its workers:
/// until the last worker started (detect, decide, stop, spawn), then until the last had imported
/// torch, then until the last had joined the process group (`init_process_group`), then until
/// the last finished its first all_reduce. `None` as for [`group_ready`].
pub(super) fn group_phases(recs: &[Rec], t0: u128, world: u64) -> Option<[f64; 4]> {
    let mut at = [0u128; 4];
    for r in picked(recs, t0, world)? {
        let ready = r.ready_ns?;
        let times = [
            r.start_ns,
            r.imported_ns.unwrap_or(r.start_ns),
            r.init_ns.unwrap_or(ready),
            ready,
        ];
        for (a, t) in at.iter_mut().zip(times) {
            *a = (*a).max(t - t0);
        }
    }
    let s = |ns: u128| ns as f64 / 1e9;
    Some([
        s(at[0]),
        s(at[1].saturating_sub(at[0])),
        s(at[2].saturating_sub(at[1])),
        s(at[3].saturating_sub(at[2])),
    ])
}

pub(super) fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn log_tails(logs: &Path, n: usize) {
    for i in 0..n {
        let text = std::fs::read_to_string(logs.join(format!("agent{i}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("  --- agent {i} log (last 20 lines) ---");
        for l in &lines[lines.len().saturating_sub(20)..] {
            eprintln!("  {l}");
        }
    }
}
