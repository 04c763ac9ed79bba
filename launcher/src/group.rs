//! One generation's local worker group: record exits, signal, report failures; starting the
//! workers is [`spawn`]'s, reading their output [`output`]'s.
//!
//! All worker state transitions happen here ([`WorkerState`]); the agent loop decides when.
//! The group reaches the operating system only through [`Os`] (so it is tested with
//! [`crate::os::fake::FakeOs`]). The stop sequence (signal, grace, SIGKILL) is the agent's
//! `Stopping` phase ([`crate::agent::state::StopStage`]); the group only signals and records.

mod output;
mod spawn;
#[cfg(test)]
mod tests;

pub use spawn::GroupContext;
pub(crate) use spawn::{env_of, worker_stdin};

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::logs::Tail;
use crate::os::spawn::ExitKind;
use crate::os::Os;
use crate::summary::Failure;

/// Life of one worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Running since this instant.
    Running {
        /// Spawn time.
        since: Instant,
    },
    /// Reaped.
    Exited {
        /// Status.
        exit: ExitKind,
        /// When drun reaped it.
        at: SystemTime,
        /// Whether drun had already asked the group to stop (then the exit is not a failure).
        stopped_by_agent: bool,
    },
}

impl WorkerState {
    /// Still running.
    pub fn is_running(&self) -> bool {
        matches!(self, WorkerState::Running { .. })
    }

    /// Exited on its own with a non-zero status or a signal.
    pub fn is_failure(&self) -> bool {
        matches!(self, WorkerState::Exited { exit, stopped_by_agent: false, .. } if !exit.is_success())
    }
}

/// One worker of the group.
#[derive(Debug)]
pub struct Worker {
    /// LOCAL_RANK.
    pub local_rank: u32,
    /// RANK.
    pub rank: u32,
    /// Pid, process group and session id.
    pub pid: Pid,
    /// State.
    pub state: WorkerState,
    /// TORCHELASTIC_ERROR_FILE.
    pub error_file: PathBuf,
    out_tail: Arc<Mutex<Tail>>,
    err_tail: Arc<Mutex<Tail>>,
    readers: Vec<JoinHandle<()>>,
}

/// The local workers of one generation.
#[derive(Debug)]
pub struct WorkerGroup {
    /// Workers by local rank.
    pub workers: Vec<Worker>,
    /// Generation they belong to.
    pub generation: u64,
    stopping: bool,
    os: Arc<dyn Os>,
    /// Bytes the workers' output readers moved (`logs::Sink::moved`): the drain's sign of life.
    moved: Arc<AtomicU64>,
}

impl WorkerGroup {
    /// Records a reaped pid; returns false if it is not one of this group's workers.
    pub fn record(&mut self, pid: Pid, exit: ExitKind) -> bool {
        let stopping = self.stopping;
        match self
            .workers
            .iter_mut()
            .find(|w| w.pid == pid && w.state.is_running())
        {
            Some(w) => {
                w.state = WorkerState::Exited {
                    exit,
                    at: SystemTime::now(),
                    stopped_by_agent: stopping,
                };
                true
            }
            None => false,
        }
    }

    /// The global rank of the worker with `pid`, if it is one of this group's.
    pub fn rank_of(&self, pid: Pid) -> Option<u32> {
        self.workers.iter().find(|w| w.pid == pid).map(|w| w.rank)
    }

    /// Any worker failed on its own.
    pub fn has_failure(&self) -> bool {
        self.workers.iter().any(|w| w.state.is_failure())
    }

    /// Every worker exited 0.
    pub fn all_succeeded(&self) -> bool {
        self.workers
            .iter()
            .all(|w| matches!(w.state, WorkerState::Exited { exit, .. } if exit.is_success()))
    }

    /// The global ranks that exited 0.
    pub fn finished(&self) -> Vec<u32> {
        self.workers
            .iter()
            .filter(|w| matches!(w.state, WorkerState::Exited { exit, .. } if exit.is_success()))
            .map(|w| w.rank)
            .collect()
    }

