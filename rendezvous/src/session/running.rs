//! Entering and watching a running generation: the store I/O around the pure generation core.

use tokio::time::Instant;

use super::actor::{failure, is_transient, Actor, Watch};
use super::generation::{self, Effect, Running};
use super::protocol::{Event, SaveRequest};
use super::state::{Input, Phase, Read};
use crate::{Plan, RendezvousError, StoreError};

impl Actor {
    /// Enters generation `plan.generation`: membership key, watch, and a check of what may have
    /// happened before the watch started. `before`: this session's view of it, on a re-watch.
    /// `announce`: the agent is still to hear the plan ([`Event::Formed`], once the membership
    /// key and the watch are in place); cleared once it has, so that a try which fails after
    /// that tells the step what is left to do (watching), and one that fails before it leaves
    /// the telling to the next try.
    pub(super) async fn running(
        &mut self,
        plan: Plan,
        before: Option<Running>,
        announce: &mut bool,
    ) -> Result<Phase, RendezvousError> {
        let Some(lease) = self.lease() else {
            return Ok(Phase::Idle);
        };
        let state = self.round.state().clone();
        // Membership of generation g, under our lease, replaces the join that got us in. A
        // lease that is gone fences us; a generation already closed is reported below.
        let resp = state
            .enter_generation(plan.generation, &self.cfg.node_id, lease)
            .await;
        match resp {
            Err(StoreError::LeaseLost(_)) => {
                return Ok(self.fence(if before.is_some() {
                    // Re-entering after the watch broke: the store was out past lease_ttl.
                    format!(
                        "lease expired while generation {} ran (the store was unreachable for longer than lease_ttl)",
                        plan.generation
                    )
                } else {
                    format!("lease lost before joining generation {}", plan.generation)
                }));
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let watch = self.watch_generation(&plan).await?;
        // Watch first, then read: whatever happened before the watch began is seen here.
        if *announce {
            self.emit(Event::Formed(plan.clone()));
            *announce = false;
        }
        if let Some(end) = self.finished().await? {
            self.emit(Event::Finished(end));
            return Ok(Phase::Idle);
        }
        for scale_up in [false, true] {
            if let Some(value) = state.save_request(plan.generation, scale_up).await? {
                self.emit_save_request(&value);
            }
        }
        if let Some(reason) = self.closed_reason(&plan).await? {
            self.emit(Event::Reform {
                generation: plan.generation,
                reason,
            });
            return Ok(Phase::Idle);
        }
        // The successor writes its membership key as soon as it sees the plan; if it has not
        // within a lease TTL, it died before starting.
        let successor_started = match generation::successor(&plan, &self.cfg.node_id) {
            Some(succ) => state.is_member(plan.generation, &succ).await?,
            None => true,
        };
        // An interval save asked of this generation before the watch began (a re-watch).
        let latest = state.ckpt_latest().await?.map(|(id, _)| id);
        if let Some(value) = state
            .interval_save_request(plan.generation, &latest.unwrap_or_default())
            .await?
        {
            self.emit_save_request(&value);
        }
        let rewatch = before.is_some();
        let mut run = Running::enter(
            plan,
            &self.cfg.node_id,
            before,
            successor_started,
            Instant::now(),
            &self.rules,
        );
        if run.save_clock.is_some() {
            if let Some(interval) = self.evaluate_interval(&run, !rewatch).await? {
                generation::step(
                    &mut run,
                    generation::Input::IntervalDecided(interval),
                    Instant::now(),
                    &self.rules,
                );
            }
        }
        if generation::watches_newcomers(&run.plan, &self.cfg.node_id, &self.rules) {
            run.door = self
                .round
                .state()
                .formation(run.generation())
                .await?
                .and_then(|f| f.door);
        }
        self.handles.watch = Some(watch);
        Ok(Phase::Running(run))
    }

    /// The watches of a running generation, merged into one channel (`None` = a watch broke).
    ///
    /// Kept linear in the group size: each node watches the end of its generation
    /// (`gen/<g>/`), the end of the run, and only its successor's membership key in node-rank
    /// order, so every loss is seen by exactly one node; node rank 0 alone watches the
    /// waiting set for scale-up. Done records live outside `gen/<g>/` so nobody watches them: the
    /// last node to succeed writes the end of the run.
    async fn watch_generation(&self, plan: &Plan) -> Result<Watch, StoreError> {
        let keys = self.round.keys();
        let g = plan.generation;
        let mut prefixes = vec![
            keys.generation_prefix(g),
            keys.finished(),
            keys.ckpt_latest(),
        ];
        if let Some(succ) = generation::successor(plan, &self.cfg.node_id) {
            prefixes.push(keys.member(g, &succ));
        }
        if generation::watches_newcomers(plan, &self.cfg.node_id, &self.rules) {
            prefixes.push(keys.waiting_prefix());
        }
        self.round.state().watch_all(&prefixes).await
    }

    async fn closed_reason(&self, plan: &Plan) -> Result<Option<String>, RendezvousError> {
        if let Some(reason) = self.round.state().closed(plan.generation).await? {
            return Ok(Some(reason));
        }
        let (g, _) = self.round.current_generation().await?;
        if g > plan.generation {
            return Ok(Some(format!("generation {g} formed")));
        }
        Ok(None)
    }

    /// Reports a `gen/<g>/preempt` value (a [`SaveRequest`]) to the agent.
    pub(super) fn emit_save_request(&self, value: &[u8]) {
        match serde_json::from_slice::<SaveRequest>(value) {
            Ok(req) => self.emit(Event::SaveRequested(req)),
            Err(e) => tracing::warn!(error = %e, "ignoring an undecodable save request"),
        }
    }

    /// Carries out the generation core's effects on the running generation, in order; the
    /// outcome is the step's next input. A node given up meanwhile is fenced. A read the core
    /// judges stops the run of effects: it goes back with the rest ([`Read`]).
    pub(super) async fn execute_all(
        &mut self,
        effects: Vec<Effect>,
        ends: bool,
    ) -> Result<Input, RendezvousError> {
        let Phase::Running(run) = std::mem::take(&mut self.state.phase) else {
            unreachable!("the step asks for a generation's effects only while it runs")
        };
        let mut next = None;
        let mut effects = effects.into_iter();
        while let Some(effect) = effects.next() {
            match self.execute(&run, effect).await {
                Ok(Done::Carried) => {}
                Ok(Done::Fenced(phase)) => next = Some(*phase),
                Ok(Done::Read(input)) if next.is_none() => {
                    return Ok(Input::Executed {
                        run: Box::new(run),
                        ends,
                        result: Ok(None),
                        read: Some(Read {
                            input,
                            rest: effects.collect(),
                        }),
                    })
                }
                // Given up already: the view of the generation goes with the membership.
                Ok(Done::Read(_)) => {}
                Err(e) if is_transient(&e) => {
                    return Ok(Input::Executed {
                        run: Box::new(run),
                        ends,
                        result: Err(failure(&e)),
                        read: None,
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Input::Executed {
            run: Box::new(run),
            ends,
            result: Ok(next),
            read: None,
        })
    }

    /// Carries out one effect of the generation core: its store work only; what the core must
    /// judge of it comes back as [`Done::Read`].
    async fn execute(&mut self, run: &Running, effect: Effect) -> Result<Done, RendezvousError> {
        let g = run.generation();
        match effect {
            Effect::Emit(ev) => self.emit(ev),
            Effect::Ping => self.emit(Event::Ping),
            Effect::GiveUpIfUnheard { asked_at, reason } => {
                let asked_ms =
                    crate::clock::now_ms().saturating_sub(asked_at.elapsed().as_millis() as u64);
                if self.heard_since(asked_ms) {
                    return Ok(Done::Read(generation::Input::AgentHeard));
                }
                return self
                    .give_up(g, reason)
                    .await
                    .map(|p| Done::Fenced(Box::new(p)));
            }
            Effect::ReportSaveRequest(v) => self.emit_save_request(&v),
            Effect::Close(reason) => {
                self.close(g, reason, false).await?;
            }
            Effect::EvaluateInterval { entered } => {
                if let Some(interval) = self.evaluate_interval(run, entered).await? {
                    return Ok(Done::Read(generation::Input::IntervalDecided(interval)));
                }
            }
            Effect::RequestIntervalSave(interval) => {
                self.request_interval_save(g, interval).await?
            }
            Effect::AdmitIfWaiting { reason, gone_note } => {
                if self.newcomer_waiting(&run.plan).await? {
                    self.close(g, reason, false).await?;
                } else if let Some(note) = gone_note {
                    tracing::info!(run = %self.cfg.run_id, gen = g, "{note}");
                }
            }
            Effect::RequestScaleUpSave { node, limit } => {
                let latest_before = self
                    .request_save(
                        g,
                        format!("{} waiting to join (scale-up)", generation::are(&node)),
                        true,
                    )
                    .await?;
                return Ok(Done::Read(generation::Input::ScaleUpSaveWritten {
                    node,
                    latest_before,
                    limit,
                }));
            }
            Effect::TurnAway { node, message } => {
                let err = RendezvousError::Unformable {
                    run: self.cfg.run_id.clone(),
                    reason: message,
                };
                self.round.publish_turn_away(&err, vec![node]).await?;
            }
            Effect::CallOffIfNobodyWaits => {
                if !self.newcomer_waiting(&run.plan).await? {
                    return Ok(Done::Read(generation::Input::NobodyWaits));
                }
            }
            Effect::SuccessorLost(node) => {
                let why = self.round.state().lost(&node).await?;
                let sealed = self.preemption_sealed(g).await?;
                match generation::successor_lost(&run.plan, &node, &why, sealed) {
                    Some(reason) => {
                        self.close(g, reason, true).await?;
                    }
                    None => {
                        tracing::debug!(run = %self.cfg.run_id, gen = g, "node {node} left after the preemption checkpoint");
                    }
                }
            }
            Effect::CheckSuccessorStarted { node, reason } => {
                if !self.round.state().is_member(g, &node).await? {
                    self.close(g, reason, true).await?;
                }
            }
        }
        Ok(Done::Carried)
    }
}

/// What carrying out one of the generation core's effects brought back.
pub(super) enum Done {
    /// Carried out; nothing to judge.
    Carried,
    /// This node was given up: the phase to go to.
    Fenced(Box<Phase>),
    /// A read (or a write's result) for the generation core to judge.
    Read(generation::Input),
}
