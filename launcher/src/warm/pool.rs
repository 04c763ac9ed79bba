//! [`WarmPool`]: the warm interpreters of this node, one per local rank, started for the next
//! generation, handed off to or killed. Processes only through [`Os`].

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drun_rendezvous::Plan;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::decide::{choose, eligibility, next_generation, NotWarm, ScriptFile, Start, Status};
use super::handoff::{self, FD_VAR};
use crate::command::EntryKind;
use crate::group::GroupContext;
use crate::os::spawn::{ExitKind, Output, SpawnSpec, Spawned, HANDOFF_FD};
use crate::os::Os;
use crate::LaunchConfig;

/// How long the hand-off may take to write (it fits the socket's buffer unless the
/// environment is huge; then the interpreter reads it once its import is done).
const HANDOFF_WRITE: Duration = Duration::from_secs(10);

/// One warm interpreter: the agent's child, blocked on its hand-off socket.
#[derive(Debug)]
struct Warm {
    pid: Pid,
    sock: UnixStream,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    since: Instant,
    status: Status,
    /// Its status line, as far as read.
    heard: Vec<u8>,
}

impl Warm {
    /// Reads what the interpreter said so far without blocking; updates the status once its
    /// line is complete. True when the status changed.
    fn listen(&mut self) -> bool {
        if self.status != Status::Importing {
            return false;
        }
        let _ = self.sock.set_nonblocking(true);
        let mut buf = [0u8; 512];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.heard.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let Some(end) = self.heard.iter().position(|b| *b == b'\n') else {
            return false;
        };
        match handoff::status(&self.heard[..end]) {
            Some(s) => {
                self.status = s;
                true
            }
            None => false,
        }
    }

    /// Writes the hand-off; the interpreter is the worker from now on.
    fn hand_off(self, message: &[u8]) -> Result<Spawned, (Pid, io::Error)> {
        let mut sock = self.sock;
        let sent = sock
            .set_nonblocking(false)
            .and_then(|()| sock.set_write_timeout(Some(HANDOFF_WRITE)))
            .and_then(|()| sock.write_all(message));
        match sent {
            Ok(()) => Ok(Spawned {
                pid: self.pid,
                stdout: self.stdout,
                stderr: self.stderr,
            }),
            Err(e) => Err((self.pid, e)),
        }
    }
}

/// This node's warm interpreters by local rank, and whether this run may have any.
#[derive(Debug)]
pub struct WarmPool {
    os: Arc<dyn Os>,
    /// Why the workers of this run cannot start warm (decided at start, or once the first
    /// interpreter could not import torch).
    eligible: Result<(), NotWarm>,
    slots: BTreeMap<u32, Warm>,
    /// A generation started (so a later start is a restart, where a cold start is said).
    started: bool,
    /// The run's reason for cold restarts was said.
    said: bool,
}

impl WarmPool {
    /// The pool for `cfg`'s workers (the script is looked at once, here).
    pub fn new(cfg: &LaunchConfig, os: Arc<dyn Os>) -> Self {
        let script = match cfg.workers.entrypoint.kind {
            EntryKind::Script => ScriptFile::inspect(Path::new(&cfg.workers.entrypoint.script)),
            _ => ScriptFile::Other("not a script"),
        };
        Self {
            os,
            eligible: eligibility(
                cfg.workers.warm_workers,
                cfg.workers.entrypoint.kind,
                script,
            ),
            slots: BTreeMap::new(),
            started: false,
            said: false,
        }
    }

    /// The local ranks (of `slots`) that need a warm interpreter for the next generation.
    fn wanted(&mut self, slots: u32) -> Vec<u32> {
        self.started = true;
        if self.eligible.is_err() {
            return Vec::new();
        }
        (0..slots).filter(|r| !self.slots.contains_key(r)).collect()
    }

    /// Reads the interpreters' status lines; the first that cannot import torch turns warm
    /// workers off for the run (every other would fail alike).
    pub fn poll(&mut self) {
        let mut no_torch = None;
        for (rank, w) in &mut self.slots {
            if !w.listen() {
                continue;
            }
            match &w.status {
                Status::Ready { import, threads } => tracing::debug!(
                    local_rank = rank,
                    pid = w.pid.as_raw(),
                    import_ms = import.as_millis() as u64,
                    threads,
                    waited_ms = w.since.elapsed().as_millis() as u64,
                    "warm interpreter ready"
                ),
                Status::NoTorch(e) => no_torch = Some(e.clone()),
                Status::Importing | Status::Exited(_) => {}
            }
        }
        if let Some(e) = no_torch {
            tracing::debug!(error = %e, "the warm interpreter cannot import torch; warm workers off");
            self.eligible = Err(NotWarm::NoTorch(e));
            self.kill_all();
        }
    }

