//! Launch overhead: `drun` vs `torchrun`, side by side in the same run.
//!
//! `cargo bench --bench launch` times N runs of each launcher starting 2 trivial workers
//! (`--standalone --nproc-per-node 2 --no-python true`) and prints min/median wall time and
//! the drun/torchrun ratio. torchrun comes from `$DRUN_TORCH_PYTHON`'s directory or
//! `~/.cache/drun/venv/bin/torchrun`; without it only drun is measured. `DRUN_BENCH_RUNS`
//! sets N (default 10).

mod common;
use common::torchrun;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn time_runs(label: &str, mut make: impl FnMut() -> Command, runs: usize) -> (Duration, Duration) {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut cmd = make();
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let t0 = Instant::now();
        let status = cmd.status().unwrap_or_else(|e| panic!("{label}: {e}"));
        samples.push(t0.elapsed());
        assert!(status.success(), "{label} failed: {status}");
    }
    samples.sort();
    (samples[0], samples[samples.len() / 2])
}

fn main() {
    let runs: usize = std::env::var("DRUN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let args = [
        "--standalone",
        "--nproc-per-node",
        "2",
        "--no-python",
        "true",
    ];
    let drun = env!("CARGO_BIN_EXE_drun");
    let (d_min, d_med) = time_runs(
        "drun",
        || {
            let mut c = Command::new(drun);
            c.args(args);
            c
        },
        runs,
    );
    println!("launch of 2 trivial workers, {runs} runs each");
    println!(
        "drun      min {:>8.1} ms   median {:>8.1} ms",
        d_min.as_secs_f64() * 1e3,
        d_med.as_secs_f64() * 1e3
    );
    match torchrun() {
        Some(t) => {
            let (t_min, t_med) = time_runs(
                "torchrun",
                || {
                    let mut c = Command::new(&t);
                    c.args(args);
                    c
                },
                runs,
            );
            println!(
                "torchrun  min {:>8.1} ms   median {:>8.1} ms",
                t_min.as_secs_f64() * 1e3,
                t_med.as_secs_f64() * 1e3
            );
            println!(
                "ratio drun/torchrun: median {:.3}  (torchrun is {:.1}x slower)",
                d_med.as_secs_f64() / t_med.as_secs_f64(),
                t_med.as_secs_f64() / d_med.as_secs_f64()
            );
        }
        None => println!("torchrun not found (set DRUN_TORCH_PYTHON); measured drun only"),
    }
}
