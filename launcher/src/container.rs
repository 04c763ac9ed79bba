//! drun as a container's main process: exit classes for failure policies, the termination
//! message, the restart counter on `--state-dir`.
//!
//! # Theory of operation
//!
//! In a pod drun is usually PID 1. The kernel gives PID 1 no default signal actions, so a
//! SIGTERM from the kubelet reaches drun only because the agent installs handlers for its
//! `--signals-to-handle` (it does, before any worker starts; one that arrives even earlier, while
//! the command line is validated, is noted by [`catch_early_signals`] and handled then); it
//! forwards the signal, waits
//! `--shutdown-timeout` for the workers, kills what is left, and exits 128+N. Every process
//! orphaned in the pod is re-parented to PID 1 (and, when drun is not PID 1, to drun, a child
//! subreaper): the agent reaps every exited child, workers and orphans alike
//! (`waitpid(-1)` on each SIGCHLD, [`crate::os::spawn::reap`]), so no zombie piles up.
//!
//! The kubelet sends SIGTERM and, `terminationGracePeriodSeconds` later (30 s by default),
//! SIGKILL. Inside Kubernetes (`KUBERNETES_SERVICE_HOST` set) `--shutdown-timeout` therefore
//! defaults to [`K8S_SHUTDOWN_TIMEOUT`] (25 s), leaving drun 5 s to kill stragglers, reap, and
//! write the termination message; raise both together.
//!
//! On exit drun writes [`termination_json`] (at most [`TERMINATION_LOG_MAX`] bytes, the
//! kubelet's limit) to `--termination-log PATH`, else to `/dev/termination-log` when the
//! kubelet mounted it (`terminationMessagePath`), so `kubectl describe pod` shows why.
//!
//! Exit codes, for `podFailurePolicy` (Job) and JobSet failure-policy rules ([`exit_class`]):
//!
//! | code | meaning | class |
//! |---|---|---|
//! | 0 | every worker succeeded | success |
//! | 1 | a worker failed and `--max-restarts` is spent (also: a hang, no progress) | fatal: the same error would recur |
//! | 2 | usage or configuration error, nothing started | fatal |
//! | 3 | rendezvous failed (join timeout, unreachable store, name never resolved) | retryable: infrastructure |
//! | 4 | fenced: lost membership and could not rejoin | retryable: infrastructure |
//! | 5 | preempted after a sealed coordinated checkpoint | retryable: resume from it |
//! | 6 | a GPU of this node failed its health check and the run's size is fixed | retryable: another node |
//! | 128+N | stopped by signal N (143: SIGTERM, pod deleted or evicted) | retryable |

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::AgentExit;

/// The kubelet's limit on a termination message (4096 bytes).
pub const TERMINATION_LOG_MAX: usize = 4096;

/// Where the kubelet mounts the termination message by default.
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const K8S_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// `--shutdown-timeout` inside Kubernetes: the default grace period minus 5 s.
pub const K8S_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);

/// What a failure policy should do with an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// Exit 0.
    Success,
    /// Infrastructure or preemption: run the pod again.
    Retryable,
    /// The job itself is wrong or keeps failing the same way: fail the job.
    Fatal,
}

impl ExitClass {
    /// `success`, `retryable`, `fatal`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitClass::Success => "success",
            ExitClass::Retryable => "retryable",
            ExitClass::Fatal => "fatal",
        }
    }
}

/// The class of an exit (the table in the module docs).
pub fn exit_class(exit: AgentExit) -> ExitClass {
    match exit {
        AgentExit::Success => ExitClass::Success,
        AgentExit::WorkerFailure | AgentExit::Usage => ExitClass::Fatal,
        AgentExit::Rendezvous
        | AgentExit::Fenced
        | AgentExit::Preempted
        | AgentExit::GpuUnhealthy
        | AgentExit::Signal(_) => ExitClass::Retryable,
    }
}

