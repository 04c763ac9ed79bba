//! The session's driver: one `select!` loop that turns I/O into [`Input`]s for the pure
//! [`step`](super::step::step) and carries out the [`Effect`]s it returns; opening the session
//! and joining a round (the store work of the agent's requests is in `requests.rs`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::generation::Rules;
use super::keeper::{self, KeeperConfig, Lost};
use super::protocol::{Emit, Event, Request, Resume, RunEnd, SessionConfig};
use super::state::{
    Attempt, BudgetSeen, Decided, Effect, Failure, Input, LeaseChange, LossLook, Params, Phase,
    Session,
};
use super::step;
use super::verdicts;
use crate::clock::now_ms;
use crate::ledger::Ledger;
use crate::store::{LeaseId, Store, WatchEvent};
use crate::{Join, Plan, RendezvousError, Round, StoreError};

/// The rendezvous of a joining node, resolving to its generation's plan.
pub(super) type Waiter =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Plan, RendezvousError>> + Send>>;

/// The watches of a running generation, merged (`None`: a watch broke).
pub(super) type Watch = mpsc::UnboundedReceiver<Option<WatchEvent>>;

/// The I/O handles beside the state: the round's future while waiting, the generation's watch
/// while running. Dropped as soon as the phase they belong to is left.
#[derive(Default)]
pub(super) struct Handles {
    /// The round this node waits in (in a mutex only so that the actor is `Sync`: it is
    /// reached through `&mut`, never locked).
    pub waiter: Option<std::sync::Mutex<Waiter>>,
    /// The lines the round writes while this node waits in it.
    pub progress: Option<mpsc::UnboundedReceiver<String>>,
    /// The running generation's watch.
    pub watch: Option<Watch>,
}

impl Handles {
    /// Keeps only what `phase` uses.
    fn keep_for(&mut self, phase: &Phase) {
        if !phase.is_waiting() {
            self.waiter = None;
            self.progress = None;
        }
        if !phase.is_running() {
            self.watch = None;
        }
    }
}

/// The round's decision, or never.
async fn decided(waiter: Option<&mut std::sync::Mutex<Waiter>>) -> Result<Plan, RendezvousError> {
    match waiter {
        Some(w) => {
            w.get_mut()
                .expect("the waiter is never locked, so never poisoned")
                .await
        }
        None => std::future::pending().await,
    }
}

/// The next message of `rx` (`None`: its senders are gone), or never when there is no `rx`:
/// the round's lines while waiting, the generation's watch while running.
async fn next<T>(rx: Option<&mut mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The round's decision as the step reads it.
fn decision(r: Result<Plan, RendezvousError>) -> Decided {
    match r {
        Ok(plan) => Decided::Plan(plan),
        Err(RendezvousError::RunFinished(_)) => Decided::RunFinished,
        Err(e @ RendezvousError::Store(_)) => Decided::StoreError(e.to_string()),
        Err(e) => Decided::Failed(e.to_string()),
    }
}

/// What one try brought back.
// One per try, moved at once into the step's input: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Outcome {
    /// `Some(phase)` replaces the phase.
    Phase(Option<Phase>),
    /// One look for a member's loss.
    Loss(LossLook),
    /// One stage of the budget.
    Budget(BudgetSeen),
}

/// The step's input for a try of `what` that came back with `result`.
fn tried(what: Attempt, tries: u32, result: Result<Outcome, RendezvousError>) -> Input {
    match (what, result.map_err(|e| failure(&e))) {
        (Attempt::Attribute(attribution), result) => Input::Looked {
            attribution,
            tries,
            result: result.map(|o| match o {
                Outcome::Loss(l) => l,
                _ => unreachable!("a look for a loss sees a loss or none"),
            }),
        },
        (Attempt::Budget { spending, .. }, result) => Input::Budgeted {
            spending,
            tries,
            result: result.map(|o| match o {
                Outcome::Budget(b) => b,
                _ => unreachable!("the budget's store work sees the budget"),
            }),
        },
        (what, result) => Input::Tried {
            what,
            tries,
            result: result.map(|o| match o {
                Outcome::Phase(p) => p,
                _ => unreachable!("only a look for a loss or the budget's work sees more"),
            }),
        },
    }
}

