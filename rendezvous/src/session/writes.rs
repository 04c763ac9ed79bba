//! The session's guarded store writes: close a generation, request a save, the exit barrier, the failure budget.

use super::actor::Actor;
use super::generation::{self, FailureVerdict};
use super::protocol::{Event, SaveRequest};
use crate::clock::now_ms;
use crate::keys::RunKeys;
use crate::root_cause::RootCause;
use crate::round::{RestartCause, Restarts};
use crate::run_state;
use crate::store::{Compare, Op, Txn};
use crate::{Plan, RendezvousError};

impl Actor {
    /// Writes this node's report of `kind` (a refused one is dropped with a warning: reports
    /// only feed `status`); a pace report is answered with the job's pace.
    pub(super) async fn report(
        &self,
        kind: crate::reports::ReportKind,
        json: String,
    ) -> Result<(), RendezvousError> {
        if let Some(why) = crate::reports::invalid(&json) {
            tracing::warn!(node = %self.cfg.node_id, "{why}; dropped");
            return Ok(());
        }
        let key = crate::reports::key(self.round.keys(), kind, &self.cfg.node_id);
        let lease = if kind.leased() { self.lease } else { None };
        if kind.leased() && lease.is_none() {
            return Ok(());
        }
        let generation = (kind == crate::reports::ReportKind::Pace)
            .then(|| serde_json::from_str::<serde_json::Value>(&json).ok())
            .flatten()
            .and_then(|v| v["generation"].as_u64());
        self.store.put(&key, json.into_bytes(), lease).await?;
        if let Some(g) = generation {
            let pace = crate::reports::pace(self.store.as_ref(), self.round.keys(), g).await?;
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
        let keys = self.round.keys();
        let (cur, rev) = self.round.current_generation().await?;
        if cur != g {
            return Ok(false);
        }
        let resp = self
            .store
            .txn(Txn {
                compares: vec![
                    Compare::ModRevisionEquals(keys.gen_current(), rev),
                    Compare::Missing(keys.closed(g)),
                ],
                success: [Op::put(keys.closed(g), reason.clone())]
                    .into_iter()
                    .chain(failure.then(|| failure_put(keys, g, &reason)))
                    .collect(),
                failure: vec![],
            })
            .await?;
        if resp.succeeded {
            tracing::info!(run = %self.cfg.run_id, gen = g, %reason, "generation closed for re-form");
            crate::metrics::global().reformed(&self.cfg.run_id, &reason);
            self.round.record_restart(RestartCause::Membership).await?;
        }
        Ok(resp.succeeded)
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
        let keys = self.round.keys();
        let key = if scale_up {
            keys.scale_up_save(g)
        } else {
            keys.preempt(g)
        };
        let latest_before = self
            .store
            .get(&keys.ckpt_latest())
            .await?
            .map(|kv| kv.value_str())
            .unwrap_or_default();
        let req = SaveRequest {
            node_id: self.cfg.node_id.clone(),
            reason,
            latest_before: latest_before.clone(),
            at_ms: now_ms(),
            scale_up,
            interval: false,
        };
        self.store
            .txn(Txn {
                compares: vec![
                    Compare::Missing(key.clone()),
                    Compare::ValueEquals(keys.gen_current(), g.to_string().into()),
                ],
                success: vec![Op::put(key, serde_json::to_vec(&req).expect("serializes"))],
                failure: vec![],
            })
            .await?;
        Ok(latest_before)
    }

    /// Whether a node outside `plan` is waiting to join (a newcomer, not a member's own join).
    pub(super) async fn newcomer_waiting(&self, plan: &Plan) -> Result<bool, RendezvousError> {
        let prefix = self.round.keys().waiting_prefix();
        Ok(self
            .store
            .get_prefix(&prefix)
            .await?
            .iter()
            .any(|kv| plan.member(&kv.key[prefix.len()..]).is_none()))
    }

    /// The exit barrier: writes `finished` once every member of `plan` recorded its success.
    pub(super) async fn maybe_finish(&self, plan: &Plan) -> Result<(), RendezvousError> {
        let keys = self.round.keys();
        let prefix = keys.done_prefix(plan.generation);
        let done: Vec<String> = self
            .store
            .get_prefix(&prefix)
            .await?
            .into_iter()
            .filter_map(|kv| kv.key.strip_prefix(&prefix).map(str::to_string))
            .collect();
        if let Some(end) = generation::exit_barrier(plan, &done, now_ms()) {
            self.store
                .txn(Txn {
                    compares: vec![
                        Compare::Missing(keys.finished()),
                        Compare::Missing(keys.closed(plan.generation)),
                    ],
                    success: vec![Op::put(keys.finished(), run_state::encode(&end))],
                    failure: vec![],
                })
                .await?;
        }
        Ok(())
    }

    /// Spends one restart of the job-wide budget and closes `g`, or ends the run as failed
    /// (the verdict is [`generation::failure_verdict`]'s). The failure that decides (`cause`,
    /// when a worker failed) is recorded as `g`'s root cause and named in a failed run's end;
    /// an end returns the run's root cause as recorded (another node's when its failure ended
    /// the run first).
    pub(super) async fn decide_failure(
        &self,
        g: u64,
        description: &str,
        cause: Option<&RootCause>,
    ) -> Result<(bool, Restarts, Option<RootCause>), RendezvousError> {
        if let Some(restarts) = self.attribute_to_loss(g, description).await? {
            return Ok((true, restarts, None));
        }
        let keys = self.round.keys();
        loop {
            let restarts = self.round.restarts().await?;
            let (cur, cur_rev) = self.round.current_generation().await?;
            let closed = self.round.state().closed(g).await?;
            let verdict = generation::failure_verdict(
                g,
                description,
                &restarts,
                cur,
                closed.as_deref(),
                &self.rules,
                now_ms(),
            );
            match verdict {
                FailureVerdict::Joins { restarts, reason } => {
                    if closed.is_some() {
                        tracing::info!(gen = g, "{reason}");
                    }
                    return Ok((true, restarts, None));
                }
                FailureVerdict::Spend { next, closed } => {
                    let restarts_key = keys.restarts();
                    let rev = self
                        .store
                        .get(&restarts_key)
                        .await?
                        .map_or(0, |kv| kv.mod_revision);
                    let resp = self
                        .store
                        .txn(Txn {
                            compares: vec![
                                Compare::ModRevisionEquals(keys.gen_current(), cur_rev),
                                Compare::ModRevisionEquals(restarts_key.clone(), rev),
                                Compare::Missing(keys.closed(g)),
                            ],
                            success: [
                                Op::put(restarts_key, run_state::encode(&next)),
                                Op::put(keys.closed(g), closed.clone()),
                            ]
                            .into_iter()
                            .chain(root_cause_put(keys, g, cause))
                            .chain(Some(failure_put(keys, g, description)))
                            .collect(),
                            failure: vec![],
                        })
                        .await?;
                    if resp.succeeded {
                        crate::metrics::global().reformed(&self.cfg.run_id, &closed);
                        return Ok((true, next, None));
                    }
                }
                FailureVerdict::End { mut end, last } => {
                    end.root_cause = cause.cloned();
                    self.store
                        .txn(Txn {
                            compares: vec![Compare::Missing(keys.finished())],
                            success: [
                                Op::put(keys.finished(), run_state::encode(&end)),
                                Op::put(keys.restarts(), run_state::encode(&last)),
                            ]
                            .into_iter()
                            .chain(root_cause_put(keys, g, cause))
                            .collect(),
                            failure: vec![],
                        })
                        .await?;
                    let recorded = self.round.state().finished().await?;
                    let cause = recorded.and_then(|e| e.root_cause).or(end.root_cause);
                    return Ok((false, last, cause));
                }
            }
        }
    }
}

/// The write of `g`'s record in the job-wide failure history (now, and why).
fn failure_put(keys: &RunKeys, g: u64, reason: &str) -> Op {
    let rec = crate::failure_log::FailureRecord {
        generation: g,
        at_ms: now_ms(),
        reason: reason.to_string(),
    };
    Op::put(keys.failure(g), run_state::encode(&rec))
}

/// The write of `g`'s root cause, when a worker failed.
fn root_cause_put(keys: &RunKeys, g: u64, cause: Option<&RootCause>) -> Option<Op> {
    cause.map(|c| {
        Op::put(
            keys.root_cause(g),
            serde_json::to_vec(c).expect("RootCause serializes"),
        )
    })
}
