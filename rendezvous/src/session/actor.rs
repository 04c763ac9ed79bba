//! The session actor: its phase, its one `select!` loop, and the requests of its agent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::generation::{self, Rules, Running};
use super::keeper::{self, KeeperConfig, Lost};
use super::protocol::{Event, Request, Resume, RunEnd, SessionConfig};
use super::standby;
use crate::clock::now_ms;
use crate::decisions::loss;
use crate::ledger::{Ledger, LedgerError, NodeCommit, Retention};
use crate::store::{LeaseId, Store, WatchEvent};
use crate::{Join, Plan, RendezvousError, Round, StoreError};

/// The rendezvous of a joining node, resolving to its generation's plan.
pub(super) type Waiter =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Plan, RendezvousError>> + Send>>;

/// The watches of a running generation, merged (`None`: a watch broke).
pub(super) type Watch = mpsc::UnboundedReceiver<Option<WatchEvent>>;

/// Where the session is. Its deadlines live in [`Running`].
// One value per session, moved between states: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Phase {
    /// Holding a lease (or fenced), neither waiting nor running.
    Idle,
    /// The agent left (its lease is revoked): the session ends, closing its event stream.
    Left,
    /// Joined the round with this request; the waiter resolves to the plan.
    Waiting(Join, Waiter),
    /// A member of a running generation, watching it.
    Running(Running, Watch),
    /// Sent away by a partition, the agent stands by (`standby.rs`): the run is looked at
    /// again at `at`; `told` is what the agent heard last.
    StandingBy {
        /// When to look next.
        at: tokio::time::Instant,
        /// The last look said.
        told: Option<standby::Look>,
    },
}

impl Phase {
    /// The generation running, if any.
    pub fn running_generation(&self) -> Option<u64> {
        match self {
            Phase::Running(r, _) => Some(r.generation()),
            _ => None,
        }
    }

