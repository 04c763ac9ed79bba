//! The failure summary and the root-cause error file.
//!
//! Shape copied from torchrun's `ChildFailedError.format_msg`
//! (`torch/distributed/elastic/multiprocessing/errors/__init__.py`) because people grep for it:
//! a `=` border, `<script> FAILED`, `Failures:`, `Root Cause (first observed failure):` with
//! time, host, rank (local_rank), exitcode (pid), error_file and traceback. The root cause is the
//! failure with the earliest timestamp (the error file's, else when drun saw the exit). Unlike
//! torchrun, siblings that drun itself stopped are not listed as failures, other failures take
//! one line each, and when the worker wrote no error file the traceback is the tail of its stderr.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drun_rendezvous::decisions::root_cause::{self, RootCause};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::os::spawn::ExitKind;

/// One failed worker.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Global rank.
    pub rank: u32,
    /// Local rank.
    pub local_rank: u32,
    /// Process id.
    pub pid: i32,
    /// How it ended.
    pub exit: ExitKind,
    /// When drun observed the exit.
    pub observed_at: SystemTime,
    /// Its TORCHELASTIC_ERROR_FILE path.
    pub error_file: PathBuf,
    /// The parsed error file, if the worker wrote one.
    pub error: Option<Value>,
    /// Last lines of its stderr (else stdout).
    pub tail: Vec<String>,
}

