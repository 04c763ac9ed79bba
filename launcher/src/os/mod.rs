//! The seam around the operating system: the [`Os`] trait, its Linux implementation, a fake.
//!
//! Everything that forks, waits, signals or reads `/proc` lives here so the agent and the
//! worker group above it deal in plain values (pids, exit statuses). [`LinuxOs`] is the real
//! thing; [`fake::FakeOs`] records calls and lets tests script exits, so the group's state
//! machine is tested without processes or sleeping. `spawn` holds the only `unsafe` blocks.

pub mod background;
pub mod exec_error;
pub mod fake;
pub mod flight_recorder;
pub mod guard;
pub mod helpers;
pub mod ports;
pub mod private_dir;
pub mod procs;
pub mod spawn;
pub mod stacks;

use std::future::Future;
use std::io;
use std::pin::Pin;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use spawn::{ExitKind, SpawnSpec, Spawned, Spawner};

/// A boxed future, so that [`Os`] stays object-safe (`Arc<dyn Os>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the agent and the worker group ask of the operating system.
pub trait Os: Send + Sync + std::fmt::Debug {
    /// Starts a process in its own session and process group (see [`spawn`]).
    fn spawn(&self, spec: SpawnSpec) -> BoxFuture<'_, io::Result<Spawned>>;

    /// Collects every exited child without blocking: workers and re-parented orphans alike.
    fn reap(&self) -> Vec<(Pid, ExitKind)>;

    /// Sends `sig` to process group `pgid`, errors as the kernel gives them (ESRCH: gone).
    fn killpg(&self, pgid: Pid, sig: Signal) -> nix::Result<()>;

    /// Sends `sig` to one process; ESRCH counts as success.
    fn signal_process(&self, pid: Pid, sig: Signal);

    /// Live descendants this agent must not leave behind: its children other than `except`
    /// (the guard, the warm interpreters: [`crate::warm`]; the rest are re-parented orphans,
    /// since the agent is a subreaper) and every process whose environment carries
    /// `DRUN_AGENT_ID=<agent_id>`, again but `except` and the agent's own running helpers
    /// ([`helpers`]); sorted, without duplicates.
    fn descendants(&self, agent_id: &str, except: &[Pid]) -> Vec<Pid>;

    /// This machine's hostname (`localhost` when it cannot be read).
    fn hostname(&self) -> String;
}

/// The real operating system: forks on the [`Spawner`] thread, `waitpid`, `killpg`, `/proc`.
#[derive(Debug, Clone)]
pub struct LinuxOs {
    spawner: Spawner,
}

impl LinuxOs {
    /// Wraps the agent's spawner thread.
    pub fn new(spawner: Spawner) -> Self {
        Self { spawner }
    }
}

impl Os for LinuxOs {
    fn spawn(&self, spec: SpawnSpec) -> BoxFuture<'_, io::Result<Spawned>> {
        Box::pin(self.spawner.spawn(spec))
    }

    fn reap(&self) -> Vec<(Pid, ExitKind)> {
        spawn::reap()
    }

    fn killpg(&self, pgid: Pid, sig: Signal) -> nix::Result<()> {
        nix::sys::signal::killpg(pgid, sig)
    }

    fn signal_process(&self, pid: Pid, sig: Signal) {
        procs::signal_process(pid, sig);
    }

    fn descendants(&self, agent_id: &str, except: &[Pid]) -> Vec<Pid> {
        let mut left = procs::children_of(nix::unistd::getpid());
        left.extend(procs::with_env("DRUN_AGENT_ID", agent_id));
        // The agent's own helpers (a GPU health check running beside a stop) are not leftovers.
        left.retain(|p| !except.contains(p) && !helpers::is_running(p.as_raw()));
        left.sort_unstable();
        left.dedup();
        left
    }

    fn hostname(&self) -> String {
        hostname()
    }
}

/// This machine's hostname (`localhost` when it cannot be read).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into())
}
