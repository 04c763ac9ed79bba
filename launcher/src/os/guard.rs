//! The guard: a tiny helper process that cleans up if the agent is SIGKILLed.
//!
//! PDEATHSIG kills the workers themselves when the agent dies, but not their children (the flag
//! is cleared on fork), and such grandchildren would survive, re-parented to init. So the agent
//! starts `drun __drun_guard <agent-id>` in its own session, holding the write end of a pipe whose
//! read end is the guard's stdin. The agent tells it each worker's process group (`pg <pgid>` /
//! `unpg <pgid>`) and says `done` before a normal exit. If the pipe reaches end-of-file without
//! `done`, the agent died: the guard SIGKILLs the remembered groups and every process whose
//! environment carries `DRUN_AGENT_ID=<agent-id>` (which catches children that left the group
//! with `setsid`), rescans a few times to catch forks in flight, removes the agent's scratch log
//! directory (`scratch <dir>`, only without `--log-dir`), and exits.

use std::collections::BTreeSet;
use std::io::{self, BufRead, Write};
use std::os::fd::OwnedFd;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::os::procs;
use crate::os::spawn::{Input, Output, SpawnSpec, Spawner};

/// `argv[1]` that makes the `drun` binary run [`guard_main`].
pub const GUARD_ARG: &str = "__drun_guard";

/// Agent-side handle to the guard.
#[derive(Debug)]
pub struct Guard {
    pipe: std::fs::File,
    pid: Pid,
}

impl Guard {
    /// Starts the guard for the agent identified by `agent_id`.
    pub async fn start(spawner: &Spawner, agent_id: &str) -> io::Result<Self> {
        let (read, write): (OwnedFd, OwnedFd) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let exe = std::env::current_exe()?;
        let env = std::env::vars_os()
            .filter(|(k, _)| k != "DRUN_AGENT_ID")
            .collect();
        let spawned = spawner
            .spawn(SpawnSpec {
                program: exe,
                args: vec![GUARD_ARG.to_string(), agent_id.to_string()],
                env,
                output: Output::Null,
                stdin: Input::Fd(read),
                die_with_agent: false,
                handoff: None,
                cpus: None,
            })
            .await?;
        Ok(Self {
            pipe: std::fs::File::from(write),
            pid: spawned.pid,
        })
    }

    /// A guard with no process behind it, whose messages go to `/dev/null` (unit tests).
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        Self {
            pipe: std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .expect("/dev/null opens for writing"),
            pid: Pid::from_raw(0),
        }
    }

    /// The guard's pid (excluded from orphan sweeps).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    fn say(&mut self, line: &str) {
        if let Err(e) = writeln!(self.pipe, "{line}") {
            tracing::warn!(error = %e, "cannot reach the cleanup guard process");
        }
    }

    /// Remember a worker's process group.
    pub fn watch(&mut self, pgid: Pid) {
        self.say(&format!("pg {pgid}"));
    }

    /// Forget a reaped worker's process group (its id may be reused).
    pub fn unwatch(&mut self, pgid: Pid) {
        self.say(&format!("unpg {pgid}"));
    }

    /// A scratch directory (the worker API socket's, the worker log directory without
    /// `--log-dir`) to remove after the cleanup if the agent dies; the agent removes it itself
    /// on a normal exit.
    pub fn scratch(&mut self, dir: &std::path::Path) {
        self.say(&format!("scratch {}", dir.display()));
    }

    /// Normal exit: the guard leaves without killing anything.
    pub fn disarm(mut self) {
        self.say("done");
    }
}

/// Body of the guard process. Never returns.
pub fn guard_main(agent_id: &str) -> ! {
    // Only the agent's end (its pipe closing) ends the guard: a SIGTERM meant for the job (Slurm
    // with proctrack/linuxproc signals every process) must not remove the safety net while the
    // agent is still stopping its workers.
    super::spawn::ignore_signals(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ]);
    let mut groups = BTreeSet::new();
    let mut scratch: Vec<std::path::PathBuf> = Vec::new();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.split_once(' ') {
            Some(("pg", n)) => {
                if let Ok(n) = n.parse::<i32>() {
                    groups.insert(n);
                }
            }
            Some(("unpg", n)) => {
                if let Ok(n) = n.parse::<i32>() {
                    groups.remove(&n);
                }
            }
            Some(("scratch", dir)) => scratch.push(dir.into()),
            _ if line == "done" => std::process::exit(0),
            _ => {}
        }
    }
    // End of file without "done": the agent is gone.
    for pass in 0..5 {
        for g in &groups {
            procs::signal_group(Pid::from_raw(*g), Signal::SIGKILL);
        }
        let left = procs::with_env("DRUN_AGENT_ID", agent_id);
        for p in &left {
            procs::signal_process(*p, Signal::SIGKILL);
        }
        if pass > 0 && left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for dir in scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
    std::process::exit(0)
}
