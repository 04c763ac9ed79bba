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
//!   reaping and spawning apart, so a child that failed to exec is collected by its spawner.
//! * Children are started with `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does, not with
//!   `fork`: forking the threaded agent copied its page tables and made its memory copy-on-write
//!   for every worker, which cost milliseconds per worker (seconds for hundreds).
//! * Workers get stdin, stdout and stderr and no other descriptor: every one from 3 up is
//!   closed before `execve` ([`close_inherited`]), as `subprocess` with `close_fds=True` does.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};

use nix::errno::Errno;
use nix::fcntl::OFlag;
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
    /// One more descriptor the process gets, as [`HANDOFF_FD`] (a warm worker's hand-off
    /// socket, [`crate::warm`]); every other one from 3 up is closed.
    pub handoff: Option<OwnedFd>,
    /// The CPUs the process (and every thread it starts) may run on (`--numa-binding`,
    /// [`crate::numa`]); `None`: the agent's.
    pub cpus: Option<crate::numa::topology::Cpus>,
}

/// The descriptor number a process spawned with [`SpawnSpec::handoff`] finds it at.
pub const HANDOFF_FD: libc::c_int = 3;

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

/// Starts `spec` with `clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does: the child shares
/// the agent's memory until it calls `execve`, so no page table is copied and the agent's pages
/// are not made copy-on-write (a `fork` of the threaded agent cost ~6 ms per worker in TLB
/// shootdowns). The spawner thread is suspended until the child has exec'd (or failed).
fn spawn_now(spec: SpawnSpec) -> io::Result<Spawned> {
    let path = executable(&spec.program, &spec.env)?;
    let argv: Vec<CString> = std::iter::once(cstring(spec.program.as_os_str()))
        .chain(spec.args.iter().map(|a| cstring(OsStr::new(a))))
        .collect::<io::Result<_>>()?;
    let envp: Vec<CString> = spec
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            cstring(&kv)
        })
        .collect::<io::Result<_>>()?;
    let argv_ptrs = nul_terminated(&argv);
    let envp_ptrs = nul_terminated(&envp);
    let (stdout, stderr, out_read, err_read) = match spec.output {
        Output::Piped => {
            let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC)?;
            let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC)?;
            (out_w, err_w, Some(out_r), Some(err_r))
        }
        Output::Null => (
            dev_null(OFlag::O_WRONLY)?,
            dev_null(OFlag::O_WRONLY)?,
            None,
            None,
        ),
    };
    let stdin: Option<OwnedFd> = match spec.stdin {
        Input::Inherit => None,
        Input::Null => Some(dev_null(OFlag::O_RDONLY)?),
        Input::Fd(fd) => Some(fd),
    };
    let cpus = spec.cpus.as_ref().map(cpu_set).transpose()?;
    let mut child = ChildArgs {
        path: path.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        stdin: stdin.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
        stdout: stdout.as_raw_fd(),
        stderr: stderr.as_raw_fd(),
        handoff: spec.handoff.as_ref().map_or(-1, |fd| fd.as_raw_fd()),
        die_with_agent: spec.die_with_agent,
        cpus: cpus
            .as_ref()
            .map_or(std::ptr::null(), |c| c as *const libc::cpu_set_t),
        parent: nix::unistd::getpid().as_raw(),
        error: 0,
    };
    let mut stack = vec![0u8; CHILD_STACK];
    let _guard = SPAWN_LOCK.lock().expect("spawn lock poisoned");
    // SAFETY: all signals are blocked on this thread around the clone so that no handler of the
    // agent runs on the child's stack before `child_main` resets them; the old mask is restored
    // right after. `stack` outlives the child's use of it: CLONE_VFORK suspends this thread
    // until the child has exec'd or exited, and `child` and the argument vectors are only read
    // (or `error` written) by the child during that time.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let top = stack.as_mut_ptr().add(CHILD_STACK);
        let top = top.sub(top as usize % 16);
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut child as *mut ChildArgs).cast(),
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        Pid::from_raw(pid)
    };
    // SAFETY: the child wrote `error` (if at all) before it exec'd or exited, and this thread
    // was suspended until then.
    let error = unsafe { std::ptr::read_volatile(&child.error) };
    if error != 0 {
        // The child exited with 127 without exec'ing: collect it here, under the lock.
        let _ = waitpid(pid, None);
        return Err(match error {
            AGENT_GONE => io::Error::other("agent exited during spawn"),
            e => io::Error::from_raw_os_error(e),
        });
    }
    Ok(Spawned {
        pid,
        stdout: out_read,
        stderr: err_read,
    })
}

/// Stack of the child between clone and exec.
const CHILD_STACK: usize = 128 * 1024;
/// `ChildArgs::error` when the agent died during the spawn (PDEATHSIG would not fire).
const AGENT_GONE: libc::c_int = -1;

/// What the child reads between clone and exec (memory of the suspended spawner thread).
#[repr(C)]
struct ChildArgs {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Descriptor to make stdin, or -1 to inherit the agent's.
    stdin: libc::c_int,
    stdout: libc::c_int,
    stderr: libc::c_int,
    /// Descriptor to place at [`HANDOFF_FD`], or -1.
    handoff: libc::c_int,
    die_with_agent: bool,
    /// CPUs to bind to before exec, or null.
    cpus: *const libc::cpu_set_t,
    parent: libc::pid_t,
    /// Set by the child when it cannot exec: an errno, or [`AGENT_GONE`].
    error: libc::c_int,
}

