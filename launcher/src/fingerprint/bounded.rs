//! Running a fingerprint command with a deadline: `nvidia-smi` hangs on a wedged GPU, and a
//! `--fingerprint-cmd` (a registry lookup, say) may never return; neither may hold the agent's
//! start. The command runs in its own process group, killed whole at the deadline.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// How often the child is checked while it runs.
const POLL: Duration = Duration::from_millis(5);

/// What a bounded run came to.
#[derive(Debug)]
pub enum Bounded {
    /// It exited within the limit (standard output captured, standard error discarded). Its
    /// status reads 0 when another waiter (the agent's reaper) collected it first.
    Exited(Output),
    /// It was still running at the limit: its process group was killed.
    TimedOut,
    /// It could not be started.
    CannotRun(std::io::Error),
}

/// Runs `cmd` (stdin and stderr null, stdout captured) for at most `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Bounded {
    run(cmd, limit, false)
}

/// Like [`output_within`], with standard error captured too, after standard output (a tool
/// that reports a failing device on standard error, as `nvidia-smi` may).
pub fn output_within_with_errors(cmd: &mut Command, limit: Duration) -> Bounded {
    run(cmd, limit, true)
}

/// Polls `try_wait` until the child's status, or `None` at `deadline` (or on an error). A child
/// reaped by another waiter (ECHILD: the agent reaps every child of its own once workers run,
/// as their subreaper) has ended: its status is lost, read as 0.
fn wait_until(
    mut try_wait: impl FnMut() -> std::io::Result<Option<std::process::ExitStatus>>,
    deadline: Instant,
) -> Option<std::process::ExitStatus> {
    loop {
        match try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Err(e) if e.raw_os_error() == Some(nix::libc::ECHILD) => {
                return Some(std::os::unix::process::ExitStatusExt::from_raw(0))
            }
            _ => return None,
        }
    }
}

fn run(cmd: &mut Command, limit: Duration, errors: bool) -> Bounded {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if errors {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Bounded::CannotRun(e),
    };
    let group = Pid::from_raw(child.id() as i32);
    // The sweep after a stop spares it (a health check may run beside one).
    let _held = crate::os::helpers::hold(child.id() as i32);
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = child
        .stderr
        .take()
        .map(|e| read_all(Box::new(e) as Box<dyn Read + Send>));
    let status = wait_until(|| child.try_wait(), Instant::now() + limit);
    // Whatever it left behind (a background child holding the pipe) goes too; ESRCH is fine.
    let _ = killpg(group, Signal::SIGKILL);
    let Some(status) = status else {
        let _ = child.wait();
        return Bounded::TimedOut;
    };
    let mut out = stdout.join().unwrap_or_default();
    if let Some(e) = stderr {
        out.extend(e.join().unwrap_or_default());
    }
    Bounded::Exited(Output {
        status,
        stdout: out,
        stderr: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_quick_command_gives_its_output() {
        match output_within(
            &mut sh("echo digest-1; echo noise >&2"),
            Duration::from_secs(10),
        ) {
            Bounded::Exited(o) => {
                assert!(o.status.success());
                assert_eq!(String::from_utf8_lossy(&o.stdout), "digest-1\n");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_hung_command_and_its_children_are_killed_at_the_limit() {
        let t = Instant::now();
        let r = output_within(
            &mut sh("sleep 60 & echo started; sleep 60"),
            Duration::from_millis(300),
        );
        assert!(matches!(r, Bounded::TimedOut), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn a_background_child_holding_the_pipe_does_not_hold_the_answer() {
        let t = Instant::now();
        match output_within(&mut sh("sleep 60 & echo done"), Duration::from_secs(10)) {
            Bounded::Exited(o) => assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n"),
            other => panic!("{other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn errors_can_be_captured_after_the_output() {
        match output_within_with_errors(
            &mut sh("echo row; echo 'Unable to determine' >&2; exit 15"),
            Duration::from_secs(10),
        ) {
            Bounded::Exited(o) => {
                assert_eq!(o.status.code(), Some(15));
                assert_eq!(
                    String::from_utf8_lossy(&o.stdout),
                    "row\nUnable to determine\n"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_child_reaped_by_another_waiter_has_ended_not_timed_out() {
        let far = Instant::now() + Duration::from_secs(60);
        let gone = || Err(std::io::Error::from_raw_os_error(nix::libc::ECHILD));
        assert_eq!(wait_until(gone, far).map(|s| s.success()), Some(true));
        let other = || Err(std::io::Error::from_raw_os_error(nix::libc::EINTR));
        assert_eq!(wait_until(other, far), None);
        let mut polls = 0;
        let later = || {
            polls += 1;
            Ok((polls == 3).then(|| std::os::unix::process::ExitStatusExt::from_raw(256)))
        };
        assert_eq!(wait_until(later, far).and_then(|s| s.code()), Some(1));
    }

    #[test]
    fn a_missing_program_cannot_run() {
        let r = output_within(
            &mut Command::new("/nonexistent/drun-probe"),
            Duration::from_secs(1),
        );
        assert!(matches!(r, Bounded::CannotRun(_)), "{r:?}");
    }
}
