//! Dumping the Python stacks of stuck workers (hang detection): `py-spy dump --pid` when
//! `py-spy` is on PATH (bounded by [`PY_SPY_WAIT`]), else the faulthandler signal the worker
//! registered on its first step beacon, whose dump reaches drun's output through the worker's
//! stderr.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long one `py-spy dump` may take.
pub const PY_SPY_WAIT: Duration = Duration::from_secs(10);
/// How long the workers' stderr gets to carry a faulthandler dump to drun's output.
pub const FAULTHANDLER_WAIT: Duration = Duration::from_secs(1);

/// `py-spy` on PATH, if any.
fn py_spy() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("py-spy"))
        .find(|p| p.is_file())
}

/// Dumps the stacks of `ranks` (global rank, pid): each line is printed with a rank prefix
/// (py-spy), or the workers print them (faulthandler on `signal`).
pub async fn dump(ranks: &[(u32, i32)], signal: Signal) {
    let spy = py_spy();
    let mut signalled = false;
    for &(rank, pid) in ranks {
        if let Some(spy) = &spy {
            match run_py_spy(spy, pid).await {
                Ok(out) => {
                    crate::say!("[rank {rank}] stacks (py-spy dump --pid {pid}):");
                    for line in out.lines() {
                        crate::say!("[rank {rank}] {line}");
                    }
                    continue;
                }
                Err(why) => tracing::warn!(rank, pid, "py-spy dump: {why}; using faulthandler"),
            }
        }
        // ESRCH: the worker is gone already; nothing to dump.
        let _ = kill(Pid::from_raw(pid), signal);
        signalled = true;
    }
    if signalled {
        tokio::time::sleep(FAULTHANDLER_WAIT).await;
    }
}

/// `py-spy dump --pid PID`, killed after [`PY_SPY_WAIT`]; its output, or why there is none.
async fn run_py_spy(spy: &std::path::Path, pid: i32) -> Result<String, String> {
    use std::io::Read as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(spy)
        .args(["dump", "--pid", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", spy.display()))?;
    let deadline = tokio::time::Instant::now() + PY_SPY_WAIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {} s", PY_SPY_WAIT.as_secs()));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{status}: {}", err.trim()))
    }
}
