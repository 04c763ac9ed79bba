//! One generation's local worker group: spawn, record exits, signal, drain output.
//!
//! All worker state transitions happen here ([`WorkerState`]); the agent loop decides when.
//! The group reaches the operating system only through [`Os`] (so it is tested with
//! [`crate::os::fake::FakeOs`]). The stop sequence (signal, grace, SIGKILL) is the agent's
//! `Stopping` phase ([`crate::agent::state::StopStage`]); the group only signals and records.

/// A worker's stdin: drun's own for the `--stdin-rank` local rank, `/dev/null` for the others;
/// a warm interpreter gets its rank's.
pub(crate) fn worker_stdin(cfg: &LaunchConfig, local_rank: u32) -> Input {
    if cfg.stdin_rank == Some(local_rank) {
        Input::Inherit
    } else {
        Input::Null
    }
}

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use drun_rendezvous::Plan;
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::env::{worker_env, WorkerSlot};
use crate::logs::{self, Console, Sink, Tail};
use crate::os::guard::Guard;
use crate::os::spawn::{ExitKind, Input, Output, SpawnSpec};
use crate::os::Os;
use crate::summary::Failure;
use crate::warm::WarmPool;
use crate::{LaunchConfig, LaunchError};

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

/// What the group needs from the agent to start.
#[derive(Debug)]
pub struct GroupContext<'a> {
    /// Launch configuration.
    pub cfg: &'a LaunchConfig,
    /// The operating system (spawning, reaping, signalling).
    pub os: Arc<dyn Os>,
    /// Cleanup guard to tell about process groups.
    pub guard: &'a Mutex<Guard>,
    /// DRUN_AGENT_ID.
    pub agent_id: &'a str,
    /// Short hostname (for `${hostname}`).
    pub hostname: &'a str,
    /// The agent's environment, inherited by workers.
    pub inherited: &'a BTreeMap<OsString, OsString>,
    /// `<log_dir>/<run>_<rand>`.
    pub run_log_dir: &'a Path,
    /// The worker API socket (DRUN_AGENT_SOCK), if it could be opened.
    pub agent_sock: Option<&'a Path>,
    /// Manifest file of the plan's resume point (DRUN_RESUME_MANIFEST).
    pub resume_manifest: Option<&'a Path>,
    /// `--preflight`'s check script, when this generation runs it before the training script.
    pub preflight: Option<&'a Path>,
    /// The agent's staging directory (DRUN_CKPT_STAGE_DIR, `--ckpt-memory`).
    pub ckpt_stage: Option<&'a Path>,
    /// The staged copy of the plan's resume point, when this agent holds it complete.
    pub resume_staged: Option<&'a Path>,
    /// The warm interpreters workers may start on ([`crate::warm`]); `None`: all start cold.
    pub warm: Option<&'a Mutex<WarmPool>>,
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

/// A worker just forked, its output not read yet.
struct Started {
    local_rank: u32,
    rank: u32,
    pid: Pid,
    at: Instant,
    dir: PathBuf,
    error_file: PathBuf,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

/// The complete environment of local rank `local_rank`'s worker of `plan` (what
/// [`worker_env`] builds from the context).
pub(crate) fn env_of(
    ctx: &GroupContext<'_>,
    plan: &Plan,
    local_rank: u32,
    restart_count: u32,
    error_file: &Path,
) -> BTreeMap<OsString, OsString> {
    let cfg = ctx.cfg;
    let member = plan
        .member(&cfg.node_id)
        .expect("the agent only starts workers of plans it is a member of");
    worker_env(
        ctx.inherited,
        plan,
        member,
        &WorkerSlot {
            local_rank,
            restart_count,
            max_restarts: cfg.supervision.max_restarts,
            role: &cfg.role,
            error_file,
            signals_to_handle: &cfg.supervision.signals_to_handle,
            use_agent_store: cfg.worker_store.use_agent_store(),
            agent_id: ctx.agent_id,
            agent_sock: ctx.agent_sock,
            ckpt_dir: cfg.ckpt.dir.as_deref(),
            resume_manifest: ctx.resume_manifest,
            ckpt_stage: ctx.ckpt_stage,
            resume_staged: ctx.resume_staged,
            virtual_local_rank: cfg.virtual_local_rank,
            flight_recorder: cfg.observe.hang_timeout.is_some(),
        },
    )
}

/// A worker's stdout tail, stderr tail and their reader threads.
type Pumps = (Arc<Mutex<Tail>>, Arc<Mutex<Tail>>, Vec<JoinHandle<()>>);

fn open_log(dir: &Path, name: &str) -> Result<File, LaunchError> {
    let p = dir.join(name);
    File::create(&p)
        .map_err(|e| LaunchError::os(format!("cannot create log file {}", p.display()), e))
}

impl WorkerGroup {
    /// Spawns this node's workers for `plan` with TORCHELASTIC_RESTART_COUNT = `restart_count`.
    /// On a spawn error the workers already started are killed and reaped by the caller's stop.
    pub async fn start(
        ctx: &GroupContext<'_>,
        plan: &Plan,
        restart_count: u32,
    ) -> Result<Self, (Self, LaunchError)> {
        let mut group = WorkerGroup {
            workers: Vec::new(),
            generation: plan.generation,
            stopping: false,
            os: ctx.os.clone(),
            moved: Arc::default(),
        };
        match group.spawn_all(ctx, plan, restart_count).await {
            Ok(()) => Ok(group),
            Err(e) => Err((group, e)),
        }
    }

