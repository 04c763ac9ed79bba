//! [`FakeOs`]: an [`Os`] for unit tests that records every call and lets the test script exits.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::spawn::{ExitKind, SpawnSpec, Spawned};
use super::{BoxFuture, Os};

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `spawn`: the program and its arguments; the pid handed out (`None`: it failed).
    Spawn {
        /// Program.
        program: String,
        /// Arguments.
        args: Vec<String>,
        /// Its complete environment.
        env: BTreeMap<OsString, OsString>,
        /// Pid given to it.
        pid: Option<Pid>,
        /// Whether it got a hand-off descriptor (a warm interpreter).
        handoff: bool,
    },
    /// `killpg`.
    Killpg(Pid, Signal),
    /// `signal_process`.
    Signal(Pid, Signal),
}

#[derive(Debug, Default)]
struct State {
    next_pid: i32,
    calls: Vec<Call>,
    /// Spawn number (0-based) → error to fail it with.
    fail_spawn: Vec<(usize, io::ErrorKind)>,
    spawns: usize,
    exits: VecDeque<(Pid, ExitKind)>,
    killpg_errors: Vec<(Pid, Errno)>,
    /// The hand-off descriptor each spawned process got, the child's end.
    handoffs: BTreeMap<Pid, OwnedFd>,
}

/// A scripted operating system: pids count up from 1000, spawned processes have no output
/// pipes, nothing exits until the test says so ([`FakeOs::exit`]).
#[derive(Debug, Default)]
pub struct FakeOs {
    state: Mutex<State>,
}

impl FakeOs {
    /// A fake whose first spawned pid is 1000.
    pub fn new() -> Self {
        let os = Self::default();
        os.lock().next_pid = 1000;
        os
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake os mutex poisoned")
    }

    /// Makes the `n`th spawn (0-based) fail with `kind`.
    pub fn fail_spawn(&self, n: usize, kind: io::ErrorKind) {
        self.lock().fail_spawn.push((n, kind));
    }

    /// Queues an exit of `pid`, returned by the next `reap`.
    pub fn exit(&self, pid: Pid, exit: ExitKind) {
        self.lock().exits.push_back((pid, exit));
    }

    /// Makes `killpg` of `pgid` fail with `errno` (e.g. ESRCH: already gone).
    pub fn killpg_fails(&self, pgid: Pid, errno: Errno) {
        self.lock().killpg_errors.push((pgid, errno));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The child's end of the hand-off descriptor `pid` was spawned with (what a warm
    /// interpreter reads), once.
    pub fn take_handoff(&self, pid: Pid) -> Option<OwnedFd> {
        self.lock().handoffs.remove(&pid)
    }

    /// The signals sent with `killpg`, in order.
    pub fn killpgs(&self) -> Vec<(Pid, Signal)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Killpg(p, s) => Some((p, s)),
                _ => None,
            })
            .collect()
    }
}

impl Os for FakeOs {
    fn spawn(&self, spec: SpawnSpec) -> BoxFuture<'_, io::Result<Spawned>> {
        let mut st = self.lock();
        let n = st.spawns;
        st.spawns += 1;
        let failure = st.fail_spawn.iter().find(|(i, _)| *i == n).map(|(_, k)| *k);
        let pid = failure.is_none().then(|| {
            st.next_pid += 1;
            Pid::from_raw(st.next_pid - 1)
        });
        st.calls.push(Call::Spawn {
            program: spec.program.display().to_string(),
            args: spec.args,
            env: spec.env,
            pid,
            handoff: spec.handoff.is_some(),
        });
        if let (Some(pid), Some(fd)) = (pid, spec.handoff) {
            st.handoffs.insert(pid, fd);
        }
        let result = match (pid, failure) {
            (Some(pid), _) => Ok(Spawned {
                pid,
                stdout: None,
                stderr: None,
            }),
            (None, kind) => Err(io::Error::from(kind.unwrap_or(io::ErrorKind::Other))),
        };
        Box::pin(std::future::ready(result))
    }

    fn reap(&self) -> Vec<(Pid, ExitKind)> {
        self.lock().exits.drain(..).collect()
    }

    fn killpg(&self, pgid: Pid, sig: Signal) -> nix::Result<()> {
        let mut st = self.lock();
        st.calls.push(Call::Killpg(pgid, sig));
        match st.killpg_errors.iter().find(|(p, _)| *p == pgid) {
            Some((_, e)) => Err(*e),
            None => Ok(()),
        }
    }

    fn signal_process(&self, pid: Pid, sig: Signal) {
        self.lock().calls.push(Call::Signal(pid, sig));
    }

    /// No process is left behind in the fake.
    fn descendants(&self, _agent_id: &str, _except: &[Pid]) -> Vec<Pid> {
        Vec::new()
    }

    fn hostname(&self) -> String {
        "fakehost".into()
    }
}
