//! Test harness: paths, the drun binary, polling with deadlines, process checks, RAII guards.

#![allow(dead_code)]

pub mod cluster;
mod cmd;
pub mod etcd;
pub mod fake_smi;
pub mod netbed;
pub mod reference;
pub mod scrape;

pub use cmd::DrunCmd;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A stdlib-only worker script under `tests/workers/`.
pub fn worker(name: &str) -> String {
    root()
        .join("tests/workers")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The `drun` binary under test.
pub fn drun_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_drun"))
}

/// `drun` with a clean environment for the contract variables (an outer launcher's RANK etc.
/// must not leak into assertions) and agent logs at info.
pub fn drun() -> Command {
    clean_env(Command::new(drun_bin()))
}

/// `drun` for simulated node `i` of a multi-node job: 2 workers, its own loopback address
/// 127.0.0.(i+1), run id `run`, then the rendezvous flags `rdzv`.
pub fn node_cmd<S: AsRef<std::ffi::OsStr>>(
    i: usize,
    run: &str,
    nnodes: &str,
    rdzv: &[S],
) -> Command {
    let mut c = drun();
    c.job(run, nnodes).nproc(2).node(i).args(rdzv);
    c
}

/// Removes variables an outer launcher or the developer's shell may have set, so that
/// assertions about the worker environment hold anywhere.
pub fn clean_env(mut c: Command) -> Command {
    for k in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_PORT",
        "MASTER_ADDR",
        "TORCHELASTIC_ERROR_FILE",
        "OMP_NUM_THREADS",
        "RUST_LOG",
        "DRUN_LOG",
        "DRUN_LOG_FORMAT",
        // A CI runner that is itself a Kubernetes pod must not change drun's defaults.
        "KUBERNETES_SERVICE_HOST",
        "JOB_COMPLETION_INDEX",
        "VC_TASK_INDEX",
        "DRUN_TERMINATION_LOG",
        "DRUN_STATE_DIR",
        "DRUN_HOSTS_FILE",
        // Checkpoints in memory are on by default; a test that wants them off says so.
        "DRUN_CKPT_MEMORY",
    ] {
        c.env_remove(k);
    }
    c
}

/// Python with torch for end-to-end tests: `$DRUN_TORCH_PYTHON`, else the CI venv
/// `~/.cache/drun/venv/bin/python` when it exists. `None` (test skipped, with a note) only when
/// neither exists and `DRUN_REQUIRE_TORCH` is not `1`; CI sets it so a missing torch fails.
pub fn torch_python() -> Option<PathBuf> {
    let candidate = std::env::var_os("DRUN_TORCH_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/drun/venv/bin/python"))
        })
        .filter(|p| p.is_file());
    if candidate.is_none() {
        assert_ne!(
            std::env::var("DRUN_REQUIRE_TORCH").as_deref(),
            Ok("1"),
            "DRUN_REQUIRE_TORCH=1 but no torch python (set DRUN_TORCH_PYTHON or create ~/.cache/drun/venv)"
        );
        eprintln!("skipping: no torch python (set DRUN_TORCH_PYTHON)");
    }
    candidate
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; panics naming `what`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` every 20 ms until it holds (true) or `timeout` passes (false): for a caller
/// that explains the failure itself.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is alive (zombies count as dead).
pub fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let after = &s[s.rfind(')').unwrap() + 1..];
            after.split_whitespace().next() != Some("Z")
        })
        .unwrap_or(false)
}

/// Processes (other than zombies) whose environment says they belong to run `run`.
pub fn processes_of_run(run: &str) -> Vec<i32> {
    let needle = format!("DRUN_RUN_ID={run}\0").into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .map(|env| env.windows(needle.len()).any(|w| w == needle.as_slice()))
                .unwrap_or(false)
        })
        .filter(|p| alive(*p))
        .collect()
}

/// The `gen<g>_rank<r>.json` records test workers write for generation `g` (`elastic.py`,
/// `steps.py`, ...), in no particular order.
pub fn gen_records(dir: &Path, g: u64) -> Vec<serde_json::Value> {
    let prefix = format!("gen{g}_rank");
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && n.ends_with(".json")
        })
        .map(|e| read_json(&e.path()))
        .collect()
}

/// Reads a JSON file written by a worker.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// A drun agent running in the background; SIGKILLed (and reaped) on drop. Its stdout and
/// stderr are read continuously so a chatty run never blocks on a full pipe.
pub struct Agent {
    pub child: Child,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn collect(
    mut stream: impl std::io::Read + Send + 'static,
    into: Arc<Mutex<Vec<u8>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // Raw chunks, not lines: tests also look at partial lines as they appear.
        let mut buf = [0u8; 65536];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    })
}

impl Agent {
    /// Starts `cmd` with stdout/stderr captured.
    pub fn start(mut cmd: Command) -> Self {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn drun");
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), out.clone()),
            collect(child.stderr.take().unwrap(), err.clone()),
        ];
        Agent {
            child,
            out,
            err,
            readers,
        }
    }

    /// stdout captured so far.
    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// stderr captured so far.
    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig).expect("signal agent");
    }

    /// Waits for exit up to `timeout`; returns (exit code or 128+signal, stdout, stderr).
    pub fn wait(mut self, timeout: Duration) -> (i32, String, String) {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "drun did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // Readers end at EOF; a leaked descendant holding the pipe would keep them blocked, so
        // wait for them only up to the same deadline.
        for h in self.readers.drain(..) {
            while !h.is_finished() && Instant::now() < deadline + Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if h.is_finished() {
                h.join().unwrap();
            }
        }
        let out = self.stdout_so_far();
        let err = self.stderr_so_far();
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        (code, out, err)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failing test shows what each agent said.
            eprintln!(
                "--- drun pid {} stderr ---\n{}",
                self.child.id(),
                self.stderr_so_far()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // An agent killed here leaves its staging directory on the tmpfs for the next agent on
        // the machine to remove (`ckpt::memory::leftover`); a test is the last agent of its
        // own, so it removes it as that next agent would: only the directories of agents that
        // are gone, never a live one's of a test running beside it.
        if let Some(me) = drun_launcher::ckpt::memory::leftover::Owner::me() {
            drun_launcher::ckpt::memory::leftover::sweep_stages(
                std::path::Path::new("/dev/shm"),
                me,
            );
        }
    }
}

/// Runs drun to completion (bounded) and returns (code, stdout, stderr).
pub fn run(cmd: Command, timeout: Duration) -> (i32, String, String) {
    Agent::start(cmd).wait(timeout)
}

/// Polls `cond` every 50 ms for `duration`; panics naming `what` the first time it is false.
/// For asserting that something does *not* happen during a window (e.g. workers undisturbed).
pub fn holds_for(what: &str, duration: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + duration;
    while Instant::now() < end {
        assert!(cond(), "{what} stopped holding");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `check_indices.py indices` arguments for `examples/train_ddp.py --epochs 2 --global-batch 64`
/// (its dataset: 4,096 samples, seed 1234).
pub const EXAMPLE_DATA_ARGS: [&str; 8] = [
    "--dataset-len",
    "4096",
    "--seed",
    "1234",
    "--global-batch",
    "64",
    "--epochs",
    "2",
];

/// SIGTERM to every agent, then each must end as a stopped agent does (143) or cleanly (0).
pub fn stop_all(agents: Vec<Agent>) {
    for a in &agents {
        a.signal(nix::sys::signal::Signal::SIGTERM);
    }
    for a in agents {
        let (code, _, err) = a.wait(std::time::Duration::from_secs(60));
        assert!(code == 143 || code == 0, "agent ended with {code}: {err}");
    }
}
