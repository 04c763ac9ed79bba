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
        if super::procs::is_stopped(Pid::from_raw(pid)) {
            // py-spy cannot attach to a stopped process and a faulthandler signal stays pending
            // (and loses to the group's SIGTERM, which kills at once); the group is stopped next.
            crate::say!("[rank {rank}] the worker (pid {pid}) is stopped (SIGSTOP, Ctrl-Z or a debugger): continuing it to dump its stacks");
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        }
        if let Some(spy) = &spy {
            let native = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .is_ok_and(|maps| wants_native(&maps));
            let mut dumped = if native {
                run_py_spy(spy, pid, true).await.map_err(|why| {
                    tracing::debug!(rank, pid, "py-spy dump --native: {why}; without it");
                })
            } else {
                Err(())
            };
            let flag = if dumped.is_ok() { "--native " } else { "" };
            if dumped.is_err() {
                dumped = run_py_spy(spy, pid, false).await.map_err(|why| {
                    tracing::warn!(rank, pid, "py-spy dump: {why}; using faulthandler")
                });
            }
            if let Ok(out) = dumped {
                crate::say!("[rank {rank}] stacks (py-spy dump {flag}--pid {pid}):");
                for line in out.lines() {
                    crate::say!("[rank {rank}] {line}");
                }
                continue;
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

/// Whether a worker whose memory maps are `maps` (`/proc/PID/maps`) is dumped with
/// `py-spy dump --native`: it has NCCL or CUDA loaded, so a hang most likely waits in a native
/// call (a collective, a kernel, a stream synchronisation) below the Python frame that made it,
/// and the native frames say which.
pub fn wants_native(maps: &str) -> bool {
    maps.lines().any(|l| {
        let file = l.rsplit('/').next().unwrap_or("");
        file.starts_with("libnccl")
            || file.starts_with("libcuda.so")
            || file.starts_with("libcudart")
    })
}

/// Why `py-spy dump` gave no stacks.
#[derive(Debug, thiserror::Error)]
enum PySpyError {
    /// It cannot be started.
    #[error("cannot run {}: {source}", path.display())]
    Spawn {
        /// The py-spy found.
        path: std::path::PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// It ran past [`PY_SPY_WAIT`] and was killed.
    #[error("timed out after {} s", PY_SPY_WAIT.as_secs())]
    TimedOut,
    /// Waiting for it failed.
    #[error("{0}")]
    Wait(#[source] std::io::Error),
    /// It failed: its status and the first line of its stderr.
    #[error("{status}: {stderr}")]
    Failed {
        /// How it exited.
        status: std::process::ExitStatus,
        /// Its stderr, on one line.
        stderr: String,
    },
}

/// `py-spy dump [--native] --pid PID`, killed after [`PY_SPY_WAIT`]; its output, or why there is none.
/// Its pipes are drained by threads while it runs, so a large dump (many threads) cannot fill
/// a pipe and block it. (Not `tokio::process`: drun reaps its children itself.)
async fn run_py_spy(spy: &std::path::Path, pid: i32, native: bool) -> Result<String, PySpyError> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(spy)
        .arg("dump")
        .args(native.then_some("--native"))
        .args(["--pid", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| PySpyError::Spawn {
            path: spy.to_path_buf(),
            source,
        })?;
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
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
                return Err(PySpyError::TimedOut);
            }
            Err(e) => return Err(PySpyError::Wait(e)),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        Err(PySpyError::Failed {
            status,
            stderr: one_line(&err),
        })
    }
}

/// Reads `pipe` to its end on a thread of its own; its text (lossy UTF-8).
fn drain(pipe: Option<impl std::io::Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text).into_owned()
    })
}

/// py-spy's error report (`Error: ...`, a `Caused by:` list, a stack backtrace) as one line:
/// the error and its causes joined by `: `, at most 300 characters.
fn one_line(report: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let mut in_causes = false;
    for line in report.lines().map(str::trim) {
        if line.is_empty() {
            continue;
        }
        if let Some(e) = line.strip_prefix("Error:") {
            parts.push(e.trim());
        } else if line == "Caused by:" {
            in_causes = true;
        } else if line.starts_with("Stack backtrace") {
            break;
        } else if in_causes {
            let cause = line
                .split_once(": ")
                .filter(|(n, _)| n.parse::<u32>().is_ok());
            parts.push(cause.map_or(line, |(_, c)| c));
        } else if parts.is_empty() {
            parts.push(line);
        }
    }
    let joined = parts.join(": ");
    match joined.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &joined[..at]),
        None => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::{one_line, wants_native};

    #[test]
    fn a_worker_with_nccl_or_cuda_loaded_is_dumped_with_native_frames() {
        let maps = |lib: &str| {
            format!(
                "7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 131 /usr/lib/x86_64-linux-gnu/libm.so.6\n\
                 7f1c2b000000-7f1c2b400000 r-xp 00000000 08:01 132 {lib}\n\
                 7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0 [stack]\n"
            )
        };
        for lib in [
            "/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
            "/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
        ] {
            assert!(wants_native(&maps(lib)), "{lib}");
        }
        for lib in [
            "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so",
            "/venv/lib/python3.11/site-packages/torch/lib/libgloo.so",
        ] {
            assert!(!wants_native(&maps(lib)), "{lib}");
        }
    }

    #[test]
    fn a_py_spy_report_becomes_one_line() {
        let report = "Error: Failed to get stack traces

Caused by:
    0: Failed to suspend process
    1: unexpected waitpid result PtraceEvent(Pid(25589), SIGSTOP, 128) to 25589

Stack backtrace:
   0: <E as anyhow::context::ext::StdError>::ext_context
   1: py_spy::python_spy::PythonSpy::get_stack_traces
";
        assert_eq!(
            one_line(report),
            "Failed to get stack traces: Failed to suspend process: unexpected waitpid result PtraceEvent(Pid(25589), SIGSTOP, 128) to 25589"
        );
        assert_eq!(
            one_line("Permission denied (os error 1)\n"),
            "Permission denied (os error 1)"
        );
        assert_eq!(one_line(&"x".repeat(400)).chars().count(), 303);
    }
}