    /// How many warm interpreters have not imported torch yet (their status lines read
    /// first), and since when the oldest of them runs.
    pub fn importing(&mut self) -> (usize, Option<Instant>) {
        self.poll();
        let busy = self
            .slots
            .values()
            .filter(|w| w.status == Status::Importing);
        (busy.clone().count(), busy.map(|w| w.since).min())
    }

    /// Notes that child `pid` exited; true if it was a warm interpreter.
    pub fn exited(&mut self, pid: Pid, exit: ExitKind) -> bool {
        match self.slots.values_mut().find(|w| w.pid == pid) {
            Some(w) => {
                w.status = Status::Exited(exit);
                true
            }
            None => false,
        }
    }

    /// The warm interpreters' pids (the teardown sweep spares them).
    pub fn pids(&self) -> Vec<Pid> {
        self.slots.values().map(|w| w.pid).collect()
    }

    /// Kills every warm interpreter (SIGKILL: it runs nothing of the user's yet); returns
    /// their pids, to be reaped.
    pub fn kill_all(&mut self) -> Vec<Pid> {
        let pids = self.pids();
        for pid in &pids {
            let _ = self.os.killpg(*pid, Signal::SIGKILL);
        }
        self.slots.clear();
        pids
    }

    /// Starts local rank `local_rank`'s worker `spec` on its warm interpreter if it should
    /// ([`choose`]); `None`: start it cold (the reason, if any, was logged).
    pub fn hand_off(
        &mut self,
        local_rank: u32,
        spec: &SpawnSpec,
        preflight: bool,
    ) -> Option<Spawned> {
        self.poll();
        let warm = self.slots.remove(&local_rank);
        match choose(&self.eligible, preflight, warm.as_ref().map(|w| &w.status)) {
            Start::Warm => {}
            Start::Cold(why) => {
                if let Some(w) = warm {
                    let _ = self.os.killpg(w.pid, Signal::SIGKILL);
                }
                match (why, &self.eligible) {
                    (Some(why), _) => tracing::info!("local rank {local_rank}: cold start: {why}"),
                    (None, Err(why)) if self.started && !self.said => {
                        self.said = true;
                        tracing::info!("warm workers off: {why}; restarted workers start cold");
                    }
                    _ => {}
                }
                return None;
            }
        }
        let warm = warm.expect("choose() starts warm only with a warm interpreter");
        let ready = warm.status != Status::Importing;
        let cwd = std::env::current_dir().unwrap_or_default();
        let message = handoff::message(&spec.program, &spec.args, &spec.env, &cwd);
        match warm.hand_off(&message) {
            Ok(spawned) => {
                tracing::debug!(
                    local_rank,
                    pid = spawned.pid.as_raw(),
                    ready,
                    "handed off to the warm interpreter"
                );
                Some(spawned)
            }
            Err((pid, e)) => {
                let _ = self.os.killpg(pid, Signal::SIGKILL);
                tracing::info!(
                    "local rank {local_rank}: cold start: its warm interpreter did not take the hand-off ({e})"
                );
                None
            }
        }
    }
}

