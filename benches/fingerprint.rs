//! The environment fingerprint's cost at an agent's start (`--env-check`): the worker
//! interpreter's probe cold (an interpreter start) and cached (a few `stat`s), and the whole
//! fingerprint with a cached probe (what a restarted agent pays; target < 50 ms).
//!
//! `cargo bench --bench fingerprint`. The interpreter is torch's (`$DRUN_TORCH_PYTHON` or
//! `~/.cache/drun/venv/bin/python`), else `python3`. The cache lives in a temporary
//! `XDG_CACHE_HOME`. `DRUN_BENCH_RUNS` sets the cached runs (default 20). Includes `nvidia-smi`
//! when it is installed.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use drun_launcher::fingerprint::{self, probe};
use drun_launcher::{Args, LaunchConfig};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs = common::runs(20);
    let python = common::torch_python().unwrap_or_else(|| PathBuf::from("python3"));
    let cache = tempfile::tempdir().unwrap();
    let mut env: BTreeMap<String, String> = std::env::vars().collect();
    env.insert(
        "XDG_CACHE_HOME".into(),
        cache.path().to_string_lossy().into_owned(),
    );
    let t = Instant::now();
    let values = probe::python_versions(&python, &env);
    let cold = t.elapsed();
    let cached = median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                assert_eq!(probe::python_versions(&python, &env), values);
                t.elapsed()
            })
            .collect(),
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/workers/recovery.py");
    let args = Args::parse_from([
        "drun",
        "--standalone",
        "--python",
        python.to_str().expect("utf-8 interpreter path"),
        script,
    ]);
    let cfg = LaunchConfig::from_args(&args).expect("bench config is valid");
    let whole = median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                let f = fingerprint::collect(&cfg, &env);
                assert!(f.contains_key("config.script-sha256"));
                t.elapsed()
            })
            .collect(),
    );
    println!("environment fingerprint of {}", python.display());
    println!("  probed: {values:?}");
    println!("  probe cold (interpreter start)   {:>9.3} ms", ms(cold));
    println!(
        "  probe cached, median of {runs:<3}     {:>9.3} ms",
        ms(cached)
    );
    println!(
        "  whole fingerprint, cached probe  {:>9.3} ms   (target < 50 ms; GPU keys: {})",
        ms(whole),
        fingerprint::collect(&cfg, &env)
            .get("gpu")
            .map_or("none", String::as_str)
    );
}