impl Failure {
    /// Reads the worker's error file if it exists and parses.
    pub fn load_error_file(path: &Path) -> Option<Value> {
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The failure's timestamp: the error file's `extraInfo.timestamp` (epoch seconds) if present.
    pub fn timestamp(&self) -> SystemTime {
        self.error
            .as_ref()
            .and_then(|v| v.pointer("/message/extraInfo/timestamp"))
            .and_then(|t| match t {
                Value::String(s) => s.parse::<u64>().ok(),
                Value::Number(n) => n.as_u64(),
                _ => None,
            })
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
            .unwrap_or(self.observed_at)
    }

    /// One line for logs: `rank 1 (local_rank 1) exited with 3 (pid 42)` or `... killed by SIGKILL`.
    pub fn one_line(&self) -> String {
        match self.exit {
            ExitKind::Code(c) => format!(
                "rank {} (local_rank {}) exited with {c} (pid {})",
                self.rank, self.local_rank, self.pid
            ),
            ExitKind::Signal(s) => format!(
                "rank {} (local_rank {}) was killed by {}{} (pid {})",
                self.rank,
                self.local_rank,
                s.as_str(),
                signal_short_cause(s).map_or(String::new(), |c| format!(" ({c})")),
                self.pid
            ),
        }
    }

    /// What the worker said about its failure: the error file's message, else the last
    /// meaningful line of its output (empty when there is neither), one line, cut short.
    pub fn message(&self) -> String {
        self.error
            .as_ref()
            .and_then(|v| v.pointer("/message/message"))
            .and_then(Value::as_str)
            .and_then(|m| m.lines().map(str::trim).rfind(|l| !l.is_empty()))
            .map(root_cause::cut)
            .unwrap_or_else(|| root_cause::last_meaningful(&self.tail))
    }

    /// This failure as the job-wide root cause reported from node `node` on host `host`
    /// (generation 0: the report fills it in).
    pub fn root_cause(&self, node: &str, host: &str) -> RootCause {
        let signal = match self.exit {
            ExitKind::Signal(s) => Some(s),
            ExitKind::Code(_) => None,
        };
        RootCause {
            generation: 0,
            node: node.to_string(),
            host: host.to_string(),
            rank: self.rank,
            local_rank: self.local_rank,
            pid: self.pid,
            exitcode: self.exit.torch_exitcode(),
            signal: signal.map(|s| s.as_str().to_string()),
            likely: signal.and_then(|s| likely_cause(s, self.shown_tail())),
            message: self.message(),
            at_ms: self
                .timestamp()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// The output tail without blank lines at its end.
    fn shown_tail(&self) -> &[String] {
        let end = self
            .tail
            .iter()
            .rposition(|l| !l.trim().is_empty())
            .map_or(0, |i| i + 1);
        &self.tail[..end]
    }

    pub(crate) fn traceback(&self) -> String {
        if let Some(v) = &self.error {
            if let Some(cs) = v
                .pointer("/message/extraInfo/py_callstack")
                .and_then(Value::as_str)
            {
                return cs.trim_end().to_string();
            }
            if let Some(m) = v.pointer("/message/message").and_then(Value::as_str) {
                return m.to_string();
            }
        }
        let mut lines = Vec::new();
        if let ExitKind::Signal(s) = self.exit {
            let mut line = format!(
                "Signal {} ({}) received by PID {}",
                s as i32,
                s.as_str(),
                self.pid
            );
            if let Some(hint) = likely_cause(s, self.shown_tail()) {
                line.push_str(": ");
                line.push_str(&hint);
            }
            lines.push(line);
        }
        let shown = self.shown_tail();
        match shown.len() {
            0 => {}
            1 => lines.push("last line of output:".into()),
            n => lines.push(format!("last {n} lines of output:")),
        }
        lines.extend(shown.iter().map(|l| format!("    {l}")));
        if lines.is_empty() {
            lines.push(
                "no error file and no output; wrap main with torch's @record for a traceback"
                    .into(),
            );
        }
        lines.join("\n")
    }
}

/// The usual reason a worker dies of `sig` when drun did not send it (drun's own stops are
/// never reported as failures), with what to do about it.
pub fn signal_cause(sig: Signal) -> Option<&'static str> {
    Some(match sig {
        Signal::SIGHUP => "a hang-up from outside drun (workers have no terminal of their own, and drun stops its workers itself when its terminal hangs up); if a terminal or ssh session closing is the cause, start drun under nohup, tmux or screen",
        Signal::SIGKILL => "drun did not send it: the kernel's OOM killer (check `dmesg` or the cgroup's memory.events) or an outside `kill -9`",
        Signal::SIGPIPE => "its output was closed (a reader such as `| head` went away)",
        Signal::SIGABRT => "a native abort: a C++ exception or assertion, often in a destructor at exit",
        Signal::SIGSEGV => "a segmentation fault in native code (an extension, a driver, or memory corruption)",
        Signal::SIGBUS => "a bus error: often /dev/shm too small for the data loader's shared memory (containers)",
        Signal::SIGTERM => "terminated from outside drun (a scheduler, an operator, or a parent process)",
        Signal::SIGINT => "interrupted from outside drun (Ctrl-C reaches only drun, so someone signalled the worker)",
        _ => return None,
    })
}

/// What libstdc++ prints when a thread ends inside a destructor that may not throw, or a
/// joinable thread is destroyed: no exception is in flight.
const TERMINATE_WITHOUT_EXCEPTION: &str = "terminate called without an active exception";

/// [`signal_cause`], made specific by the worker's last lines of output (`tail`) where they tell
/// more: an abort with [`TERMINATE_WITHOUT_EXCEPTION`] is most often torch's own teardown at
/// interpreter exit (a gloo or NCCL worker thread that releases its last Work, which holds a
/// Python object, after finalization began: pytorch/pytorch#179291), as likely under torchrun.
pub fn likely_cause(sig: Signal, tail: &[String]) -> Option<String> {
    if sig == Signal::SIGABRT && tail.iter().any(|l| l.contains(TERMINATE_WITHOUT_EXCEPTION)) {
        return Some(
            "a native abort with no exception in flight: most often a torch background thread (gloo, NCCL) outliving the interpreter at exit (pytorch/pytorch#179291), after the script's last line; a rank that finished its work avoids it by ending with os._exit(0) once its outputs are saved and flushed"
                .into(),
        );
    }
    if sig == Signal::SIGINT && tail.iter().any(|l| l.starts_with("KeyboardInterrupt")) {
        return Some(
            "an uncaught KeyboardInterrupt (Python dies by SIGINT after one): raised by the script itself, or someone signalled the worker (Ctrl-C reaches only drun)"
                .into(),
        );
    }
    signal_cause(sig).map(str::to_string)
}

/// A few words for [`signal_cause`] in one-line reports.
fn signal_short_cause(sig: Signal) -> Option<&'static str> {
    Some(match sig {
        Signal::SIGHUP => "terminal hang-up",
        Signal::SIGKILL => "OOM killer or outside kill",
        Signal::SIGPIPE => "output closed",
        Signal::SIGABRT => "native abort",
        Signal::SIGSEGV => "segmentation fault",
        Signal::SIGBUS => "bus error",
        _ => return None,
    })
}

/// Index of the root cause: earliest timestamp, ties broken by order of observation.
pub fn root_cause(failures: &[Failure]) -> Option<usize> {
    (0..failures.len()).min_by_key(|i| failures[*i].timestamp())
}

/// Local time as torchrun prints it: `%Y-%m-%d_%H:%M:%S`.
pub fn format_time(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Local>::from(t)
        .format("%Y-%m-%d_%H:%M:%S")
        .to_string()
}

/// The summary block for `script` with the root cause first-class and others one line each.
///
/// `earlier` lists the run's earlier worker failures (job-wide, any node), oldest first; they
/// head the `Failures:` section so the whole history of the budget is on one screen.
pub fn format_summary(
    script: &str,
    host: &str,
    failures: &[Failure],
    earlier: &[String],
) -> String {
    let border = "=".repeat(60);
    let rule = "-".repeat(60);
    let Some(root) = root_cause(failures) else {
        return String::new();
    };
    let mut s = format!("{border}\n{script} FAILED\n{rule}\nFailures:\n");
    let others: Vec<&Failure> = failures
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != root)
        .map(|(_, f)| f)
        .collect();
    if others.is_empty() && earlier.is_empty() {
        s.push_str("  <NO_OTHER_FAILURES>\n");
    }
    for (i, e) in earlier.iter().enumerate() {
        s.push_str(&format!("[{}]: earlier, {e}\n", i + 1));
    }
    for (i, f) in others.iter().enumerate() {
        s.push_str(&format!(
            "[{}]: time {} {}\n",
            earlier.len() + i + 1,
            format_time(f.timestamp()),
            f.one_line()
        ));
    }
    let f = &failures[root];
    let error_file = if f.error.is_some() {
        f.error_file.display().to_string()
    } else {
        "<N/A>".to_string()
    };
    let traceback = f.traceback().replace('\n', "\n              ");
    s.push_str(&format!(
        "{rule}\nRoot Cause (first observed failure):\n[0]:\n  time      : {}\n  host      : {host}\n  rank      : {} (local_rank: {})\n  exitcode  : {} (pid: {})\n  error_file: {error_file}\n  traceback : {traceback}\n{border}\n",
        format_time(f.timestamp()),
        f.rank,
        f.local_rank,
        f.exit.torch_exitcode(),
        f.pid,
    ));
    s
}