    async fn spawn_all(
        &mut self,
        ctx: &GroupContext<'_>,
        plan: &Plan,
        restart_count: u32,
    ) -> Result<(), LaunchError> {
        let cfg = ctx.cfg;
        let member = plan
            .member(&cfg.node_id)
            .expect("the agent only starts workers of plans it is a member of");
        let attempt = ctx.run_log_dir.join(format!("attempt_{restart_count}"));
        if attempt.exists() {
            // torchrun's DefaultLogsSpecs.reify rmtree's a reused attempt directory too.
            std::fs::remove_dir_all(&attempt)
                .map_err(|e| LaunchError::os(format!("cannot clear {}", attempt.display()), e))?;
        }
        let mut started = Vec::new();
        let mut error = None;
        for local_rank in 0..member.slots {
            match Self::spawn_one(ctx, plan, &attempt, local_rank, restart_count).await {
                Ok(s) => started.push(s),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        // The output readers (two threads per worker) start once every worker is forked: each
        // fork copies the agent's mappings, and hundreds of reader threads' stacks made every
        // later fork slower (128 workers took 1.5 s instead of well under a second).
        for s in started {
            let pumps = self.pump_output(ctx, &s.dir, s.rank, s.local_rank, s.stdout, s.stderr);
            let (out_tail, err_tail, readers) = match pumps {
                Ok(p) => p,
                Err(e) => {
                    error.get_or_insert(e);
                    Default::default()
                }
            };
            self.workers.push(Worker {
                local_rank: s.local_rank,
                rank: s.rank,
                pid: s.pid,
                state: WorkerState::Running { since: s.at },
                error_file: s.error_file,
                out_tail,
                err_tail,
                readers,
            });
        }
        error.map_or(Ok(()), Err)
    }

    /// Spawns local rank `local_rank` with its environment and log directory under `attempt`
    /// (its output readers start in [`Self::spawn_all`]).
    async fn spawn_one(
        ctx: &GroupContext<'_>,
        plan: &Plan,
        attempt: &Path,
        local_rank: u32,
        restart_count: u32,
    ) -> Result<Started, LaunchError> {
        let cfg = ctx.cfg;
        let member = plan
            .member(&cfg.node_id)
            .expect("the agent only starts workers of plans it is a member of");
        let dir = attempt.join(local_rank.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| LaunchError::os(format!("cannot create log dir {}", dir.display()), e))?;
        let error_file = dir.join("error.json");
        let spec = SpawnSpec {
            program: cfg.entrypoint.program.clone(),
            args: match ctx.preflight {
                Some(check) => crate::preflight::argv(&cfg.entrypoint, check, local_rank),
                None => cfg.entrypoint.argv(local_rank),
            },
            env: env_of(ctx, plan, local_rank, restart_count, &error_file),
            output: Output::Piped,
            stdin: worker_stdin(cfg, local_rank),
            die_with_agent: true,
            handoff: None,
            cpus: cfg
                .numa
                .as_ref()
                .and_then(|b| b.for_rank(local_rank))
                .cloned(),
        };
        let warm = ctx.warm.and_then(|pool| {
            let mut pool = pool.lock().expect("warm pool mutex poisoned");
            pool.hand_off(local_rank, &spec, ctx.preflight.is_some())
        });
        let warm_start = warm.is_some();
        let spawned = match warm {
            Some(spawned) => spawned,
            None => ctx.os.spawn(spec).await.map_err(|e| {
                LaunchError::WorkerStart(crate::os::exec_error::describe(
                    &cfg.entrypoint.program,
                    &e,
                ))
            })?,
        };
        ctx.guard
            .lock()
            .expect("guard mutex poisoned")
            .watch(spawned.pid);
        let rank = member.base_rank + local_rank;
        tracing::debug!(
            rank,
            local_rank,
            pid = spawned.pid.as_raw(),
            warm = warm_start,
            "worker started"
        );
        Ok(Started {
            local_rank,
            rank,
            pid: spawned.pid,
            at: Instant::now(),
            dir,
            error_file,
            stdout: spawned.stdout,
            stderr: spawned.stderr,
        })
    }

    /// Starts the readers of a worker's stdout and stderr: console (prefixed, filtered),
    /// log files (--redirects/--tee) and the tails kept for the failure summary.
    fn pump_output(
        &self,
        ctx: &GroupContext<'_>,
        dir: &Path,
        rank: u32,
        local_rank: u32,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    ) -> Result<Pumps, LaunchError> {
        let cfg = ctx.cfg;
        let redirect = cfg.output.redirects.for_rank(local_rank);
        let tee = cfg.output.tee.for_rank(local_rank);
        let shown = cfg
            .output
            .local_ranks_filter
            .as_ref()
            .is_none_or(|f| f.contains(&local_rank));
        let prefix = logs::prefix(
            cfg.output.prefix_template.as_deref(),
            &cfg.role,
            local_rank,
            rank,
            ctx.hostname,
        );
        let out_tail = Arc::new(Mutex::new(Tail::default()));
        let err_tail = Arc::new(Mutex::new(Tail::default()));
        let mut readers = Vec::new();
        for (fd, console, redirected, teed, file_name, tail, tag) in [
            (
                stdout,
                Console::Stdout,
                redirect.out,
                tee.out,
                "stdout.log",
                &out_tail,
                "out",
            ),
            (
                stderr,
                Console::Stderr,
                redirect.err,
                tee.err,
                "stderr.log",
                &err_tail,
                "err",
            ),
        ] {
            let Some(fd) = fd else { continue };
            let file = if redirected || teed {
                Some(open_log(dir, file_name)?)
            } else {
                None
            };
            let to_console = shown && (teed || !redirected);
            let sink = Sink {
                console: to_console.then(|| (console, prefix.clone())),
                file,
                tail: tail.clone(),
                moved: self.moved.clone(),
            };
            let h = logs::pump(fd, sink, format!("drun-log-{rank}-{tag}"))
                .map_err(|e| LaunchError::os("cannot start an output reader thread", e))?;
            readers.push(h);
        }
        Ok((out_tail, err_tail, readers))
    }

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

    /// Waits (polling) for the output readers to reach end of file, so the last lines and the
    /// tails are complete, as long as they move bytes ([`logs::drain`]): readers quiet for
    /// `quiet_limit` are left behind.
    pub async fn drain_output(&mut self, quiet_limit: std::time::Duration) {
        let mut seen = self.moved.load(Ordering::Relaxed);
        let mut moved_at = tokio::time::Instant::now();
        loop {
            let all_done = self
                .workers
                .iter()
                .all(|w| w.readers.iter().all(JoinHandle::is_finished));
            let now = tokio::time::Instant::now();
            let moved = self.moved.load(Ordering::Relaxed);
            if moved != seen {
                (seen, moved_at) = (moved, now);
            }
            if logs::drain(all_done, now - moved_at, quiet_limit) != logs::Drain::Wait {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        for w in &mut self.workers {
            let (done, pending): (Vec<_>, Vec<_>) =
                w.readers.drain(..).partition(JoinHandle::is_finished);
            for h in done {
                let _ = h.join();
            }
            if !pending.is_empty() {
                tracing::debug!(rank = w.rank, "output reader still blocked; leaving it");
            }
        }
    }
}
