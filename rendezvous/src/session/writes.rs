//! The session's guarded store writes: close a generation, request a save, the exit barrier, the failure budget.

use super::actor::Actor;
use super::protocol::{Event, SaveRequest};
use super::state::{BudgetSeen, BudgetStage, Spending};
use super::verdicts;
use crate::clock::now_ms;
use crate::store::records::{FailureRecord, RestartCause};
use crate::store::run_state::session::SpendRestart;
use crate::{Plan, RendezvousError};

impl Actor {
    /// Writes this node's report of `kind` (a refused one is dropped with a warning: reports
    /// only feed `status`); a pace report is answered with the job's pace.
    pub(super) async fn report(
        &self,
        kind: crate::store::reports::ReportKind,
        json: String,
    ) -> Result<(), RendezvousError> {
        if let Some(why) = crate::store::reports::invalid(&json) {
            tracing::warn!(node = %self.cfg.node_id, "{why}; dropped");
            return Ok(());
        }
        let lease = if kind.leased() { self.lease() } else { None };
        if kind.leased() && lease.is_none() {
            return Ok(());
        }
        let generation = (kind == crate::store::reports::ReportKind::Pace)
            .then(|| serde_json::from_str::<serde_json::Value>(&json).ok())
            .flatten()
            .and_then(|v| v["generation"].as_u64());
        let state = self.round.state();
        state
            .put_report(kind, &self.cfg.node_id, json, lease)
            .await?;
        if let Some(g) = generation {
            let pace = state.pace(g).await?;
            self.emit(Event::Pace(pace));
        }
        Ok(())
    }

    /// Closes generation `g` once (guarded) for a membership change, with `reason`, and counts
    /// one membership restart. `failure`: a node was lost (not a newcomer admitted, nor a bad
    /// checkpoint): recorded in the job-wide failure history in the same transaction.
    pub(super) async fn close(
        &self,
        g: u64,
        reason: String,
        failure: bool,
    ) -> Result<bool, RendezvousError> {
        let (cur, rev) = self.round.current_generation().await?;
        if cur != g {
            return Ok(false);
        }
        let record = failure.then(|| failure_record(g, &reason));
        let closed = self
            .round
            .state()
            .close(g, rev, &reason, record.as_ref())
            .await?;
        if closed {
            tracing::info!(run = %self.cfg.run_id, gen = g, %reason, "generation closed for re-form");
            crate::server::metrics::global().reformed(&self.cfg.run_id, &reason);
            self.round.record_restart(RestartCause::Membership).await?;
        }
        Ok(closed)
    }

    /// Writes generation `g`'s request for a coordinated checkpoint, once (`gen/<g>/preempt`, or
    /// `gen/<g>/scale-up-save` for a scale-up); every member sees it through its watch. Returns
    /// `ckpt/latest` at the time: a newer manifest id is the requested save.
    pub(super) async fn request_save(
        &self,
        g: u64,
        reason: String,
        scale_up: bool,
    ) -> Result<String, RendezvousError> {
        let state = self.round.state();
        let latest_before = state
            .ckpt_latest()
            .await?
            .map(|(id, _)| id)
            .unwrap_or_default();
        let req = SaveRequest {
            node_id: self.cfg.node_id.clone(),
            reason,
            latest_before: latest_before.clone(),
            at_ms: now_ms(),
            scale_up,
            interval: false,
        };
        state.request_save(g, &req).await?;
        Ok(latest_before)
    }

    /// Whether a node outside `plan` is waiting to join (a newcomer, not a member's own join).
    pub(super) async fn newcomer_waiting(&self, plan: &Plan) -> Result<bool, RendezvousError> {
        Ok(self
            .round
            .state()
            .waiting_nodes()
            .await?
            .iter()
            .any(|node| plan.member(node).is_none()))
    }

    /// The exit barrier: writes `finished` once every member of `plan` recorded its success.
    pub(super) async fn maybe_finish(&self, plan: &Plan) -> Result<(), RendezvousError> {
        let state = self.round.state();
        let done = state.done_nodes(plan.generation).await?;
        if let Some(end) = verdicts::exit_barrier(plan, &done, now_ms()) {
            state.finish(plan.generation, &end).await?;
        }
        Ok(())
    }

    /// One stage of deciding a worker failure against the job-wide budget (the step judges
    /// between the stages with [`super::verdicts::failure_verdict`]): read the counters, the
    /// current generation and whether it is closed; spend one restart and close the
    /// generation, guarded on what was read, with the failure as `g`'s root cause and in the
    /// failure history; or end the run as failed and read back its root cause as recorded
    /// (another node's when its failure ended the run first).
    pub(super) async fn budget(
        &self,
        spending: &Spending,
        stage: &BudgetStage,
    ) -> Result<BudgetSeen, RendezvousError> {
        let state = self.round.state();
        let g = spending.generation;
        let cause = spending.cause.as_ref();
        Ok(match stage {
            BudgetStage::Read => BudgetSeen::Read {
                restarts: state.restarts().await?,
                current: self.round.current_generation().await?,
                closed: state.closed(g).await?,
                at_ms: now_ms(),
            },
            BudgetStage::Spend {
                gen_rev,
                restarts_rev,
                next,
                closed,
            } => {
                let failure = failure_record(g, &spending.description);
                let won = state
                    .spend_restart(SpendRestart {
                        g,
                        gen_rev: *gen_rev,
                        restarts_rev: *restarts_rev,
                        next,
                        closed,
                        root_cause: cause,
                        failure: &failure,
                    })
                    .await?;
                BudgetSeen::Spent {
                    won,
                    next: next.clone(),
                    closed: closed.clone(),
                }
            }
            BudgetStage::End { end, last } => {
                state.end_spent(g, end, last, cause).await?;
                let recorded = state.finished().await?;
                BudgetSeen::Ended {
                    last: last.clone(),
                    cause: recorded
                        .and_then(|e| e.root_cause)
                        .or_else(|| end.root_cause.clone()),
                }
            }
        })
    }
}

/// `g`'s record in the job-wide failure history (now, and why).
fn failure_record(g: u64, reason: &str) -> FailureRecord {
    FailureRecord {
        generation: g,
        at_ms: now_ms(),
        reason: reason.to_string(),
    }
}