    /// What a waiting or running phase hears next: the round's decision, a watch event of the
    /// generation, or its next deadline. Never resolves in the other phases.
    async fn next(&mut self) -> Wake {
        match self {
            Phase::Waiting(_, w) => Wake::Plan(w.await),
            Phase::Running(run, watch) => {
                let at = run.wake_at();
                tokio::select! {
                    ev = watch.recv() => Wake::Watch(ev),
                    () = sleep_until_opt(at) => Wake::Deadline,
                }
            }
            Phase::StandingBy { at, .. } => {
                tokio::time::sleep_until(*at).await;
                Wake::Deadline
            }
            Phase::Idle | Phase::Left => std::future::pending().await,
        }
    }
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// What woke the loop.
enum Wake {
    Request(Option<Request>),
    Plan(Result<Plan, RendezvousError>),
    Watch(Option<Option<WatchEvent>>),
    Deadline,
    LeaseLost(Lost),
}

pub(super) struct Actor {
    pub store: Arc<dyn Store>,
    pub round: Round,
    pub ledger: Ledger,
    pub cfg: SessionConfig,
    pub rules: Rules,
    events: mpsc::UnboundedSender<Event>,
    pub lease: Option<LeaseId>,
    pub last_gen: u64,
    /// When the agent last sent anything (ms since the epoch).
    heard: Arc<AtomicU64>,
    /// When any agent of the run last sent anything to this server (server-side sessions).
    pub(super) run_heard: Option<Arc<AtomicU64>>,
    keeper: Option<tokio::task::JoinHandle<()>>,
    lost_tx: mpsc::UnboundedSender<Lost>,
    pub(super) lost_rx: mpsc::UnboundedReceiver<Lost>,
    /// This session's token under `sessions/<node>` (server-side sessions).
    pub token: String,
    /// Where the agent answers peer probes (its last candidacy's address and probe port).
    pub(super) probe_at: Option<(String, u16)>,
}

impl Actor {
    pub fn new(
        store: Arc<dyn Store>,
        cfg: SessionConfig,
        events: mpsc::UnboundedSender<Event>,
        heard: Arc<AtomicU64>,
        run_heard: Option<Arc<AtomicU64>>,
    ) -> Self {
        let (lost_tx, lost_rx) = mpsc::unbounded_channel();
        Self {
            round: Round::new(store.clone(), &cfg.run_id, cfg.round),
            ledger: Ledger::new(store.clone(), &cfg.run_id),
            rules: Rules {
                max_nodes: cfg.round.max_nodes,
                scale_up_save: cfg.scale_up_save,
                scale_up_window: cfg.round.last_call,
                lease_ttl: cfg.lease_ttl,
                max_restarts: cfg.max_restarts,
                ckpt_interval: cfg.ckpt_interval,
            },
            store,
            cfg,
            events,
            lease: None,
            last_gen: 0,
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

    fn start_keeper(&mut self, lease: LeaseId) {
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

    pub fn stop_keeper(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }

    pub fn emit(&self, ev: Event) {
        let _ = self.events.send(ev);
    }

    pub async fn finished(&self) -> Result<Option<RunEnd>, StoreError> {
        self.round.state().finished().await
    }

    async fn ensure_lease(&mut self) -> Result<LeaseId, StoreError> {
        if let Some(l) = self.lease {
            return Ok(l);
        }
        let l = self.round.state().grant_lease(self.cfg.lease_ttl).await?;
        self.lease = Some(l);
        self.start_keeper(l);
        self.claim(l).await?;
        self.emit(Event::Opened { lease: l });
        Ok(l)
    }

    /// The first phase: a reconnecting agent's state taken over, or a fresh lease.
    async fn open(&mut self, resume: Option<Resume>) -> Result<Option<Phase>, RendezvousError> {
        match resume {
            Some(r) if self.round.state().keep_alive(r.lease).await.is_ok() => {
                self.lease = Some(r.lease);
                self.start_keeper(r.lease);
                self.claim(r.lease).await?;
                self.emit(Event::Opened { lease: r.lease });
                if r.generation > 0 {
                    if let Some(plan) = self.round.plan(r.generation).await? {
                        self.last_gen = r.generation;
                        return self.running(plan, None, false).await.map(Some);
                    }
                } else if let Some(c) = r.waiting {
                    if let Some(plan) = self.admitted_while_away().await? {
                        self.last_gen = plan.generation;
                        return self.running(plan, None, true).await.map(Some);
                    }
                    return self.join(c).await.map(Some);
                }
            }
            Some(r) => {
                // The next world must be newer than the one this node was fenced from.
                self.last_gen = self.last_gen.max(r.generation);
                // A store that no longer holds the generation this node ran in has lost the
                // run's state (a restarted server on the memory store keeps none): that, not
                // an expiry, is why the lease is unknown.
                let (current, _) = self.round.current_generation().await?;
                let why = if current < r.generation {
                    format!(
                        "the rendezvous store ({}) no longer holds this run's generation {} (a restarted server on the memory store keeps no state), so lease {:#x} is gone",
                        self.store.name(),
                        r.generation,
                        r.lease
                    )
                } else {
                    format!("lease {:#x} expired while reconnecting", r.lease)
                };
                self.emit(Event::Fenced(why));
            }
            None => {
                if let Some(end) = self.finished().await? {
                    self.emit(Event::Finished(end));
                    return Ok(None);
                }
                self.ensure_lease().await?;
            }
        }
        Ok(Some(Phase::Idle))
    }

    /// The actor: one `select!` over the agent's requests, the round, the generation's watch,
    /// its deadlines and the keeper; every wake-up handled in [`Self::on_wake`].
    pub async fn run(
        &mut self,
        resume: Option<Resume>,
        mut requests: mpsc::UnboundedReceiver<Request>,
    ) -> Result<(), RendezvousError> {
        let Some(mut phase) = self.open(resume).await? else {
            return Ok(());
        };
        loop {
            if let Phase::Left = phase {
                return Ok(());
            }
            let wake = tokio::select! {
                req = requests.recv() => Wake::Request(req),
                wake = phase.next() => wake,
                Some(lost) = self.lost_rx.recv() => Wake::LeaseLost(lost),
            };
            match self.on_wake(wake, phase).await? {
                Some(next) => phase = next,
                None => return Ok(()),
            }
        }
    }

    /// Handles one wake-up of the loop; `None`: the session ends.
    async fn on_wake(
        &mut self,
        wake: Wake,
        phase: Phase,
    ) -> Result<Option<Phase>, RendezvousError> {
        Ok(Some(match (wake, phase) {
            (Wake::Request(None), _) => {
                self.abandoned().await?;
                return Ok(None);
            }
            (Wake::Request(Some(r)), phase) => self.on_request(r, phase).await?,
            (Wake::LeaseLost(lost), phase) => {
                if self.fence_if_current(lost) {
                    Phase::Idle
                } else {
                    phase
                }
            }
            (Wake::Plan(plan), Phase::Waiting(cand, _)) => self.formed(plan, cand).await?,
            (Wake::Watch(ev), Phase::Running(run, watch)) => match ev.flatten() {
                None => self.rewatch(run).await,
                Some(ev) => self.on_watch(run, watch, ev).await?,
            },
            (Wake::Deadline, Phase::Running(run, watch)) => self.on_deadline(run, watch).await?,
            (Wake::Deadline, Phase::StandingBy { told, .. }) => self.look_standing_by(told).await,
            (Wake::Plan(_) | Wake::Watch(_) | Wake::Deadline, _) => {
                unreachable!("only a waiting phase has a plan, only a running one a watch")
            }
        }))
    }

    /// The round this node waited in decided.
    async fn formed(
        &mut self,
        plan: Result<Plan, RendezvousError>,
        cand: Join,
    ) -> Result<Phase, RendezvousError> {
        Ok(match plan {
            Ok(plan) => {
                self.last_gen = plan.generation;
                match self.running(plan.clone(), None, true).await {
                    Ok(p) => p,
                    Err(e) if is_transient(&e) => self.rewatch_plan(plan, None).await,
                    Err(e) => return Err(e),
                }
            }
            Err(RendezvousError::RunFinished(_)) => {
                // A standby (or a late joiner) of a run that ended: the agent ends as a joiner
                // of a finished run does.
                self.release().await;
                match self.finished().await {
                    Ok(Some(end)) => self.emit(Event::Finished(end)),
                    _ => self.emit(Event::Error(format!("run {} finished", self.cfg.run_id))),
                }
                Phase::Idle
            }
            Err(RendezvousError::Store(e)) if self.lease.is_some() => {
                tracing::warn!(error = %e, "rendezvous store error while waiting; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                self.join(cand).await.unwrap_or(Phase::Idle)
            }
            Err(e) => {
                self.release().await;
                self.emit(Event::Error(e.to_string()));
                Phase::Idle
            }
        })
    }

    /// A node whose round failed (join timeout, refused) is no candidate any more: its lease,
    /// and with it its waiting key, goes now — not once its agent's connection closes and the
    /// reconnect grace passes, during which a node arriving would form a group with it.
    async fn release(&mut self) {
        if let Some(l) = self.lease.take() {
            self.stop_keeper();
            if let Err(e) = self.round.state().revoke_lease(l).await {
                tracing::debug!(error = %e, "could not revoke the lease of a failed round; it expires");
            }
        }
    }

    /// Fences when `lost` is this session's current lease (a stale keeper's report is not);
    /// true when it did.
    pub(super) fn fence_if_current(&mut self, (lease, reason): Lost) -> bool {
        let current = generation::fences(self.lease, lease);
        if current {
            self.fence(reason);
        }
        current
    }

    /// Whether the agent was heard at or after `at_ms` (ms since the epoch).
    pub(super) fn heard_since(&self, at_ms: u64) -> bool {
        self.heard.load(std::sync::atomic::Ordering::SeqCst) >= at_ms
    }

    pub fn fence(&mut self, reason: String) {
        tracing::error!(node = %self.cfg.node_id, "{reason}");
        self.stop_keeper();
        self.lease = None;
        self.emit(Event::Fenced(reason));
    }

    pub async fn join(&mut self, cand: Join) -> Result<Phase, RendezvousError> {
        let c = &cand.candidate;
        self.probe_at = Some((c.advertise_addr.clone(), c.probe_port));
        let mut lease = self.ensure_lease().await?;
        // A node that comes back is no longer lost; its old membership goes as the join
        // arrives, in one transaction (see `Round::rejoin`).
        let joined = self.round.rejoin(&cand, lease, self.last_gen).await;
        if let Err(StoreError::LeaseLost(_)) = joined {
            // The lease ran out while this node was stopped or cut off (the keeper has not said
            // so yet): this node was fenced; it joins as a newcomer with a fresh lease.
            tracing::warn!(node = %self.cfg.node_id, "lease {lease:#x} expired; joining with a new lease");
            self.stop_keeper();
            self.lease = None;
            lease = self.ensure_lease().await?;
            self.round.rejoin(&cand, lease, self.last_gen).await?;
        } else {
            joined?;
        }
        let round = self.round.clone();
        let node = self.cfg.node_id.clone();
        let after = self.last_gen;
        let events = self.events.clone();
        let waiter: Waiter = Box::pin(async move {
            round
                .wait_for_plan(&node, after, lease, |r| {
                    let _ = events.send(Event::Waiting(r.to_string()));
                })
                .await
        });
        Ok(Phase::Waiting(cand, waiter))
    }

    /// Handles a request, retrying transient store errors for up to ~10 s. A lease lost
    /// meanwhile fences at once (fencing stays bounded by the TTL, not by these retries).
    async fn on_request(&mut self, req: Request, phase: Phase) -> Result<Phase, RendezvousError> {
        let mut lost_rx = std::mem::replace(&mut self.lost_rx, mpsc::unbounded_channel().1);
        let r = self.on_request_or_lost(req, phase, &mut lost_rx).await;
        self.lost_rx = lost_rx;
        r
    }

    async fn on_request_or_lost(
        &mut self,
        req: Request,
        phase: Phase,
        lost_rx: &mut mpsc::UnboundedReceiver<Lost>,
    ) -> Result<Phase, RendezvousError> {
        let mut phase = phase;
        let mut attempt = 0;
        loop {
            let result = tokio::select! {
                r = self.handle(req.clone(), &mut phase) => r,
                Some(lost) = lost_rx.recv() => {
                    if self.fence_if_current(lost) {
                        return Ok(Phase::Idle);
                    }
                    continue;
                }
            };
            match result {
                Err(e) if is_transient(&e) && attempt < 19 => {
                    attempt += 1;
                    tracing::warn!(error = %e, ?req, "store unavailable; retrying the request");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Ok(Some(next)) => return Ok(next),
                Ok(None) => return Ok(phase),
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt at a request; `Some(phase)` replaces the phase.
    async fn handle(
        &mut self,
        req: Request,
        phase: &mut Phase,
    ) -> Result<Option<Phase>, RendezvousError> {
        match req {
            Request::Join(cand, after) => {
                let waiting = matches!(phase, Phase::Waiting(..));
                if generation::join_is_duplicate(waiting, phase.running_generation(), after) {
                    return Ok(None);
                }
                if let Some(end) = self.finished().await? {
                    self.emit(Event::Finished(end));
                    return Ok(Some(Phase::Idle));
                }
                self.join(cand).await.map(Some)
            }
            // Noted by the forwarder in `spawn_session`; the keeper task renews. It may be the
            // answer to a ping (`silence`).
            Request::KeepAlive => {
                if let Phase::Running(run, _) = phase {
                    self.agent_heard(run);
                }
                Ok(None)
            }
            Request::Succeeded(g) => {
                self.round.state().record_done(g, &self.cfg.node_id).await?;
                if let Phase::Running(run, _) = &*phase {
                    if run.generation() == g {
                        self.maybe_finish(&run.plan).await?;
                    }
                }
                Ok(None)
            }
            Request::Failed {
                generation,
                description,
                cause,
            } => {
                let (restart, restarts, cause) = self
                    .decide_failure(generation, &description, cause.as_ref())
                    .await?;
                self.emit(Event::FailureDecision {
                    restart,
                    restarts,
                    cause,
                });
                Ok(None)
            }
            Request::Commit { commit, retention } => {
                let running = match &*phase {
                    Phase::Running(run, _) => Some(run.plan.clone()),
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
                    Phase::Running(run, _) if kind == crate::store::reports::ReportKind::Peers => {
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
            Request::Leave => {
                self.leave().await?;
                Ok(Some(Phase::Left))
            }
            // A repeat while standing by, or a stale one once the node joined again: nothing.
            Request::StandBy(_) => Ok(matches!(phase, Phase::Idle).then(|| Phase::StandingBy {
                at: tokio::time::Instant::now(),
                told: None,
            })),
        }
    }

    /// Looks at the run for the agent standing by and tells it what changed (`standby.rs`). A
    /// store that does not answer is asked again at the next look.
    async fn look_standing_by(&mut self, told: Option<standby::Look>) -> Phase {
        let next = tokio::time::Instant::now() + standby::LOOK_EVERY;
        let seen = match self.seen_standing_by().await {
            Ok(seen) => seen,
            Err(e) => {
                tracing::debug!(error = %e, "cannot look at the run for a standing-by node");
                return Phase::StandingBy { at: next, told };
            }
        };
        let look = standby::look(&self.cfg.node_id, seen);
        if told.as_ref() != Some(&look) {
            match &look {
                standby::Look::Ended(end) => {
                    self.emit(Event::Finished(end.clone()));
                    return Phase::Idle;
                }
                standby::Look::Reach(reach) => self.emit(Event::StandBy(reach.clone())),
            }
        }
        Phase::StandingBy {
            at: next,
            told: Some(look),
        }
    }

    /// What a standing-by node's session reads of the run: its end, the current generation's
    /// live members and the waiting candidates.
    async fn seen_standing_by(&self) -> Result<standby::Seen, RendezvousError> {
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
                    Err(e) => Err(e.to_string()),
                }
            }
            _ => Err(format!(
                "stale commit: generation {} is not running on node {}",
                commit.generation, self.cfg.node_id
            )),
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

    /// Leaves the run: records why, revokes the lease (survivors re-form).
    async fn leave(&mut self) -> Result<(), RendezvousError> {
        if let Some(l) = self.lease {
            self.stop_keeper();
            let state = self.round.state();
            state.record_lost(&self.cfg.node_id, loss::LEFT).await?;
            state.revoke_lease(l).await?;
            self.lease = None;
        }
        Ok(())
    }
}

/// Errors worth retrying: the store did not answer (as opposed to a decision or a timeout).
pub(super) fn is_transient(e: &RendezvousError) -> bool {
    matches!(e, RendezvousError::Store(StoreError::Unavailable { .. }))
}
