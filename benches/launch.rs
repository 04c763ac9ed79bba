//! Launch overhead: `drun` vs `torchrun`, side by side in the same run.
//!
//! `cargo bench --bench launch` times N runs of each launcher starting 2 trivial workers
//! (`--standalone --nproc-per-node 2 --no-python true`) and prints min/median wall time and
//! the drun/torchrun ratio. torchrun comes from `$DRUN_TORCH_PYTHON`'s directory or
//! `~/.cache/drun/venv/bin/torchrun`; without it only drun is measured. `DRUN_BENCH_RUNS`
//! sets N (default 10).
//!
//! Then the cost of worker console output: the same launch with 2 workers that each write
//! 32 MB to stdout (the launcher's stdout is `/dev/null`), once in 100-byte lines and once as a
//! single line without a newline (a `\r` progress bar, a dumped blob); the median time beyond
//! the trivial launch. torchrun lets its workers write to its own stdout; drun reads their
//! output and writes whole prefixed lines.

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

/// Workers that write 32 MB each: in 100-byte lines, and as one line without a newline.
const OUTPUTS: [(&str, &str); 2] = [
    (
        "32 MB per worker in 100-byte lines",
        "yes 012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678 | head -c 32000000",
    ),
    (
        "32 MB per worker in one line",
        "head -c 32000000 /dev/zero | tr '\\0' x",
    ),
];

/// Median wall time of `runs` launches of 2 `sh -c worker` workers.
fn time_output(label: &str, launcher: &Path, worker: &str, runs: usize) -> Duration {
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let mut c = Command::new(launcher);
            c.args(["--standalone", "--nproc-per-node", "2", "--no-python"])
                .args(["sh", "-c", worker]);
            time_once(label, c)
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
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
    let torch = torchrun();
    let t_trivial = match &torch {
        Some(t) => {
            let (t_min, t_med) = time_runs("torchrun", t, runs);
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
            Some(t_med)
        }
        None => {
            println!("torchrun not found (set DRUN_TORCH_PYTHON); measured drun only");
            None
        }
    };
    println!();
    println!("worker console output: median time beyond the trivial launch, {runs} runs each");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (what, worker) in OUTPUTS {
        let d = time_output("drun", drun, worker, runs).saturating_sub(d_med);
        let t = torch
            .as_ref()
            .zip(t_trivial)
            .map(|(t, trivial)| time_output("torchrun", t, worker, runs).saturating_sub(trivial));
        match t {
            Some(t) => println!(
                "{what:<36} drun {:>8.1} ms   torchrun {:>8.1} ms",
                ms(d),
                ms(t)
            ),
            None => println!("{what:<36} drun {:>8.1} ms", ms(d)),
        }
    }
}
