//! Launch overhead: `drun` vs `torchrun`, side by side in the same run.
//!
//! `cargo bench --bench launch` times N runs of each launcher starting 2 trivial workers
//! (`--standalone --nproc-per-node 2 --no-python true`) and prints min/median wall time and
//! the drun/torchrun ratio. torchrun comes from `$DRUN_TORCH_PYTHON`'s directory or
//! `~/.cache/drun/venv/bin/torchrun`; without it only drun is measured. `DRUN_BENCH_RUNS`
//! sets N (default 10).

mod common;
use common::{runs, time_once, torchrun, LAUNCH_ARGS};

use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn time_runs(label: &str, launcher: &Path, runs: usize) -> (Duration, Duration) {
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let mut c = Command::new(launcher);
            c.args(LAUNCH_ARGS);
            time_once(label, c)
        })
        .collect();
    samples.sort();
    (samples[0], samples[samples.len() / 2])
}

fn main() {
    let runs = runs(10);
    let drun = Path::new(env!("CARGO_BIN_EXE_drun"));
    let (d_min, d_med) = time_runs("drun", drun, runs);
    println!("launch of 2 trivial workers, {runs} runs each");
    println!(
        "drun      min {:>8.1} ms   median {:>8.1} ms",
        d_min.as_secs_f64() * 1e3,
        d_med.as_secs_f64() * 1e3
    );
    match torchrun() {
        Some(t) => {
            let (t_min, t_med) = time_runs("torchrun", &t, runs);
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
