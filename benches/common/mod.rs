//! Helpers shared by the benchmarks.
#![allow(dead_code)] // each bench uses a different part

pub mod cpus;
pub mod procs;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `$DRUN_BENCH_RUNS`, else `default`.
pub fn runs(default: usize) -> usize {
    std::env::var("DRUN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Wall-clock time in ns since the epoch (workers write the same clock).
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Python with torch: `$DRUN_TORCH_PYTHON` or `~/.cache/drun/venv/bin/python`.
pub fn torch_python() -> Option<PathBuf> {
    std::env::var_os("DRUN_TORCH_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/drun/venv/bin/python"))
        })
        .filter(|p| p.is_file())
}

/// torchrun from `$DRUN_TORCH_PYTHON`'s directory or `~/.cache/drun/venv/bin/torchrun`.
pub fn torchrun() -> Option<PathBuf> {
    std::env::var_os("DRUN_TORCH_PYTHON")
        .map(|p| PathBuf::from(p).with_file_name("torchrun"))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/drun/venv/bin/torchrun"))
        })
        .filter(|p| p.is_file())
}

// The tests' etcd start-up, shared rather than copied.
#[path = "../../tests/harness/etcd.rs"]
mod etcd;
#[allow(unused_imports)] // each bench uses a different part
pub use etcd::{free_port, http_get as etcd_http_get, Etcd};

/// A `drun-rendezvous serve` process on a free loopback port, killed on drop.
pub struct RdzvServer(Child, pub String);

impl RdzvServer {
    /// The server's process id.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.0.id() as i32)
    }

    /// Starts a server with `store_args` (e.g. `["--store", "memory"]`); returns once it
    /// printed its endpoint.
    pub fn start(store_args: &[&str]) -> RdzvServer {
        RdzvServer::start_as("127.0.0.1:0", store_args, |c| c)
    }

    /// Starts a server listening on `listen` with `store_args`, its command passed through
    /// `wrap` first (e.g. to run it on a host of a network bed).
    pub fn start_as(
        listen: &str,
        store_args: &[&str],
        wrap: impl FnOnce(Command) -> Command,
    ) -> RdzvServer {
        // `DRUN_BENCH_RDZV_BIN`: another build's server (e.g. the base commit's, to compare
        // under the same load).
        let bin = std::env::var_os("DRUN_BENCH_RDZV_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_drun-rendezvous").into());
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--listen", listen])
            .args(store_args)
            .env(
                "DRUN_LOG",
                std::env::var("DRUN_BENCH_SERVER_LOG").unwrap_or("warn".into()),
            );
        let mut child = wrap(cmd)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start drun-rendezvous");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = line
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("drun-rendezvous did not start: {line:?}"))
            .to_string();
        RdzvServer(child, endpoint)
    }
}

impl Drop for RdzvServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion with its output discarded; its wall time. Panics if it fails.
pub fn time_once(label: &str, mut cmd: Command) -> Duration {
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let t0 = Instant::now();
    let status = cmd.status().unwrap_or_else(|e| panic!("{label}: {e}"));
    let took = t0.elapsed();
    assert!(status.success(), "{label} failed: {status}");
    took
}

/// The arguments of the launch benchmark: 2 trivial workers, standalone.
pub const LAUNCH_ARGS: [&str; 5] = [
    "--standalone",
    "--nproc-per-node",
    "2",
    "--no-python",
    "true",
];

/// Worker of the rendezvous measurement: writes its start time in ns to `$0/$RANK`.
pub const STAMP_WORKER: &str = "date +%s%N > \"$0/$RANK\"";

/// Starts N launchers built by `make(i)`; returns seconds from the last start to the last
/// worker start (workers run [`STAMP_WORKER`] with `dir`).
pub fn rendezvous_time(n: usize, dir: &Path, mut make: impl FnMut(usize) -> Command) -> f64 {
    let mut children: Vec<Child> = Vec::new();
    let mut last_start = 0;
    for i in 0..n {
        let mut c = make(i);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        children.push(c.spawn().expect("start launcher"));
        last_start = now_ns();
    }
    for mut c in children {
        let st = c.wait().unwrap();
        assert!(st.success(), "a launcher failed: {st}");
    }
    let last_worker = (0..n)
        .map(|r| {
            std::fs::read_to_string(dir.join(r.to_string()))
                .unwrap()
                .trim()
                .parse::<u128>()
                .unwrap()
        })
        .max()
        .unwrap();
    (last_worker.saturating_sub(last_start)) as f64 / 1e9
}

/// drun agent `i` of `n` (1 [`STAMP_WORKER`] each, address 127.0.0.(i+1)) through the
/// `drun-rendezvous` server at `endpoint`.
pub fn rendezvous_drun(n: usize, i: usize, endpoint: &str, id: &str, dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_drun"));
    c.args([
        "-q",
        "--nnodes",
        &n.to_string(),
        "--rdzv-endpoint",
        endpoint,
    ])
    .args(["--rdzv-id", id])
    .arg("--local-addr")
    .arg(format!("127.0.0.{}", i + 1))
    .args(["--no-python", "sh", "-c", STAMP_WORKER])
    .arg(dir);
    c
}

/// torchrun agent (1 [`STAMP_WORKER`]) of `n`, c10d backend on 127.0.0.1:`port`.
pub fn rendezvous_torchrun(torchrun: &Path, n: usize, port: u16, id: &str, dir: &Path) -> Command {
    let mut c = Command::new(torchrun);
    c.args(["--nnodes", &n.to_string(), "--nproc-per-node", "1"])
        .args(["--rdzv-backend", "c10d"])
        .args(["--rdzv-endpoint", &format!("127.0.0.1:{port}")])
        .args(["--rdzv-id", id])
        .args(["--no-python", "sh", "-c", STAMP_WORKER])
        .arg(dir);
    c
}