/// Whether drun runs inside a Kubernetes pod (the kubelet sets `KUBERNETES_SERVICE_HOST` in
/// every container unless `enableServiceLinks`-style injection is off).
pub fn in_kubernetes(env: impl Fn(&str) -> Option<String>) -> bool {
    env("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

/// Whether this process is PID 1 of its PID namespace.
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// As PID 1, notes the teardown signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT) that arrive before
/// the agent installs its handlers, so none is lost ([`crate::os::spawn::note_early_signals`]);
/// not PID 1: nothing (a signal's default action ends drun before any worker exists).
pub fn catch_early_signals() {
    use nix::sys::signal::Signal;
    if is_pid1() {
        crate::os::spawn::note_early_signals(&[
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
            Signal::SIGQUIT,
        ]);
    }
}

/// What the termination message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Termination<'a> {
    /// How drun ends.
    pub exit: AgentExit,
    /// The root cause in one line (the first failed rank, the error).
    pub reason: &'a str,
    /// Run id, if validated.
    pub run_id: Option<&'a str>,
    /// Container restarts counted on `--state-dir`, if any.
    pub restarts: Option<u64>,
}

/// The termination message: one JSON object of at most [`TERMINATION_LOG_MAX`] bytes
/// (`exit_code`, `class`, `reason`, `run_id`, `container_restarts`); a long reason is cut
/// (on a character boundary, ending in `...`).
pub fn termination_json(t: &Termination<'_>) -> String {
    let doc = |reason: &str| {
        json!({
            "exit_code": t.exit.code(),
            "class": exit_class(t.exit).as_str(),
            "reason": reason,
            "run_id": t.run_id,
            "container_restarts": t.restarts,
        })
        .to_string()
    };
    let full = doc(t.reason);
    if full.len() <= TERMINATION_LOG_MAX {
        return full;
    }
    // The longest prefix (on a character boundary) whose document fits: binary search, as
    // JSON escaping makes the document's length grow with the prefix but not in step.
    let cut = |keep: usize| {
        let mut k = keep;
        while !t.reason.is_char_boundary(k) {
            k -= 1;
        }
        doc(&format!("{}...", &t.reason[..k]))
    };
    let (mut lo, mut hi) = (0, t.reason.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if cut(mid).len() <= TERMINATION_LOG_MAX {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    cut(lo)
}

/// Writes the termination message to `explicit` (created), else to
/// [`DEFAULT_TERMINATION_LOG`] when it exists and is writable (never created: outside a pod
/// there is nothing to write). Problems are one warning, never fatal.
pub fn write_termination_log(explicit: Option<&Path>, message: &str) {
    let (path, create) = match explicit {
        Some(p) => (p.to_path_buf(), true),
        None => (PathBuf::from(DEFAULT_TERMINATION_LOG), false),
    };
    if !create && !path.exists() {
        return;
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, message.as_bytes()));
    if let Err(e) = written {
        if create {
            crate::say!(
                "drun: warning: cannot write the termination log {}: {e}",
                path.display()
            );
        }
    }
}

/// A restart counter file whose content is not a count (the content, trimmed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("holds '{0}', not a count; remove it to start counting at 0")]
pub struct CorruptCount(pub String);

/// Why this start cannot be counted on `--state-dir`: one line naming the counter file.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// The directory or the file cannot be created, read or written.
    #[error("{}: {source}", file.display())]
    Io {
        /// The counter file.
        file: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The counter file is corrupt.
    #[error("{} {source}", file.display())]
    Corrupt {
        /// The counter file.
        file: PathBuf,
        /// What it holds.
        source: CorruptCount,
    },
}

/// The restart count after `previous` (the counter file's content, `None` when absent): one
/// more than it, 0 for a first start. A corrupt file cannot be trusted to be monotonic: it is
/// an error naming the file's content.
///
/// # Errors
/// The content is not a non-negative integer.
pub fn next_restart_count(previous: Option<&str>) -> Result<u64, CorruptCount> {
    match previous.map(str::trim) {
        None => Ok(0),
        Some(s) => s
            .parse::<u64>()
            .map(|n| n.saturating_add(1))
            .map_err(|_| CorruptCount(s.to_string())),
    }
}

/// The file under `--state-dir` holding the container start count.
pub fn restart_file(dir: &Path) -> PathBuf {
    dir.join("container_restarts")
}

/// Counts this start on `--state-dir` (a volume that survives in-place container restarts,
/// e.g. an `emptyDir`): reads the counter, writes the next value atomically (temporary file,
/// fsync, rename), returns it (0: first start in this pod).
///
/// # Errors
/// The directory cannot be created or written; the counter file is corrupt.
pub fn count_restart(dir: &Path) -> Result<u64, StateDirError> {
    let file = restart_file(dir);
    let fail = |source| StateDirError::Io {
        file: file.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let previous = match std::fs::read_to_string(&file) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(fail(e)),
    };
    let next =
        next_restart_count(previous.as_deref()).map_err(|source| StateDirError::Corrupt {
            file: file.clone(),
            source,
        })?;
    let tmp = dir.join(".container_restarts.tmp");
    std::fs::write(&tmp, format!("{next}\n")).map_err(fail)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(fail)?;
    std::fs::rename(&tmp, &file).map_err(fail)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_code_has_a_class() {
        use AgentExit::*;
        let classes: Vec<(u8, &str)> = [
            Success,
            WorkerFailure,
            Usage,
            Rendezvous,
            Fenced,
            Preempted,
            Signal(15),
        ]
        .into_iter()
        .map(|e| (e.code(), exit_class(e).as_str()))
        .collect();
        assert_eq!(
            classes,
            [
                (0, "success"),
                (1, "fatal"),
                (2, "fatal"),
                (3, "retryable"),
                (4, "retryable"),
                (5, "retryable"),
                (143, "retryable")
            ]
        );
    }

    #[test]
    fn the_termination_message_fits_the_kubelets_limit() {
        let t = Termination {
            exit: AgentExit::WorkerFailure,
            reason: "rank 3 (local_rank 1) exited with 7 (pid 42)",
            run_id: Some("job-1"),
            restarts: Some(2),
        };
        let v: serde_json::Value = serde_json::from_str(&termination_json(&t)).unwrap();
        assert_eq!(v["exit_code"], 1);
        assert_eq!(v["class"], "fatal");
        assert_eq!(v["container_restarts"], 2);
        assert_eq!(v["reason"], t.reason);
        let long = "é\"".repeat(5000);
        let t = Termination { reason: &long, ..t };
        let s = termination_json(&t);
        assert!(s.len() <= TERMINATION_LOG_MAX, "{}", s.len());
        assert!(
            s.len() > TERMINATION_LOG_MAX - 16,
            "cut only as much as needed"
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        let cut = v["reason"].as_str().unwrap().strip_suffix("...").unwrap();
        assert!(long.starts_with(cut) && cut.len() > 3000, "{}", cut.len());
    }

    #[test]
    fn the_restart_counter_only_goes_up() {
        assert_eq!(next_restart_count(None), Ok(0));
        assert_eq!(next_restart_count(Some("4\n")), Ok(5));
        assert!(next_restart_count(Some("x"))
            .unwrap_err()
            .to_string()
            .contains("'x'"));
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        assert_eq!(count_restart(&state).unwrap(), 0);
        assert_eq!(count_restart(&state).unwrap(), 1);
        assert_eq!(count_restart(&state).unwrap(), 2);
        std::fs::write(restart_file(&state), "garbage").unwrap();
        assert!(count_restart(&state)
            .unwrap_err()
            .to_string()
            .contains("garbage"));
    }

    #[test]
    fn an_explicit_termination_log_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        write_termination_log(Some(&p), "{}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}");
    }
}
