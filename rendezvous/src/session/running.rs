//! Entering and watching a running generation: the store I/O around the pure generation core.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::actor::{is_transient, Actor, Phase, Watch};
use super::generation::{self, Effect, Input, Running};
use super::protocol::{Event, SaveRequest};
use crate::human::duration as human;
use crate::store::WatchEvent;
use crate::{Plan, RendezvousError, StoreError};

impl Actor {
    /// Re-establishes the watch of a running generation after the store hiccuped, retrying
    /// transient errors; the agent hears nothing unless something really changed.
    pub(super) async fn rewatch(&mut self, run: Running) -> Phase {
        let plan = run.plan.clone();
        self.rewatch_plan(plan, Some(run)).await
    }

    /// [`Self::rewatch`] from a plan (and the view before, if any).
    ///
    /// A lease lost meanwhile (the store stayed away for a whole TTL) fences at once: the keeper's
    /// verdict is not left waiting behind the retries, so fencing stays bounded by the TTL.
    pub(super) async fn rewatch_plan(&mut self, plan: Plan, before: Option<Running>) -> Phase {
        // Borrowed out of `self` for the duration, so it can be raced against `self.running`.
        let mut lost_rx = std::mem::replace(&mut self.lost_rx, mpsc::unbounded_channel().1);
        let phase = loop {
            let attempt = tokio::select! {
                r = self.running(plan.clone(), before.clone(), false) => r,
                Some(lost) = lost_rx.recv() => {
                    if self.fence_if_current(lost) {
                        break Phase::Idle;
                    }
                    continue;
                }
            };
            match attempt {
                Ok(p) => break p,
                Err(e) if is_transient(&e) && self.lease.is_some() => {
                    tracing::warn!(error = %e, "store unavailable; retrying the watch");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        Some(lost) = lost_rx.recv() => {
                            if self.fence_if_current(lost) {
                                break Phase::Idle;
                            }
                        }
                    }
                }
                Err(e) => {
                    self.emit(Event::Error(e.to_string()));
                    break Phase::Idle;
                }
            }
        };
        self.lost_rx = lost_rx;
        phase
    }

    /// Enters generation `plan.generation`: membership key, watch, and a check of what may have
    /// happened before the watch started. `before`: this session's view of it, on a re-watch.
    pub(super) async fn running(
        &mut self,
        plan: Plan,
        before: Option<Running>,
        announce: bool,
    ) -> Result<Phase, RendezvousError> {
        let Some(lease) = self.lease else {
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
                self.fence(if before.is_some() {
                    // Re-entering after the watch broke: the store was out past lease_ttl.
                    format!(
                        "lease expired while generation {} ran (the store was unreachable for longer than lease_ttl)",
                        plan.generation
                    )
                } else {
                    format!("lease lost before joining generation {}", plan.generation)
                });
                return Ok(Phase::Idle);
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let watch = self.watch_generation(&plan).await?;
        // Watch first, then read: whatever happened before the watch began is seen here.
        if announce {
            self.emit(Event::Formed(plan.clone()));
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
            self.evaluate_interval(&mut run, !rewatch).await?;
        }
        if generation::watches_newcomers(&run.plan, &self.cfg.node_id, &self.rules) {
            run.door = self
                .round
                .state()
                .formation(run.generation())
                .await?
                .and_then(|f| f.door);
        }
        Ok(Phase::Running(run, watch))
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
        let (tx, rx) = mpsc::unbounded_channel();
        for prefix in prefixes {
            let mut source = self.round.state().watch(&prefix).await?;
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        ev = source.recv() => {
                            let done = ev.is_none();
                            if tx.send(ev).is_err() || done {
                                return;
                            }
                        }
                        _ = tx.closed() => return,
                    }
                }
            });
        }
        Ok(rx)
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

    /// A watch event of the running generation.
    pub(super) async fn on_watch(
        &mut self,
        run: Running,
        watch: Watch,
        ev: WatchEvent,
    ) -> Result<Phase, RendezvousError> {
        let input = generation::classify(self.round.keys(), run.generation(), ev)?;
        self.on_input(run, watch, input).await
    }

    /// A deadline of the running generation passed.
    pub(super) async fn on_deadline(
        &mut self,
        run: Running,
        watch: Watch,
    ) -> Result<Phase, RendezvousError> {
        self.on_input(run, watch, Input::Tick).await
    }

    /// Asks the core, carries out its effects; a transient store error re-watches.
    async fn on_input(
        &mut self,
        mut run: Running,
        watch: Watch,
        input: Input,
    ) -> Result<Phase, RendezvousError> {
        let step = generation::step(&mut run, input, Instant::now(), &self.rules);
        if !step.reason.is_empty() {
            tracing::debug!(run = %self.cfg.run_id, gen = run.generation(), "{}", step.reason);
        }
        for effect in step.effects {
            match self.execute(&mut run, effect).await {
                Ok(()) => {}
                Err(e) if is_transient(&e) => {
                    tracing::warn!(error = %e, "store error while watching the group; re-watching");
                    return Ok(self.rewatch(run).await);
                }
                Err(e) => return Err(e),
            }
        }
        // A node given up ([`Effect::GiveUpIfUnheard`]) was fenced: no generation runs here.
        Ok(if step.ends || self.lease.is_none() {
            Phase::Idle
        } else {
            Phase::Running(run, watch)
        })
    }

    /// The agent sent something while `run` runs: the answer to a ping, if one is out.
    pub(super) fn agent_heard(&self, run: &mut Running) {
        let step = generation::step(run, Input::AgentHeard, Instant::now(), &self.rules);
        if !step.reason.is_empty() {
            tracing::info!(run = %self.cfg.run_id, gen = run.generation(), "{}", step.reason);
        }
    }

    /// Carries out one effect of the generation core.
    async fn execute(&mut self, run: &mut Running, effect: Effect) -> Result<(), RendezvousError> {
        let g = run.generation();
        match effect {
            Effect::Emit(ev) => self.emit(ev),
            Effect::Ping => self.emit(Event::Ping),
            Effect::GiveUpIfUnheard { asked_at, reason } => {
                let asked_ms =
                    crate::clock::now_ms().saturating_sub(asked_at.elapsed().as_millis() as u64);
                if self.heard_since(asked_ms) {
                    let why = generation::step(
                        run,
                        generation::Input::AgentHeard,
                        Instant::now(),
                        &self.rules,
                    )
                    .reason;
                    tracing::info!(run = %self.cfg.run_id, gen = g, "{why}");
                } else {
                    self.give_up(g, reason).await?;
                }
            }
            Effect::ReportSaveRequest(v) => self.emit_save_request(&v),
            Effect::Close(reason) => {
                self.close(g, reason, false).await?;
            }
            Effect::EvaluateInterval { entered } => self.evaluate_interval(run, entered).await?,
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
                tracing::info!(
                    run = %self.cfg.run_id,
                    gen = g,
                    "{} waiting to join: asking every rank for a checkpoint first (--on-scale-up checkpoint, up to {})", generation::are(&node), human(limit)
                );
                run.scale_up_requested(&node, latest_before, Instant::now(), limit);
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
                    if let Some(node) = run.call_off_scale_up() {
                        tracing::info!(run = %self.cfg.run_id, gen = g, "{} no longer waiting to join: the scale-up is called off, no re-form", generation::are(&node));
                    }
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
        Ok(())
    }
}