/// The child between clone and exec: default signal handling, stdio, its own session,
/// PDEATHSIG, exec. It shares the agent's memory, so it only makes system calls (all
/// async-signal-safe), allocates nothing and takes no lock.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` of `spawn_now`, alive while the spawner thread waits;
    // every call below is a plain system call wrapper.
    unsafe {
        let a = &mut *arg.cast::<ChildArgs>();
        let fail = |a: &mut ChildArgs, e: libc::c_int| -> libc::c_int {
            std::ptr::write_volatile(&mut a.error, e);
            libc::_exit(127)
        };
        // The agent's handlers must not run here; ignored signals stay ignored (nohup), except
        // SIGPIPE, which Rust ignores and `std::process::Command` resets for its children too.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..65 {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let handoff = (a.handoff >= 0).then_some((a.handoff, HANDOFF_FD));
        for (fd, target) in [(a.stdin, 0), (a.stdout, 1), (a.stderr, 2)]
            .into_iter()
            .chain(handoff)
        {
            // dup2 onto itself keeps FD_CLOEXEC: clear it instead.
            let r = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else if fd >= 0 {
                libc::dup2(fd, target)
            } else {
                0
            };
            if r < 0 {
                return fail(a, *libc::__errno_location());
            }
        }
        if libc::setsid() < 0 {
            return fail(a, *libc::__errno_location());
        }
        if !a.cpus.is_null()
            && libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), a.cpus) < 0
        {
            return fail(a, *libc::__errno_location());
        }
        if a.die_with_agent {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                return fail(a, *libc::__errno_location());
            }
            if libc::getppid() != a.parent {
                return fail(a, AGENT_GONE);
            }
        }
        close_inherited(if handoff.is_some() { HANDOFF_FD + 1 } else { 3 });
        libc::execve(a.path, a.argv, a.envp);
        fail(a, *libc::__errno_location())
    }
}

/// `cpus` as the kernel's CPU mask (built before the clone: the child only makes the call).
fn cpu_set(cpus: &crate::numa::topology::Cpus) -> io::Result<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET only writes inside it, and every
    // index is checked against its capacity first.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            if cpu >= libc::CPU_SETSIZE as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("CPU {cpu} is beyond the kernel's CPU mask"),
                ));
            }
            libc::CPU_SET(cpu, &mut set);
        }
        Ok(set)
    }
}

/// Closes every descriptor from `first` (3, or 4 past a hand-off socket) up in the child, as
/// Python's `subprocess` (`close_fds=True`, which torchrun uses) does: whatever the agent holds
/// or itself inherited without `CLOEXEC` never reaches a worker (workers get only stdin, stdout
/// and stderr; the worker API is a socket *path* in the environment). Runs between clone and
/// exec: system calls only.
///
/// # Safety
/// Only in the child between clone and exec, after stdio is in place.
unsafe fn close_inherited(first: libc::c_int) {
    if libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) == 0 {
        return;
    }
    // Kernels before 5.9 (ENOSYS): one close per possible descriptor.
    let mut lim: libc::rlimit = std::mem::zeroed();
    let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
        lim.rlim_cur.min(1 << 20) as libc::c_int
    } else {
        1024
    };
    for fd in first..max {
        libc::close(fd);
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} contains a NUL byte", s.to_string_lossy()),
        )
    })
}

/// The pointers of `v`, then NULL (an `argv`/`envp` array; borrows `v`).
fn nul_terminated(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn pipe2(flags: OFlag) -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(flags).map_err(io::Error::from)
}

fn dev_null(mode: OFlag) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        "/dev/null",
        mode | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// The file `execvp` would run for `program`: itself when it names a path, else the first
/// executable `<dir>/<program>` on the PATH of the child's environment (the agent's when the
/// child has none), as `std::process::Command` looks it up.
fn executable(program: &Path, env: &BTreeMap<OsString, OsString>) -> io::Result<CString> {
    if program.as_os_str().as_bytes().contains(&b'/') {
        return cstring(program.as_os_str());
    }
    let path = env
        .get(OsStr::new("PATH"))
        .cloned()
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(program);
        if let Ok(m) = std::fs::metadata(&candidate) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return cstring(candidate.as_os_str());
            }
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENOENT))
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

/// The signal noted by [`note_early_signals`]'s handler (0: none).
static EARLY_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn note_early(sig: libc::c_int) {
    EARLY_SIGNAL.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// As PID 1 (a container's main process) a signal without a handler is dropped by the kernel:
/// a SIGTERM from the kubelet while drun validates its command line would be lost, and the
/// workers would start anyway and die by SIGKILL at the end of the grace period. Until the
/// agent installs its own handlers, this one notes the last of `sigs` that arrived
/// ([`take_early_signal`]). Signals ignored at start (`nohup`) stay ignored.
pub fn note_early_signals(sigs: &[Signal]) {
    for sig in sigs.iter().filter(|s| !is_ignored(**s)) {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        let _ = unsafe {
            nix::sys::signal::signal(*sig, nix::sys::signal::SigHandler::Handler(note_early))
        };
    }
}

/// The signal [`note_early_signals`] noted, once (the agent forwards it as if it had come after
/// its own handlers were installed).
pub fn take_early_signal() -> Option<Signal> {
    match EARLY_SIGNAL.swap(0, std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}

#[cfg(test)]
mod tests;
