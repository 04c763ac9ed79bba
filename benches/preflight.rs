//! What `--preflight` adds to a 4-rank CPU job, next to the same job under torchrun.
//!
//! `cargo bench --bench preflight` runs, round by round (interleaved, so load drifts hit every
//! variant alike), a torch gloo job of 4 ranks doing one `all_reduce`
//! (`benches/workers/allreduce_once.py`):
//! - torchrun `--standalone --nproc-per-node 4`;
//! - drun `--standalone --nproc-per-node 4`, without and with `--preflight`;
//! - drun on 2 agents × 2 workers (loopback, a memory-store `drun-rendezvous`), without and
//!   with `--preflight` (which then also measures the 2 ring links).
//!
//! It prints each variant's median wall time, what the check added (median with − median
//! without) and the check's own time as drun reports it. `DRUN_BENCH_RUNS` sets the rounds
//! (default 5); needs `$DRUN_TORCH_PYTHON` or `~/.cache/drun/venv`.

mod common;
use common::{runs, torch_python, torchrun, RdzvServer};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/workers/allreduce_once.py")
}

fn drun() -> Command {
    Command::new(env!("CARGO_BIN_EXE_drun"))
}

/// Runs `cmds` together; the wall time until the last exits, and their stderr.
fn time_all(label: &str, cmds: Vec<Command>) -> (Duration, String) {
    let t0 = Instant::now();
    let children: Vec<_> = cmds
        .into_iter()
        .map(|mut c| {
            c.stdout(Stdio::null()).stderr(Stdio::piped());
            c.spawn().unwrap_or_else(|e| panic!("{label}: {e}"))
        })
        .collect();
    let mut err = String::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        err.push_str(&String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{label} failed:\n{err}");
    }
    (t0.elapsed(), err)
}

/// The check's own time, from node rank 0's "preflight: ... in X s" line.
fn reported(err: &str) -> Option<f64> {
    let line = err
        .lines()
        .find(|l| l.contains("preflight: ") && l.contains(" in "))?;
    let tail = line.rsplit(" in ").next()?;
    tail.split_whitespace().next()?.parse().ok()
}

fn standalone(python: &Path, preflight: bool) -> Vec<Command> {
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "4", "--python"])
        .arg(python);
    if preflight {
        c.arg("--preflight");
    }
    c.arg(worker());
    vec![c]
}

fn two_nodes(python: &Path, endpoint: &str, run: &str, preflight: bool) -> Vec<Command> {
    (0..2)
        .map(|i| {
            let mut c = drun();
            c.args([
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "drun",
            ])
            .args(["--rdzv-endpoint", endpoint, "--rdzv-id", run])
            .args(["--node-rank", &i.to_string()])
            .arg("--local-addr")
            .arg(format!("127.0.0.{}", i + 1))
            .arg("--python")
            .arg(python);
            if preflight {
                c.arg("--preflight");
            }
            c.arg(worker());
            c
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let Some(python) = torch_python() else {
        println!("no torch python (set DRUN_TORCH_PYTHON); nothing measured");
        return;
    };
    let rounds = runs(5);
    let server = RdzvServer::start(&["--store", "memory"]);
    let names = [
        "torchrun, 4 ranks",
        "drun, 4 ranks",
        "drun --preflight, 4 ranks",
        "drun, 2 nodes x 2",
        "drun --preflight, 2 nodes x 2",
    ];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut own: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let torchrun = torchrun();
    for round in 0..rounds {
        for (v, name) in names.iter().enumerate() {
            let cmds = match v {
                0 => match &torchrun {
                    Some(t) => {
                        let mut c = Command::new(t);
                        c.args(["--standalone", "--nproc-per-node", "4"])
                            .arg(worker());
                        vec![c]
                    }
                    None => continue,
                },
                1 | 2 => standalone(&python, v == 2),
                _ => two_nodes(&python, &server.1, &format!("pf-{round}-{v}"), v == 4),
            };
            let (took, err) = time_all(name, cmds);
            wall[v].push(took.as_secs_f64());
            if let Some(s) = reported(&err) {
                own[v].push(s);
            }
        }
    }
    println!("4-rank CPU (gloo) job, one all_reduce; {rounds} rounds, medians of wall time");
    for (v, name) in names.iter().enumerate() {
        if wall[v].is_empty() {
            println!("{name:<32} (torchrun not found)");
            continue;
        }
        let check = if own[v].is_empty() {
            String::new()
        } else {
            format!("   (the check itself: {:.2} s)", median(own[v].clone()))
        };
        println!("{name:<32} {:>7.2} s{check}", median(wall[v].clone()));
    }
    let added =
        |with: usize, without: usize| median(wall[with].clone()) - median(wall[without].clone());
    println!("--preflight adds, 1 node:   {:+.2} s", added(2, 1));
    println!("--preflight adds, 2 nodes:  {:+.2} s", added(4, 3));
    if !wall[0].is_empty() {
        println!(
            "ratio drun --preflight / torchrun (4 ranks): {:.2}",
            median(wall[2].clone()) / median(wall[0].clone())
        );
    }
}
