//! The effects on this node's workers: spawn them for a generation, stop them, clean up after
//! them (descendants swept, output drained, the root cause), and reap their exits into the
//! [`Workers`] the machine is fed.

use std::path::PathBuf;
use std::time::Duration;

use drun_rendezvous::decisions::root_cause::RootCause;
use drun_rendezvous::Plan;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::{stage, World};
use crate::agent::state::{Input, Machine, Workers};
use crate::agent::Agent;
use crate::ckpt::api::ApiServer;
use crate::ckpt::node::NodeLedger;
use crate::group::{GroupContext, WorkerGroup};
use crate::summary::root_cause;

/// How long the agent waits for output readers after the workers are gone, once no byte moved.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

impl Agent {
    /// Reaps exited workers; the workers' state if it changed since last reported. `m`: the
    /// machine, which says whether the workers' end waits for the disk.
    pub(super) fn reaped(&self, m: &Machine, w: &mut World) -> Option<Workers> {
        let group = w.group.as_mut()?;
        for (pid, exit, ours) in group.reap() {
            if ours {
                if let Some(m) = &self.metrics {
                    m.worker_exit(exit);
                }
                self.guard()
                    .lock()
                    .expect("guard mutex poisoned")
                    .unwatch(pid);
                let (rank, pid) = (group.rank_of(pid), pid.as_raw());
                tracing::debug!(rank, pid, ?exit, "worker exited");
            } else if self
                .warm
                .lock()
                .expect("warm pool mutex poisoned")
                .exited(pid, exit)
            {
                tracing::debug!(pid = pid.as_raw(), ?exit, "a warm interpreter exited");
            } else {
                tracing::debug!(pid = pid.as_raw(), ?exit, "reaped a re-parented descendant");
            }
        }
        let first_success = group.first_success_at().map(|at| {
            let instant = match w.first_success {
                Some((t, i)) if t == at => i,
                _ => {
                    let waited = at.elapsed().unwrap_or_default();
                    let now = Instant::now();
                    now.checked_sub(waited).unwrap_or(now)
                }
            };
            w.first_success = Some((at, instant));
            (
                instant,
                group.partial_success_line(self.cfg.supervision.peer_exit_wait),
            )
        });
        let now = Workers {
            running: group.any_running(),
            failed: group.has_failure(),
            all_succeeded: group.all_succeeded(),
            first_success,
            finished: group.finished(),
        };
        if w.workers.as_ref() == Some(&now) {
            return None;
        }
        if let (true, Some(g)) = (now.failed, w.gpus.as_mut()) {
            g.suspect(now.running);
        }
        // The workers' end waits for their staged checkpoints to reach --ckpt-dir (bounded by
        // --shutdown-timeout) unless the group re-forms: the persister's outcome or the
        // monitor tick looks again.
        if !now.running
            && m.end_waits_for_disk()
            && w.stage
                .as_mut()
                .is_some_and(|s| s.hold_end(self.cfg.supervision.shutdown_timeout, m.end_forced()))
        {
            return None;
        }
        w.workers = Some(now.clone());
        Some(now)
    }

    pub(super) async fn spawn(
        &mut self,
        file: Option<PathBuf>,
        plan: &Plan,
        w: &mut World,
    ) -> Input {
        w.resume_file = file;
        let mut resume_staged = plan
            .resume
            .as_ref()
            .and_then(|m| Some((m, w.stage.as_ref()?.resume_dir(m)?)));
        // `--ckpt-verify digest` checked the copy on disk; the ranks would read this one. (A
        // resume from the survivors' copies verified what it gathered, and has no disk copy.)
        if let (Some((m, _)), Some(s), crate::ckpt::VerifyMode::Digest, None) = (
            &resume_staged,
            w.stage.as_ref(),
            self.cfg.ckpt.verify,
            &plan.resume_memory,
        ) {
            if let Some(why) = s.staged_differs(m).await {
                crate::say!(
                    "drun: warning: the staged copy in memory of checkpoint step {} is not what its manifest says ({why}): resuming from --ckpt-dir, whose copy was verified",
                    m.step
                );
                resume_staged = None;
            }
        }
        let resume_staged = resume_staged.map(|(m, dir)| {
            tracing::info!(
                step = m.step,
                "resuming from the staged copy in memory ({}), not from --ckpt-dir",
                dir.display()
            );
            dir
        });
        if let Some(s) = w.stage.as_mut() {
            s.workers_started();
            if plan.resume_memory.is_some() {
                s.persist_resumed(plan, &self.cfg.node_id);
            }
        }
        let ctx = GroupContext {
            agent_sock: self.api.as_ref().map(ApiServer::path),
            resume_manifest: w.resume_file.as_deref(),
            cfg: &self.cfg,
            os: self.os.clone(),
            guard: self.guard(),
            agent_id: &self.agent_id,
            hostname: &self.hostname,
            inherited: &self.inherited,
            run_log_dir: &self.run_log_dir,
            preflight: crate::agent::preflight::for_plan(self.preflight.as_deref(), plan),
            warm: Some(&self.warm),
            ckpt_stage: w
                .stage
                .as_ref()
                .map(|s| (s.dir(), s.rank_share(self.cfg.workers.nproc_per_node))),
            resume_staged: resume_staged.as_deref(),
        };
        w.workers = None;
        w.first_success = None;
        match WorkerGroup::start(&ctx, plan, plan.restarts_failures).await {
            Ok(g) => {
                crate::warm::refill(&ctx, plan, plan.restarts_failures).await;
                self.print_rank_table(plan, &g);
                w.group = Some(g);
                w.ledger = Some(
                    NodeLedger::new(plan, &self.cfg.node_id, self.cfg.ckpt.dir.as_deref())
                        .with_stage(w.stage.as_ref().map(stage::Stage::dir)),
                );
                Input::Spawned
            }
            Err((partial, e)) => {
                w.group = Some(partial);
                let why = e.to_string();
                w.fatal = Some(e);
                Input::SpawnFailed(why)
            }
        }
    }

    /// Closes the ledger (ranks waiting on a commit are told the group is stopping) and sends
    /// `sig` to every running worker's process group, once.
    pub(super) fn stop(&self, sig: Signal, w: &mut World) {
        w.reached_before = w.ledger.take().and_then(|l| l.reached());
        if let Some(m) = &self.metrics {
            m.stopping(Instant::now());
        }
        // Reported afresh: the stop waits for "no worker runs", even if none ran already.
        w.workers = None;
        let Some(group) = w.group.as_mut() else {
            return;
        };
        group.mark_stopping();
        if group.any_running() {
            group.stop_running(sig);
        }
    }

    /// Every worker is gone: kill what they left behind, drain their output; the root cause
    /// when a worker failed.
    pub(super) async fn cleanup(&mut self, w: &mut World) -> Input {
        self.sweep_descendants().await;
        let mut cause = None;
        if let Some(group) = w.group.as_mut() {
            group.drain_output(DRAIN_WAIT).await;
            let failures = group.failures();
            cause = root_cause(&failures)
                .map(|i| failures[i].root_cause(&self.cfg.node_id, &self.hostname));
        }
        Input::Stopped {
            failure: cause.as_ref().map(RootCause::line),
            cause,
        }
    }
}