/// A store operation's error as the step reads it.
pub(super) fn failure(e: &RendezvousError) -> Failure {
    Failure {
        transient: is_transient(e),
        message: e.to_string(),
    }
}

/// The driver and the store work of one session: what it talks to, its state, and the I/O
/// handles beside it.
pub(super) struct Actor {
    /// The store (for its name in messages).
    pub(super) store: Arc<dyn Store>,
    /// The run's rounds and its store door.
    pub(super) round: Round,
    /// The run's checkpoint ledger.
    pub(super) ledger: Ledger,
    /// This session's settings.
    pub(super) cfg: SessionConfig,
    /// The generation core's rules.
    pub(super) rules: Rules,
    /// What the step needs besides the state.
    params: Params,
    events: Emit,
    /// The session's state (the lease and the last generation in it).
    pub(super) state: Session,
    /// The handles beside the state's phase.
    pub(super) handles: Handles,
    /// What the store work under way did to the lease, not yet told to the step
    /// ([`Input::Leased`]).
    lease_change: Option<LeaseChange>,
    /// When the agent last sent anything (ms since the epoch).
    heard: Arc<AtomicU64>,
    /// When any agent of the run last sent anything to this server (server-side sessions).
    pub(super) run_heard: Option<Arc<AtomicU64>>,
    keeper: Option<tokio::task::JoinHandle<()>>,
    lost_tx: mpsc::UnboundedSender<Lost>,
    lost_rx: mpsc::UnboundedReceiver<Lost>,
    /// This session's token under `sessions/<node>/<lease>` when it resumed a lease (server-side
    /// sessions).
    pub(super) token: String,
    /// Where the agent answers peer probes (its last candidacy's address and probe port).
    pub(super) probe_at: Option<(String, u16)>,
}