    /// When the first worker exited 0 while others still run (a partial success), if so.
    pub fn first_success_at(&self) -> Option<SystemTime> {
        if !self.any_running() {
            return None;
        }
        self.workers
            .iter()
            .filter_map(|w| match w.state {
                WorkerState::Exited { exit, at, .. } if exit.is_success() => Some(at),
                _ => None,
            })
            .min()
    }

    /// "ranks \[0\] exited 0 but ranks \[1\] still ran after --peer-exit-wait 300 s".
    pub fn partial_success_line(&self, waited: std::time::Duration) -> String {
        let done: Vec<u32> = self
            .workers
            .iter()
            .filter(|w| !w.state.is_running())
            .map(|w| w.rank)
            .collect();
        let running: Vec<u32> = self
            .workers
            .iter()
            .filter(|w| w.state.is_running())
            .map(|w| w.rank)
            .collect();
        format!(
            "ranks {done:?} exited 0 but ranks {running:?} still ran after --peer-exit-wait {}",
            drun_rendezvous::human::duration(waited)
        )
    }

    /// The running workers: global rank and pid.
    pub fn running(&self) -> Vec<(u32, i32)> {
        self.workers
            .iter()
            .filter(|w| w.state.is_running())
            .map(|w| (w.rank, w.pid.as_raw()))
            .collect()
    }

    /// Workers still running.
    pub fn any_running(&self) -> bool {
        self.workers.iter().any(|w| w.state.is_running())
    }

    /// From now on exits are the agent's doing, not failures.
    pub fn mark_stopping(&mut self) {
        self.stopping = true;
    }

    /// Collects exited children from the OS and records this group's workers among them;
    /// returns each reaped pid with its exit and whether it was one of the workers (else a
    /// re-parented descendant).
    pub fn reap(&mut self) -> Vec<(Pid, ExitKind, bool)> {
        let reaped = self.os.reap();
        reaped
            .into_iter()
            .map(|(pid, exit)| (pid, exit, self.record(pid, exit)))
            .collect()
    }

    /// Sends `sig` to the process group of every running worker. A group that is already
    /// gone (ESRCH) counts as success; returns how many could not be signalled otherwise.
    pub fn signal_running(&self, sig: Signal) -> usize {
        let mut failed = 0;
        for w in self.workers.iter().filter(|w| w.state.is_running()) {
            match self.os.killpg(w.pid, sig) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => {
                    failed += 1;
                    tracing::warn!(rank = w.rank, pgid = w.pid.as_raw(), ?sig, error = %e, "killpg failed");
                }
            }
        }
        failed
    }

    /// Sends the stop signal `sig` to every running worker's process group, then SIGCONT, so
    /// that a stopped worker (SIGSTOP, Ctrl-Z, a debugger detached) gets it now rather than
    /// being killed at the end of the grace period; systemd stops units the same way
    /// (systemd.kill(5): "followed by SIGCONT"). Returns how many groups could not be signalled.
    pub fn stop_running(&self, sig: Signal) -> usize {
        let failed = self.signal_running(sig);
        self.signal_running(Signal::SIGCONT);
        failed
    }

    /// Failures in order of observation, with error files and output tails loaded.
    pub fn failures(&self) -> Vec<Failure> {
        let mut out: Vec<Failure> = self
            .workers
            .iter()
            .filter_map(|w| match w.state {
                WorkerState::Exited {
                    exit,
                    at,
                    stopped_by_agent: false,
                } if !exit.is_success() => {
                    let err = w.err_tail.lock().expect("tail mutex poisoned").lines();
                    let tail = if err.is_empty() {
                        w.out_tail.lock().expect("tail mutex poisoned").lines()
                    } else {
                        err
                    };
                    Some(Failure {
                        rank: w.rank,
                        local_rank: w.local_rank,
                        pid: w.pid.as_raw(),
                        exit,
                        observed_at: at,
                        error_file: w.error_file.clone(),
                        error: Failure::load_error_file(&w.error_file),
                        tail,
                    })
                }
                _ => None,
            })
            .collect();
        out.sort_by_key(|f| f.observed_at);
        out
    }
}