/// The line said after the summary when the root cause is a module the workers' interpreter
/// has not got (`ModuleNotFoundError: No module named 'torch'`): which interpreter ran them
/// (`program`, and where it came from) and the fix. Running `python3` from `PATH` without the
/// environment that has torch activated is a common start.
pub fn missing_module_hint(
    text: &str,
    program: &Path,
    source: crate::command::PythonSource,
) -> Option<String> {
    let rest = &text[text.find("No module named '")? + "No module named '".len()..];
    let module = &rest[..rest.find('\'')?];
    let top = module.split('.').next().unwrap_or(module);
    Some(format!(
        "the workers ran {}{}, which has no module '{top}': activate the environment that has it, or {}",
        program.display(),
        source.origin(),
        match source {
            crate::command::PythonSource::Default => "pass --python PATH (or set DRUN_PYTHON)",
            other => other.fix(),
        }
    ))
}

/// The JSON drun writes to its own `TORCHELASTIC_ERROR_FILE` for schedulers: the root cause's
/// error file with `message.errorCode` set to its exit code (torchrun `ErrorHandler.dump_error_file`),
/// or, when the worker wrote none, an equivalent record built from its exit and output tail.
pub fn root_cause_json(f: &Failure) -> Value {
    let code = f.exit.torch_exitcode();
    match &f.error {
        Some(v) => {
            let mut v = v.clone();
            if let Some(m) = v.get_mut("message").and_then(Value::as_object_mut) {
                m.insert("errorCode".into(), Value::from(code));
            }
            v
        }
        None => serde_json::json!({
            "message": {
                "message": f.one_line(),
                "extraInfo": {
                    "py_callstack": f.traceback(),
                    "timestamp": f.timestamp().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).to_string(),
                },
                "errorCode": code,
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(rank: u32, exit: ExitKind, at: u64, error: Option<Value>) -> Failure {
        Failure {
            rank,
            local_rank: rank,
            pid: 100 + rank as i32,
            exit,
            observed_at: UNIX_EPOCH + Duration::from_secs(at),
            error_file: PathBuf::from(format!("/logs/{rank}/error.json")),
            error,
            tail: vec![
                "Traceback (most recent call last):".into(),
                "ValueError: x".into(),
            ],
        }
    }

    #[test]
    fn root_cause_is_earliest_and_summary_has_torchrun_shape() {
        let err = serde_json::json!({"message": {"message": "ValueError: boom",
            "extraInfo": {"py_callstack": "Traceback...\nValueError: boom", "timestamp": "1000"}}});
        let fs = vec![
            failure(0, ExitKind::Signal(Signal::SIGKILL), 2000, None),
            failure(1, ExitKind::Code(3), 3000, Some(err)),
        ];
        assert_eq!(
            root_cause(&fs),
            Some(1),
            "error-file timestamp 1000 is earliest"
        );
        let s = format_summary(
            "train.py",
            "box",
            &fs,
            &["generation 1: rank 0 exited with 1 on node a".into()],
        );
        assert!(
            s.contains("[1]: earlier, generation 1: rank 0 exited with 1 on node a"),
            "{s}"
        );
        assert!(s.contains("train.py FAILED"), "{s}");
        assert!(s.contains("Root Cause (first observed failure):"), "{s}");
        assert!(s.contains("  rank      : 1 (local_rank: 1)"), "{s}");
        assert!(s.contains("  exitcode  : 3 (pid: 101)"), "{s}");
        assert!(s.contains("  error_file: /logs/1/error.json"), "{s}");
        assert!(s.contains("ValueError: boom"), "{s}");
        assert!(
            s.contains(
                "rank 0 (local_rank 0) was killed by SIGKILL (OOM killer or outside kill) (pid 100)"
            ),
            "{s}"
        );
        let j = root_cause_json(&fs[1]);
        assert_eq!(j["message"]["errorCode"], 3);
    }

    #[test]
    fn a_keyboard_interrupt_in_the_tail_is_named_not_only_an_outside_signal() {
        let tail = vec![
            "Traceback (most recent call last):".to_string(),
            "  File \"/job/train.py\", line 3, in <module>".to_string(),
            "KeyboardInterrupt: stop".to_string(),
        ];
        let cause = likely_cause(Signal::SIGINT, &tail).unwrap();
        assert!(cause.contains("uncaught KeyboardInterrupt"), "{cause}");
        let outside = likely_cause(Signal::SIGINT, &tail[..2]).unwrap();
        assert!(
            outside.starts_with("interrupted from outside drun"),
            "{outside}"
        );
    }

    #[test]
    fn the_reported_root_cause_carries_signal_likely_reason_and_message() {
        let f = failure(2, ExitKind::Signal(Signal::SIGKILL), 5, None);
        let c = f.root_cause("b", "hb");
        assert_eq!((c.node.as_str(), c.rank, c.exitcode), ("b", 2, -9));
        assert_eq!(c.signal.as_deref(), Some("SIGKILL"));
        assert!(c
            .likely
            .as_deref()
            .is_some_and(|l| l.contains("OOM killer")));
        assert_eq!(c.message, "ValueError: x", "the tail's last line");
        assert_eq!(c.at_ms, 5000);
        for sig in [Signal::SIGHUP, Signal::SIGPIPE] {
            let c = failure(0, ExitKind::Signal(sig), 5, None).root_cause("b", "hb");
            assert!(c.likely.is_some(), "{sig:?}");
        }
        let err =
            serde_json::json!({"message": {"message": "RuntimeError: bad\n", "extraInfo": {}}});
        let c = failure(1, ExitKind::Code(1), 5, Some(err)).root_cause("b", "hb");
        assert_eq!(c.message, "RuntimeError: bad", "the error file's message");
        assert_eq!(c.signal, None);
    }

    #[test]
    fn signal_death_without_error_file_shows_signal_and_tail() {
        let fs = vec![failure(2, ExitKind::Signal(Signal::SIGSEGV), 5, None)];
        let s = format_summary("w.py", "h", &fs, &[]);
        assert!(s.contains("exitcode  : -11 (pid: 102)"), "{s}");
        assert!(s.contains("Signal 11 (SIGSEGV) received by PID 102"), "{s}");
        assert!(s.contains("<NO_OTHER_FAILURES>"), "{s}");
        assert!(s.contains("ValueError: x"), "{s}");
        assert_eq!(root_cause_json(&fs[0])["message"]["errorCode"], -11);
    }

    #[test]
    fn a_hang_up_names_its_usual_cause_and_the_tail_counts_what_it_shows() {
        let mut f = failure(1, ExitKind::Signal(Signal::SIGHUP), 5, None);
        f.tail = vec!["epoch 3".into(), "".into(), " ".into()];
        let s = format_summary("w.py", "h", &[f.clone()], &[]);
        assert!(s.contains("exitcode  : -1 (pid: 101)"), "{s}");
        assert!(
            s.contains("Signal 1 (SIGHUP) received by PID 101: a hang-up from outside drun"),
            "{s}"
        );
        assert!(s.contains("nohup, tmux or screen"), "{s}");
        assert!(s.contains("last line of output:\n"), "{s}");
        assert!(f.one_line().contains("killed by SIGHUP (terminal hang-up)"));
        for sig in [Signal::SIGKILL, Signal::SIGPIPE, Signal::SIGABRT] {
            assert!(signal_cause(sig).is_some(), "{sig:?}");
        }
    }

    #[test]
    fn an_abort_without_an_exception_names_the_teardown_race_and_its_way_out() {
        let mut f = failure(3, ExitKind::Signal(Signal::SIGABRT), 5, None);
        f.tail = vec!["[rank3]:terminate called without an active exception".into()];
        let s = format_summary("w.py", "h", &[f.clone()], &[]);
        assert!(s.contains("pytorch/pytorch#179291"), "{s}");
        assert!(s.contains("os._exit(0)"), "{s}");
        let cause = f.root_cause("n", "h");
        assert!(cause.likely.unwrap().contains("outliving the interpreter"));
        // Another abort keeps the general cause.
        f.tail = vec!["Assertion `x' failed.".into()];
        let likely = f.root_cause("n", "h").likely.unwrap();
        assert!(likely.contains("often in a destructor at exit"), "{likely}");
    }

    #[test]
    fn a_missing_module_names_the_interpreter_and_the_fix() {
        use crate::command::PythonSource;
        let line = missing_module_hint(
            "Traceback ...\nModuleNotFoundError: No module named 'torch.distributed'",
            Path::new("/usr/bin/python3"),
            PythonSource::Default,
        )
        .unwrap();
        assert_eq!(
            line,
            "the workers ran /usr/bin/python3, which has no module 'torch': activate the environment that has it, or pass --python PATH (or set DRUN_PYTHON)"
        );
        let line = missing_module_hint(
            "No module named 'numpy'",
            Path::new("/opt/py/bin/python"),
            PythonSource::DrunPython,
        )
        .unwrap();
        assert!(
            line.contains("/opt/py/bin/python (from DRUN_PYTHON), which has no module 'numpy'"),
            "{line}"
        );
        assert_eq!(
            missing_module_hint(
                "ValueError: boom",
                Path::new("python3"),
                PythonSource::Default
            ),
            None
        );
    }
}