impl Actor {
    pub(super) fn new(
        store: Arc<dyn Store>,
        cfg: SessionConfig,
        events: Emit,
        heard: Arc<AtomicU64>,
        run_heard: Option<Arc<AtomicU64>>,
    ) -> Self {
        let (lost_tx, lost_rx) = mpsc::unbounded_channel();
        let rules = Rules {
            max_nodes: cfg.round.max_nodes,
            scale_up_save: cfg.scale_up_save,
            scale_up_window: cfg.round.last_call,
            lease_ttl: cfg.lease_ttl,
            max_restarts: cfg.max_restarts,
            ckpt_interval: cfg.ckpt_interval,
        };
        Self {
            round: Round::new(store.clone(), &cfg.run_id, cfg.round),
            ledger: Ledger::new(store.clone(), &cfg.run_id),
            params: Params {
                node: cfg.node_id.clone(),
                rules,
                renews_itself: cfg.auto_keep_alive,
                keep_alive: cfg.keep_alive_interval,
            },
            rules,
            store,
            cfg,
            events,
            state: Session::default(),
            handles: Handles::default(),
            lease_change: None,
            heard,
            run_heard,
            keeper: None,
            lost_tx,
            lost_rx,
            probe_at: None,
            token: {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                format!(
                    "{}-{}-{}",
                    std::process::id(),
                    now_ms(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                )
            },
        }
    }

    pub(super) fn start_keeper(&mut self, lease: LeaseId) {
        self.stop_keeper();
        let cfg = KeeperConfig {
            ttl: self.cfg.lease_ttl,
            every: self.cfg.keep_alive_interval,
            auto: self.cfg.auto_keep_alive,
        };
        self.keeper = Some(keeper::spawn_keeper(
            self.store.clone(),
            lease,
            cfg,
            self.heard.clone(),
            self.run_heard.clone(),
            self.lost_tx.clone(),
        ));
    }

    pub(super) fn stop_keeper(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }

    pub(super) fn emit(&self, ev: Event) {
        (self.events)(ev);
    }

    pub(super) async fn finished(&self) -> Result<Option<RunEnd>, StoreError> {
        self.round.state().finished().await
    }

    /// The lease the session holds, as the store work under way left it.
    pub(super) fn lease(&self) -> Option<LeaseId> {
        match self.lease_change {
            Some(change) => change.held(),
            None => self.state.lease,
        }
    }

    /// Notes what store work did to the lease; the step hears it next ([`Input::Leased`]).
    pub(super) fn lease_changed(&mut self, change: LeaseChange) {
        self.lease_change = Some(change);
    }

    pub(super) async fn ensure_lease(&mut self) -> Result<LeaseId, StoreError> {
        if let Some(l) = self.lease() {
            return Ok(l);
        }
        let l = self.round.state().grant_lease(self.cfg.lease_ttl).await?;
        self.lease_changed(LeaseChange::Granted(l));
        self.start_keeper(l);
        // No claim: no other session can speak for a lease granted just now.
        self.emit(Event::Opened { lease: l });
        Ok(l)
    }

    /// The driver: one `select!` over the agent's requests, the round, the generation's watch,
    /// the deadlines of the state and the keeper; each wake-up is an [`Input`] for the step.
    pub(super) async fn run(
        &mut self,
        resume: Option<Resume>,
        mut requests: mpsc::UnboundedReceiver<Box<Request>>,
    ) -> Result<(), RendezvousError> {
        // Boxed, as each effect below: the task's own allocation is as large as the largest
        // state it may await in, and a session idles in the `select!` for nearly all of its
        // life; nested inline, the store work made every session's task about 11 KB.
        let opened = Box::pin(self.open(resume)).await?;
        let mut first = VecDeque::new();
        first.extend(self.lease_change.take().map(Input::Leased));
        first.push_back(Input::Opened(opened));
        self.apply(first).await?;
        while !self.state.phase.is_left() {
            let at = self.state.wake_at();
            let reads_requests = self.state.reads_requests();
            let reads_round = self.state.reads_round();
            let Handles {
                waiter,
                progress,
                watch,
            } = &mut self.handles;
            let input = tokio::select! {
                req = requests.recv(), if reads_requests => match req {
                    Some(r) => Input::Request(*r),
                    None => Input::RequestsClosed,
                },
                plan = decided(waiter.as_mut()), if reads_round && waiter.is_some() => {
                    self.handles.waiter = None;
                    Input::Decided(decision(plan))
                }
                Some(line) = next(progress.as_mut()), if reads_round => Input::Progress(line),
                ev = next(watch.as_mut()), if reads_round && watch.is_some() => {
                    match ev.flatten() {
                        None => Input::WatchBroke,
                        Some(ev) => {
                            let g = self.state.phase.running_generation().unwrap_or_default();
                            Input::Watch(super::watch::classify(self.round.keys(), g, ev)?)
                        }
                    }
                }
                () = sleep_until_opt(at) => Input::Tick,
                Some(lost) = self.lost_rx.recv() => Input::LeaseLost(lost),
            };
            // The round's lines written before its decision are stepped on before it.
            let mut inputs = VecDeque::new();
            if let (Input::Decided(_), Some(p)) = (&input, self.handles.progress.as_mut()) {
                while let Ok(line) = p.try_recv() {
                    inputs.push_back(Input::Progress(line));
                }
            }
            inputs.push_back(input);
            self.apply(inputs).await?;
        }
        Ok(())
    }

    /// Steps on `inputs`, carries out the effects, and steps on what they bring back (a
    /// change of the lease first, then the outcome).
    async fn apply(&mut self, mut inputs: VecDeque<Input>) -> Result<(), RendezvousError> {
        while let Some(input) = inputs.pop_front() {
            // A change of the lease comes before the outcome of the work that made it and
            // leaves the phase as it is: the handles that work set up for the phase it leads
            // to (a join's round) stay until that outcome is stepped on.
            let leased = matches!(input, Input::Leased(_));
            let state = std::mem::take(&mut self.state);
            let (state, effects, reason) = step::step(state, input, Instant::now(), &self.params);
            self.state = state;
            if !leased {
                self.handles.keep_for(&self.state.phase);
            }
            if !reason.is_empty() {
                let g = self.state.phase.running_generation();
                tracing::debug!(run = %self.cfg.run_id, gen = ?g, "{reason}");
            }
            for effect in effects {
                let next = Box::pin(self.carry_out(effect)).await?;
                inputs.extend(self.lease_change.take().map(Input::Leased));
                inputs.extend(next);
            }
        }
        Ok(())
    }

    /// Carries out one effect of the step; what it brings back is the step's next input.
    async fn carry_out(&mut self, effect: Effect) -> Result<Option<Input>, RendezvousError> {
        Ok(match effect {
            Effect::Emit(ev) => {
                if let Event::Fenced(reason) = &ev {
                    tracing::error!(node = %self.cfg.node_id, "{reason}");
                }
                self.emit(ev);
                None
            }
            Effect::Try { what, tries } => Some(self.try_once(what, tries).await),
            Effect::Generation { effects, ends } => Some(self.execute_all(effects, ends).await?),
            Effect::StopKeeper => {
                self.stop_keeper();
                None
            }
            Effect::Release(lease) => {
                self.stop_keeper();
                if let Err(e) = self.round.state().revoke_lease(lease).await {
                    tracing::debug!(error = %e, "could not revoke the lease of a failed round; it expires");
                }
                None
            }
            Effect::ReportFinished => {
                match self.finished().await {
                    Ok(Some(end)) => self.emit(Event::Finished(end)),
                    _ => self.emit(Event::Error(format!("run {} finished", self.cfg.run_id))),
                }
                None
            }
            Effect::Look => Some(Input::Seen(
                self.seen_standing_by().await.map_err(|e| failure(&e)),
            )),
            Effect::Knock => Some(Input::Knocked(self.knock_agent().await)),
            Effect::CheckSpeaks { lease } => Some(Input::Speaks(
                self.still_speaks_for_the_node(lease)
                    .await
                    .map(|speaks| (speaks, self.run_silent()))
                    .map_err(|e| failure(&e)),
            )),
            Effect::RevokeAbandoned { lease, why } => {
                tracing::warn!(run = %self.cfg.run_id, node = %self.cfg.node_id, "{why}");
                self.revoke_abandoned(lease).await?;
                None
            }
            Effect::Reformed { generation, reason } => {
                tracing::debug!(run = %self.cfg.run_id, gen = generation, "re-form counted: {reason}");
                crate::server::metrics::global().reformed(&self.cfg.run_id, &reason);
                None
            }
            Effect::Note { generation, line } => {
                tracing::info!(run = %self.cfg.run_id, gen = generation, "{line}");
                None
            }
            Effect::Warn(line) => {
                tracing::warn!(run = %self.cfg.run_id, node = %self.cfg.node_id, "{line}");
                None
            }
        })
    }

    /// Tries `what` once. A request, or entering a generation again, races the keeper: a lost
    /// lease fences at once (fencing stays bounded by the TTL, not by the store's answer): the
    /// step hears [`Input::LeaseLost`] instead of the try's outcome. A stale keeper's report
    /// (an earlier lease) starts the try over.
    async fn try_once(&mut self, mut what: Attempt, tries: u32) -> Input {
        let races = !matches!(
            what,
            Attempt::Join(_) | Attempt::Enter { announce: true, .. }
        );
        let mut lost_rx = std::mem::replace(&mut self.lost_rx, mpsc::unbounded_channel().1);
        let input = loop {
            let mut phase = std::mem::take(&mut self.state.phase);
            let outcome = tokio::select! {
                r = self.attempt(&mut what, &mut phase) => Ok(r),
                Some(lost) = lost_rx.recv(), if races => Err(lost),
            };
            self.state.phase = phase;
            match outcome {
                Ok(result) => break tried(what, tries, result),
                Err(lost) if verdicts::fences(self.lease(), lost.0) => {
                    break Input::LeaseLost(lost)
                }
                Err(lost) => {
                    tracing::debug!(
                        lease = format!("{:#x}", lost.0),
                        "a stale keeper's report: {}",
                        lost.1
                    );
                }
            }
        };
        self.lost_rx = lost_rx;
        input
    }

    /// One try of `what` (`phase`: the current one). What the try got done stays done: an
    /// entry that told the agent its plan before it failed comes back as an entry without
    /// the announcement, so the step's next try only watches.
    async fn attempt(
        &mut self,
        what: &mut Attempt,
        phase: &mut Phase,
    ) -> Result<Outcome, RendezvousError> {
        match what {
            Attempt::Request(req) => self.handle(req.clone(), phase).await.map(Outcome::Phase),
            Attempt::Enter {
                plan,
                before,
                announce,
            } => self
                .running(plan.clone(), before.as_deref().cloned(), announce)
                .await
                .map(|p| Outcome::Phase(Some(p))),
            Attempt::Join(cand) => self
                .join(cand.clone())
                .await
                .map(|p| Outcome::Phase(Some(p))),
            Attempt::Attribute(a) => self.look_for_loss(a).await.map(Outcome::Loss),
            Attempt::Budget { spending, stage } => {
                self.budget(spending, stage).await.map(Outcome::Budget)
            }
        }
    }

    /// Whether the agent was heard at or after `at_ms` (ms since the epoch).
    pub(super) fn heard_since(&self, at_ms: u64) -> bool {
        self.heard.load(std::sync::atomic::Ordering::SeqCst) >= at_ms
    }

    /// Fences from inside store work (the lease was found lost, or the node was given up):
    /// stops renewing and returns the phase to go to; the step tells the agent.
    pub(super) fn fence(&mut self, reason: String) -> Phase {
        self.stop_keeper();
        self.lease_changed(LeaseChange::Released);
        Phase::Fenced { reason }
    }

    /// Joins the round with `cand` (a fresh lease if the old one ran out): the round's future
    /// goes to the handles, the phase returned is the waiting one.
    pub(super) async fn join(&mut self, cand: Join) -> Result<Phase, RendezvousError> {
        let c = &cand.candidate;
        self.probe_at = Some((c.advertise_addr.clone(), c.probe_port));
        let mut lease = self.ensure_lease().await?;
        // A node that comes back is no longer lost; its old membership goes as the join
        // arrives, in one transaction (see `Round::rejoin`).
        let joined = self.round.rejoin(&cand, lease, self.state.last_gen).await;
        if let Err(StoreError::LeaseLost(_)) = joined {
            // The lease ran out while this node was stopped or cut off (the keeper has not said
            // so yet): this node was fenced; it joins as a newcomer with a fresh lease.
            tracing::warn!(node = %self.cfg.node_id, "lease {lease:#x} expired; joining with a new lease");
            self.stop_keeper();
            self.lease_changed(LeaseChange::Released);
            lease = self.ensure_lease().await?;
            self.round.rejoin(&cand, lease, self.state.last_gen).await?;
        } else {
            joined?;
        }
        let round = self.round.clone();
        let node = self.cfg.node_id.clone();
        let after = self.state.last_gen;
        // The round's lines go to the step (`Input::Progress`), which tells the agent.
        let (lines, progress) = mpsc::unbounded_channel();
        let waiter: Waiter = Box::pin(async move {
            round
                .wait_for_plan(&node, after, lease, |r| {
                    let _ = lines.send(r.to_string());
                })
                .await
        });
        self.handles.waiter = Some(std::sync::Mutex::new(waiter));
        self.handles.progress = Some(progress);
        Ok(Phase::Waiting {
            join: cand,
            since: Instant::now(),
        })
    }
}

/// Errors worth retrying: the store did not answer (as opposed to a decision or a timeout).
pub(super) fn is_transient(e: &RendezvousError) -> bool {
    matches!(e, RendezvousError::Store(StoreError::Unavailable { .. }))
}
