//! The store work of the agent's requests, one try each (the step decides what is tried, and
//! again when the store does not answer): join, success, failure budget, checkpoint commits,
//! save requests, reports, bad checkpoints, leaving; and what a standing-by node's session
//! reads of the run.

use super::actor::Actor;
use super::protocol::{CommitRefused, Event, Request};
use super::standby;
use super::state::{LeaseChange, Phase};
use crate::decisions::loss;
use crate::ledger::{LedgerError, NodeCommit, Retention};
use crate::{Plan, RendezvousError};

impl Actor {
    /// One try of a request's store work; `Some(phase)` replaces the phase. Duplicate joins,
    /// keep-alives and stand-bys are the step's alone.
    pub(super) async fn handle(
        &mut self,
        req: Request,
        phase: &mut Phase,
    ) -> Result<Option<Phase>, RendezvousError> {
        match req {
            Request::Join(cand, _) => {
                if let Some(end) = self.finished().await? {
                    self.emit(Event::Finished(end));
                    return Ok(Some(Phase::Idle));
                }
                self.join(cand).await.map(Some)
            }
            Request::Succeeded(g) => {
                self.round.state().record_done(g, &self.cfg.node_id).await?;
                if let Phase::Running(run) = &*phase {
                    if run.generation() == g {
                        self.maybe_finish(&run.plan).await?;
                    }
                }
                Ok(None)
            }
            Request::Failed { .. } => {
                unreachable!("a worker failure is decided by the step: a look for a loss, then the budget's stages")
            }
            Request::Commit { commit, retention } => {
                let running = match &*phase {
                    Phase::Running(run) => Some(run.plan.clone()),
                    _ => None,
                };
                self.commit(running.as_ref(), commit, retention).await?;
                Ok(None)
            }
            Request::Preempt { generation, reason } => {
                self.request_save(generation, reason, false).await?;
                Ok(None)
            }
            Request::Report { kind, json } => {
                self.report(kind, json.clone()).await?;
                match phase {
                    Phase::Running(run) if kind == crate::store::reports::ReportKind::Peers => {
                        self.accuse(run, &json).await?;
                        let plan = run.plan.clone();
                        self.judge_partition(&plan).await
                    }
                    _ => Ok(None),
                }
            }
            Request::MarkBad {
                generation,
                id,
                reason,
            } => {
                self.ledger.mark_bad(&id, &reason).await?;
                self.close(
                    generation,
                    format!(
                        "checkpoint {} failed verification on node {}: {reason}",
                        crate::ledger::describe_id(&id),
                        self.cfg.node_id
                    ),
                    false,
                )
                .await?;
                Ok(None)
            }
            Request::Unfit { reason } => {
                let end = crate::session::RunEnd {
                    success: false,
                    reason,
                    at_ms: crate::clock::now_ms(),
                    root_cause: None,
                    retryable: false,
                    unfit: true,
                };
                if self.round.state().end(&end).await? {
                    tracing::info!(run = %self.cfg.run_id, node = %self.cfg.node_id, "the run ends: the node cannot take part in a run of a fixed size");
                }
                Ok(None)
            }
            Request::Leave => {
                self.leave().await?;
                Ok(Some(Phase::Left))
            }
            Request::KeepAlive | Request::StandBy(_) => Ok(None),
        }
    }

    /// What a standing-by node's session reads of the run: its end, the current generation's
    /// live members and the waiting candidates.
    pub(super) async fn seen_standing_by(&self) -> Result<standby::Seen, RendezvousError> {
        if let Some(end) = self.finished().await? {
            return Ok(standby::Seen {
                finished: Some(end),
                ..standby::Seen::default()
            });
        }
        let (g, _) = self.round.current_generation().await?;
        let mut members = Vec::new();
        if g > 0 {
            if let Some(plan) = self.round.plan(g).await? {
                let live = self.round.live_members(g).await?;
                members = plan
                    .members
                    .iter()
                    .filter(|m| live.contains(&m.node_id))
                    .cloned()
                    .collect();
            }
        }
        let waiting = self
            .round
            .waiting()
            .await?
            .into_iter()
            .map(|j| j.candidate)
            .collect();
        Ok(standby::Seen {
            finished: None,
            members,
            waiting,
        })
    }

    /// Records this node's checkpoint report, if its generation runs here, and answers it.
    async fn commit(
        &mut self,
        running: Option<&Plan>,
        commit: NodeCommit,
        retention: Retention,
    ) -> Result<(), RendezvousError> {
        let result = match running {
            Some(plan) if plan.generation == commit.generation => {
                match self.ledger.commit(plan, &commit, retention).await {
                    Ok(o) => Ok(o),
                    Err(LedgerError::Store(e)) => return Err(e.into()),
                    Err(e) => Err(CommitRefused::Ledger(e.to_string())),
                }
            }
            _ => Err(CommitRefused::NotRunning {
                generation: commit.generation,
                node: self.cfg.node_id.clone(),
            }),
        };
        if let Err(e) = &result {
            tracing::warn!(
                step = commit.step,
                gen = commit.generation,
                "checkpoint commit refused: {e}"
            );
        }
        self.emit(Event::Committed {
            generation: commit.generation,
            step: commit.step,
            result,
        });
        Ok(())
    }

    /// Leaves the run: records why, revokes the lease (survivors re-form). After the run's end
    /// no one re-forms: the lease is left to expire, so that the other members, which may still
    /// be looking at their generation (a worker failure's attribution), see no loss in an agent
    /// that exits because the run ended.
    async fn leave(&mut self) -> Result<(), RendezvousError> {
        if let Some(l) = self.lease() {
            self.stop_keeper();
            if self.finished().await?.is_some() {
                return Ok(());
            }
            let state = self.round.state();
            state.record_lost(&self.cfg.node_id, loss::LEFT).await?;
            state.revoke_lease(l).await?;
            self.lease_changed(LeaseChange::Released);
        }
        Ok(())
    }
}
