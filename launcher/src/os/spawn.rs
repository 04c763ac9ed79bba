//! Spawning workers safely, and reaping every child the agent ever gets.
//!
//! * Each worker starts in its own session and process group (`setsid`), like torchrun's
//!   `start_new_session=True`, so a terminal's Ctrl-C reaches only the agent, which forwards it,
//!   and `killpg` reaches the worker's own children.
//! * `PR_SET_PDEATHSIG(SIGKILL)` makes the kernel kill a worker when the agent dies. The signal
//!   fires when the *thread* that forked the child exits, so all forks happen on one long-lived
//!   thread ([`Spawner`]) that never exits while the process lives; after setting it the child
//!   checks `getppid()` so an agent that died during the fork cannot leave it running.
//! * The agent is a child subreaper ([`become_subreaper`]): orphaned grandchildren are
//!   re-parented to it, and [`reap`] collects every exited child with `waitpid(-1)`. A mutex keeps
//!   reaping and forking apart, so `std::process::Command` never finds its child already reaped.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Held while forking and while reaping.
static SPAWN_LOCK: Mutex<()> = Mutex::new(());

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)
}

/// Where a spawned process's stdout/stderr go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A pipe the agent reads.
    Piped,
    /// `/dev/null`.
    Null,
}

/// A spawned process's stdin.
#[derive(Debug)]
pub enum Input {
    /// The agent's own stdin (a terminal, for `--stdin-rank`).
    Inherit,
    /// `/dev/null`: reads see end-of-file at once (the default for workers).
    Null,
    /// This descriptor (the guard's command pipe).
    Fd(OwnedFd),
}

/// What to start.
#[derive(Debug)]
pub struct SpawnSpec {
    /// Executable.
    pub program: PathBuf,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// Complete environment (nothing else is inherited).
    pub env: BTreeMap<OsString, OsString>,
    /// stdout/stderr handling.
    pub output: Output,
    /// What the process reads as stdin.
    pub stdin: Input,
    /// Set `PR_SET_PDEATHSIG(SIGKILL)` (workers: yes; the guard: no).
    pub die_with_agent: bool,
}

/// A started process.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid (also its process group and session id).
    pub pid: Pid,
    /// Read end of its stdout pipe, with [`Output::Piped`].
    pub stdout: Option<OwnedFd>,
    /// Read end of its stderr pipe, with [`Output::Piped`].
    pub stderr: Option<OwnedFd>,
}

type Request = (SpawnSpec, tokio::sync::oneshot::Sender<io::Result<Spawned>>);

/// Handle to the long-lived spawner thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Spawner {
    tx: mpsc::Sender<Request>,
}

impl Spawner {
    /// Starts the spawner thread. It never exits (see module docs), even when every handle is
    /// dropped, so children spawned by it keep their PDEATHSIG semantics tied to the process.
    pub fn start() -> io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("drun-spawner".into())
            .spawn(move || {
                while let Ok((spec, reply)) = rx.recv() {
                    let _ = reply.send(spawn_now(spec));
                }
                loop {
                    std::thread::park();
                }
            })?;
        Ok(Self { tx })
    }

    /// Starts `spec` on the spawner thread.
    pub async fn spawn(&self, spec: SpawnSpec) -> io::Result<Spawned> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send((spec, reply))
            .map_err(|_| io::Error::other("spawner thread is gone"))?;
        rx.await
            .map_err(|_| io::Error::other("spawner thread dropped the request"))?
    }
}

fn spawn_now(spec: SpawnSpec) -> io::Result<Spawned> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args).env_clear().envs(&spec.env);
    let (out, err) = match spec.output {
        Output::Piped => (Stdio::piped(), Stdio::piped()),
        Output::Null => (Stdio::null(), Stdio::null()),
    };
    cmd.stdout(out).stderr(err);
    match spec.stdin {
        Input::Inherit => {}
        Input::Null => {
            cmd.stdin(Stdio::null());
        }
        Input::Fd(fd) => {
            cmd.stdin(Stdio::from(fd));
        }
    }
    let parent = nix::unistd::getpid();
    let die_with_agent = spec.die_with_agent;
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (setsid, prctl, getppid); it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(io::Error::from)?;
            if die_with_agent {
                nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL)).map_err(io::Error::from)?;
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::other("agent exited during spawn"));
                }
            }
            Ok(())
        });
    }
    let child = {
        let _guard = SPAWN_LOCK.lock().expect("spawn lock poisoned");
        cmd.spawn()?
    };
    let pid = Pid::from_raw(child.id() as i32);
    // `child` is dropped without waiting: [`reap`] owns every wait.
    let mut child = child;
    Ok(Spawned {
        pid,
        stdout: child.stdout.take().map(OwnedFd::from),
        stderr: child.stderr.take().map(OwnedFd::from),
    })
}

/// How a reaped process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// Normal exit with this status.
    Code(i32),
    /// Killed by this signal.
    Signal(Signal),
}

impl ExitKind {
    /// True for `Code(0)`.
    pub fn is_success(self) -> bool {
        self == ExitKind::Code(0)
    }

    /// torchrun's `exitcode`: the status, or minus the signal number.
    pub fn torch_exitcode(self) -> i32 {
        match self {
            ExitKind::Code(c) => c,
            ExitKind::Signal(s) => -(s as i32),
        }
    }
}

/// Collects every exited child without blocking: workers and re-parented orphans alike.
pub fn reap() -> Vec<(Pid, ExitKind)> {
    let _guard = SPAWN_LOCK.lock().expect("spawn lock poisoned");
    let mut out = Vec::new();
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => out.push((pid, ExitKind::Code(code))),
            Ok(WaitStatus::Signaled(pid, sig, _)) => out.push((pid, ExitKind::Signal(sig))),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "waitpid failed");
                break;
            }
        }
    }
    out
}

/// Sets `signals` to SIG_IGN in this process (the guard: only its pipe ends it).
pub fn ignore_signals(signals: &[Signal]) {
    for sig in signals {
        // SAFETY: SIG_IGN installs no handler code, so nothing can run in signal context.
        let _ = unsafe { nix::sys::signal::signal(*sig, nix::sys::signal::SigHandler::SigIgn) };
    }
}

/// Whether `sig` is ignored (`SIG_IGN`) in this process right now. Checked at start: a signal
/// ignored when drun started (`nohup` ignores SIGHUP) stays ignored — drun installs no handler
/// for it, so its workers inherit the ignore through `exec`, as they would without drun.
pub fn is_ignored(sig: Signal) -> bool {
    // SAFETY: `sigaction` with a null new action only reads the current disposition into
    // `old`, a plain C struct that zeroed memory initialises validly.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig as i32, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}