/// Starts a warm interpreter for every local rank of `plan` that has none, with the
/// environment a worker of this generation has (what `import torch` reads is the same in every
/// generation: the agent's environment, OMP_NUM_THREADS as drun sets it). A spawn that fails
/// turns warm workers off for the run. None when no generation can follow this one
/// ([`next_generation`]: one node and no restart left), since it would import torch for nothing.
pub async fn refill(ctx: &GroupContext<'_>, plan: &Plan, restart_count: u32) {
    let Some(pool) = ctx.warm else { return };
    let cfg = ctx.cfg;
    let one_node = matches!(
        cfg.rdzv.mode,
        crate::config::RendezvousMode::Embedded { .. }
    );
    if let Err(why) = next_generation(one_node, restart_count, cfg.supervision.max_restarts) {
        // Said only where warm workers are on: with them off the run says so once, at start.
        if pool
            .lock()
            .expect("warm pool mutex poisoned")
            .eligible
            .is_ok()
        {
            tracing::debug!(gen = plan.generation, "no spare interpreters: {why}");
        }
        return;
    }
    let Some(member) = plan.member(&cfg.node_id) else {
        return;
    };
    let wanted = pool
        .lock()
        .expect("warm pool mutex poisoned")
        .wanted(member.slots);
    for local_rank in wanted {
        let error_file = ctx
            .run_log_dir
            .join(format!("attempt_{restart_count}"))
            .join(local_rank.to_string())
            .join("error.json");
        let env = crate::group::env_of(ctx, plan, local_rank, restart_count, &error_file);
        if !start_one(pool, &ctx.os, cfg, local_rank, env).await {
            return;
        }
    }
}

/// Before the first generation: starts a warm interpreter for each of this node's
/// `cfg.nproc_per_node` local ranks, so that `import torch` runs while the agent waits for the
/// rendezvous instead of after it. Their environment is [`crate::env::base_env`]: all that the
/// import reads of what drun sets; the plan's variables come with the hand-off. Nothing when
/// the run's workers cannot start warm, or when the first generation runs `--preflight` first
/// (its workers start cold).
pub async fn prestart(
    pool: &std::sync::Mutex<WarmPool>,
    os: &Arc<dyn Os>,
    cfg: &LaunchConfig,
    inherited: &BTreeMap<std::ffi::OsString, std::ffi::OsString>,
) {
    let wanted: Vec<u32> = {
        let pool = pool.lock().expect("warm pool mutex poisoned");
        if pool.eligible.is_err() || cfg.observe.preflight.is_some() {
            return;
        }
        (0..cfg.workers.nproc_per_node)
            .filter(|r| !pool.slots.contains_key(r))
            .collect()
    };
    let env = crate::env::base_env(
        inherited,
        cfg.workers.nproc_per_node,
        cfg.observe.hang_timeout.is_some(),
    );
    for local_rank in wanted {
        if !start_one(pool, os, cfg, local_rank, env.clone()).await {
            return;
        }
    }
}

/// Spawns local rank `local_rank`'s warm interpreter with `env` and keeps it in `pool`; false
/// (warm workers off for the run) when it cannot be spawned.
async fn start_one(
    pool: &std::sync::Mutex<WarmPool>,
    os: &Arc<dyn Os>,
    cfg: &LaunchConfig,
    local_rank: u32,
    mut env: BTreeMap<std::ffi::OsString, std::ffi::OsString>,
) -> bool {
    env.insert(FD_VAR.into(), HANDOFF_FD.to_string().into());
    env.insert(handoff::SOURCE_VAR.into(), handoff::BOOTSTRAP.into());
    let entry = &cfg.workers.entrypoint;
    let started = UnixStream::pair().map(|(ours, theirs)| (ours, OwnedFd::from(theirs)));
    let spawned = match started {
        Ok((ours, theirs)) => os
            .spawn(SpawnSpec {
                program: cfg.workers.entrypoint.program.clone(),
                args: handoff::warm_args(
                    &entry.argv(local_rank),
                    entry.leading.len().saturating_sub(1),
                ),
                env,
                output: Output::Piped,
                stdin: crate::group::worker_stdin(cfg, local_rank),
                die_with_agent: true,
                handoff: Some(theirs),
                cpus: cfg.workers.cpus_of(local_rank),
            })
            .await
            .map(|s| (s, ours)),
        Err(e) => Err(e),
    };
    let mut pool = pool.lock().expect("warm pool mutex poisoned");
    match spawned {
        Ok((s, sock)) => {
            tracing::debug!(local_rank, pid = s.pid.as_raw(), "warm interpreter started");
            pool.slots.insert(
                local_rank,
                Warm {
                    pid: s.pid,
                    sock,
                    stdout: s.stdout,
                    stderr: s.stderr,
                    since: Instant::now(),
                    status: Status::Importing,
                    heard: Vec::new(),
                },
            );
            true
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot start a warm interpreter; warm workers off");
            pool.eligible = Err(NotWarm::CannotStart(e.to_string()));
            false
        }
    }
}
