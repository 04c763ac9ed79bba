//! Starting a generation's workers: each local rank's command, environment, stdin, log
//! directory and CPUs, on a warm interpreter when one waits ([`crate::warm`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use drun_rendezvous::Plan;
use nix::unistd::Pid;

use crate::env::{worker_env, WorkerSlot};
use crate::os::guard::Guard;
use crate::os::spawn::{Input, Output, SpawnSpec};
use crate::os::Os;
use crate::warm::WarmPool;
use crate::{LaunchConfig, LaunchError};

use super::{Worker, WorkerGroup, WorkerState};

/// A worker's stdin: drun's own for the `--stdin-rank` local rank, `/dev/null` for the others;
/// a warm interpreter gets its rank's.
pub(crate) fn worker_stdin(cfg: &LaunchConfig, local_rank: u32) -> Input {
    if cfg.workers.stdin_rank == Some(local_rank) {
        Input::Inherit
    } else {
        Input::Null
    }
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
    /// The agent's staging directory (DRUN_CKPT_STAGE_DIR, `--ckpt-memory`) and a local
    /// rank's share of its budget (DRUN_CKPT_STAGE_SHARE).
    pub ckpt_stage: Option<(&'a Path, u64)>,
    /// The staged copy of the plan's resume point, when this agent holds it complete.
    pub resume_staged: Option<&'a Path>,
    /// The warm interpreters workers may start on ([`crate::warm`]); `None`: all start cold.
    pub warm: Option<&'a Mutex<WarmPool>>,
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
            role: &cfg.workers.role,
            error_file,
            signals_to_handle: &cfg.supervision.signals_to_handle,
            use_agent_store: cfg.workers.worker_store.use_agent_store(),
            agent_id: ctx.agent_id,
            agent_sock: ctx.agent_sock,
            ckpt_dir: cfg.ckpt.dir.as_deref(),
            resume_manifest: ctx.resume_manifest,
            ckpt_stage: ctx.ckpt_stage,
            resume_staged: ctx.resume_staged,
            virtual_local_rank: cfg.workers.virtual_local_rank,
            flight_recorder: cfg.observe.hang_timeout.is_some(),
        },
    )
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
            program: cfg.workers.entrypoint.program.clone(),
            args: match ctx.preflight {
                Some(check) => crate::preflight::argv(&cfg.workers.entrypoint, check, local_rank),
                None => cfg.workers.entrypoint.argv(local_rank),
            },
            env: env_of(ctx, plan, local_rank, restart_count, &error_file),
            output: Output::Piped,
            stdin: worker_stdin(cfg, local_rank),
            die_with_agent: true,
            handoff: None,
            cpus: cfg.workers.cpus_of(local_rank),
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
                    &cfg.workers.entrypoint.program,
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
}
