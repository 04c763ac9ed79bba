//! The session of one node in one run: the state machine between an agent and the store.
//!
//! # Theory of operation
//!
//! [`spawn_session`] starts an actor that owns the node's lease and speaks in [`Request`]s
//! (from the agent) and [`Event`]s (to the agent). The same actor runs inside the agent when the
//! agent talks to the store directly (embedded in-memory store, `--rdzv-backend etcd`), and inside
//! a `drun-rendezvous` replica for each connected agent (then the agent's keep-alive messages, not
//! a timer, renew the lease, so a dead agent's lease really expires).
//!
//! * **Join** writes `waiting/<node>` under the lease and runs [`Round::wait_for_plan`]; when the
//!   group forms the node's `members/<g>/<node>` key is written and [`Event::Formed`] sent. A
//!   round that fails (join timeout, a set that cannot form) is published by its decider, so
//!   every session waiting in it sends the same [`Event::Error`] line.
//! * While generation `g` runs, a prefix watch looks for what ends it: `gen/<g>/closed` (someone
//!   asked for a re-form), a member key of `g` deleted (a node left or its lease expired), a new
//!   node waiting while the group is below MAX (scale-up), or `finished`. Whoever sees a cause
//!   first closes `g` in a transaction guarded by `gen/current == g`, so all members receive the
//!   same [`Event::Reform`].
//! * **Succeeded** records `gen/<g>/done/<node>`; when every member of `g` has, `finished` is
//!   written once and every session reports [`Event::Finished`] (the exit barrier).
//! * **Failed** spends one unit of the job-wide `--max-restarts` budget in a transaction and
//!   closes `g`, or, with the budget spent, ends the run as failed.
//! * A lost lease (expired or revoked) is [`Event::Fenced`]: the node is no longer a member and
//!   must stop its workers; its next Join starts over with a new lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::human::duration as human;
use crate::ledger::{CommitOutcome, Ledger, LedgerError, NodeCommit, Retention};
use crate::loss;

mod membership;
use crate::round::{RestartCause, Restarts};
use crate::store::{Compare, LeaseId, Op, Store, Txn, WatchEvent};
use crate::{Candidate, Plan, RendezvousError, Round, RoundConfig, StoreError};

/// Settings of one node's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Run id.
    pub run_id: String,
    /// This node's identity.
    pub node_id: String,
    /// Completion rules of each round.
    pub round: RoundConfig,
    /// Lease time-to-live (etcd rounds it up to whole seconds); default 10 s.
    pub lease_ttl: Duration,
    /// Keep-alive period; default TTL/3.
    pub keep_alive_interval: Duration,
    /// Job-wide worker-failure restart budget (`--max-restarts`).
    pub max_restarts: u32,
    /// Renew the lease on a timer (agent-side). `false`: only on [`Request::KeepAlive`].
    pub auto_keep_alive: bool,
    /// `--on-scale-up checkpoint`: before a newcomer below MAX re-forms the group, ask every
    /// rank for a coordinated checkpoint and wait this long at most for its seal (failure case
    /// 13: lost work stays under one step). `None`: re-form at once (torchrun's behaviour).
    pub scale_up_save: Option<Duration>,
}

/// State carried over when an agent reconnects to another server replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The lease the agent holds.
    pub lease: LeaseId,
    /// Generation the agent runs workers of (0: none).
    pub generation: u64,
    /// The candidate the agent is waiting with, if it is waiting.
    pub waiting: Option<Candidate>,
}

/// How a run ended (key `finished`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnd {
    /// All workers of the last generation exited 0.
    pub success: bool,
    /// Human-readable cause.
    pub reason: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl RunEnd {
    fn now(success: bool, reason: impl Into<String>) -> Self {
        RunEnd {
            success,
            reason: reason.into(),
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }
}

/// A job-wide request for a coordinated checkpoint (key `gen/<g>/preempt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveRequest {
    /// Node that asked.
    pub node_id: String,
    /// Why (e.g. "SIGUSR1: preemption warning").
    pub reason: String,
    /// `ckpt/latest` when asked (a manifest id; empty: none): the save is done when a newer
    /// manifest is sealed.
    pub latest_before: String,
    /// When, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Asked before admitting a newcomer (`--on-scale-up checkpoint`), not for a preemption:
    /// the agents carry on after the seal instead of stopping.
    #[serde(default)]
    pub scale_up: bool,
}

/// A newcomer held at the door of generation `generation` until a coordinated checkpoint is
/// sealed (`--on-scale-up checkpoint`).
#[derive(Debug, Clone)]
struct PendingScaleUp {
    generation: u64,
    /// The newcomer that asked to join.
    node: String,
    /// `ckpt/latest` when the save was requested: a newer manifest id is the save.
    latest_before: String,
    /// Re-form without a checkpoint after this.
    deadline: Instant,
}

/// From the agent to its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Ask to be admitted to the generation after the given one (the last this agent ran
    /// workers of, 0 for none). Duplicates are ignored: while already waiting, or when the
    /// session already runs a newer generation than the agent has seen.
    Join(Candidate, u64),
    /// Renew the lease (server-side sessions).
    KeepAlive,
    /// Every local worker of generation `g` exited 0.
    Succeeded(u64),
    /// A local worker of generation `generation` failed.
    Failed {
        /// Generation.
        generation: u64,
        /// One line: which rank, which exit.
        description: String,
    },
    /// Leave the run: revoke the lease (survivors re-form).
    Leave,
    /// Ask every rank of generation `generation` for a coordinated checkpoint (once per
    /// generation; every member gets [`Event::SaveRequested`]).
    Preempt {
        /// Generation.
        generation: u64,
        /// Why, one line.
        reason: String,
    },
    /// Record this node's checkpoint report of a step; answered by [`Event::Committed`].
    Commit {
        /// The node's batched report.
        commit: NodeCommit,
        /// Retention policy applied when this commit seals the step.
        retention: Retention,
    },
    /// The resume point of generation `generation` failed verification on this node: mark
    /// manifest `id` bad and re-form (onto the previous manifest).
    MarkBad {
        /// Generation whose plan carried the manifest.
        generation: u64,
        /// Manifest id.
        id: String,
        /// One line: which file, what differed.
        reason: String,
    },
}

/// From the session to the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The session holds `lease`.
    Opened {
        /// Lease id.
        lease: LeaseId,
    },
    /// Rendezvous progress (e.g. "waiting for 1 more node (1/2)").
    Waiting(String),
    /// The group formed and this node is a member.
    Formed(Plan),
    /// The running generation ended; stop workers and join again.
    Reform {
        /// The generation that ended.
        generation: u64,
        /// Why.
        reason: String,
    },
    /// The run ended (or had already ended when the session opened).
    Finished(RunEnd),
    /// Answer to [`Request::Failed`]: restart (budget left) or not.
    FailureDecision {
        /// Whether the group restarts.
        restart: bool,
        /// Counters after the decision.
        restarts: Restarts,
    },
    /// The lease is gone: this node is no longer a member.
    Fenced(String),
    /// The rendezvous failed for good (e.g. join timeout); one line.
    Error(String),
    /// A coordinated checkpoint was requested for the running generation.
    SaveRequested(SaveRequest),
    /// A checkpoint was sealed (`ckpt/latest` moved to this manifest id).
    Sealed(String),
    /// Answer to [`Request::Commit`].
    Committed {
        /// Generation of the commit.
        generation: u64,
        /// Step of the commit.
        step: u64,
        /// What it achieved, or one line saying why it was refused.
        result: Result<CommitOutcome, String>,
    },
}

/// Starts a session actor; it ends when the request sender is dropped or after `Leave`.
pub fn spawn_session(
    store: Arc<dyn Store>,
    cfg: SessionConfig,
    resume: Option<Resume>,
) -> (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
) {
    let (req_tx, mut outer_rx) = mpsc::unbounded_channel();
    let (inner_tx, req_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let heard = Arc::new(AtomicU64::new(now_ms()));
    // Notes when the agent was last heard from, even while the actor is busy with the store:
    // a server-side session keeps the lease alive only for an agent that still talks.
    let heard_fwd = heard.clone();
    tokio::spawn(async move {
        while let Some(r) = outer_rx.recv().await {
            heard_fwd.store(now_ms(), Ordering::SeqCst);
            if inner_tx.send(r).is_err() {
                return;
            }
        }
    });
    // The caller's span (an agent's `node=...`) stays on the session's lines.
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        let mut actor = Actor::new(store, cfg, ev_tx, heard);
        if let Err(e) = actor.run(resume, req_rx).await {
            actor.emit(Event::Error(e.to_string()));
        }
        actor.stop_keeper();
    }));
    (req_tx, ev_rx)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

type Waiter =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Plan, RendezvousError>> + Send>>;

// One value per session, moved between states: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Phase {
    Idle,
    /// The agent left (its lease is revoked): the session ends, closing its event stream.
    Left,
    Waiting(Candidate, Waiter),
    Running(Plan, mpsc::UnboundedReceiver<Option<WatchEvent>>),
}

struct Actor {
    store: Arc<dyn Store>,
    round: Round,
    ledger: Ledger,
    cfg: SessionConfig,
    events: mpsc::UnboundedSender<Event>,
    lease: Option<LeaseId>,
    last_gen: u64,
    /// When the agent last sent anything (ms since the epoch).
    heard: Arc<AtomicU64>,
    keeper: Option<tokio::task::JoinHandle<()>>,
    /// When the running generation's successor must have written its membership key.
    succ_deadline: Option<Instant>,
    /// Node rank 0 only: a newcomer waits while a coordinated checkpoint is taken.
    scale_up: Option<PendingScaleUp>,
    lost_tx: mpsc::UnboundedSender<(LeaseId, String)>,
    lost_rx: mpsc::UnboundedReceiver<(LeaseId, String)>,
    /// This session's token under `sessions/<node>` (server-side sessions).
    token: String,
}

impl Actor {
    fn new(
        store: Arc<dyn Store>,
        cfg: SessionConfig,
        events: mpsc::UnboundedSender<Event>,
        heard: Arc<AtomicU64>,
    ) -> Self {
        let (lost_tx, lost_rx) = mpsc::unbounded_channel();
        Self {
            round: Round::new(store.clone(), &cfg.run_id, cfg.round),
            ledger: Ledger::new(store.clone(), &cfg.run_id),
            store,
            cfg,
            events,
            lease: None,
            last_gen: 0,
            heard,
            keeper: None,
            succ_deadline: None,
            scale_up: None,
            lost_tx,
            lost_rx,
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

    /// Renews `lease` every keep-alive interval on its own task, so slow store operations of the
    /// actor never starve it. Server-side it renews only while the agent is heard from within a
    /// TTL. Reports a lost lease (or a whole TTL without a successful renewal) on `lost_tx`.
    fn start_keeper(&mut self, lease: LeaseId) {
        self.stop_keeper();
        let store = self.store.clone();
        let (ttl, every, auto) = (
            self.cfg.lease_ttl,
            self.cfg.keep_alive_interval,
            self.cfg.auto_keep_alive,
        );
        let heard = self.heard.clone();
        let lost = self.lost_tx.clone();
        self.keeper = Some(tokio::spawn(async move {
            let mut last_ok = Instant::now();
            loop {
                tokio::time::sleep(every).await;
                if !auto
                    && now_ms().saturating_sub(heard.load(Ordering::SeqCst))
                        > ttl.as_millis() as u64
                {
                    continue; // the agent went silent: let its lease run out
                }
                // Never wait past the moment the lease would expire: fencing is bounded by the TTL.
                let left = ttl
                    .saturating_sub(last_ok.elapsed())
                    .max(Duration::from_millis(100));
                let renewed = match tokio::time::timeout(left, store.lease_keep_alive(lease)).await
                {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Unavailable {
                        endpoint: store.name(),
                        reason: format!("no answer to the keep-alive within {}", human(left)),
                    }),
                };
                match renewed {
                    Ok(_) => last_ok = Instant::now(),
                    Err(StoreError::LeaseLost(_)) => {
                        let _ =
                            lost.send((lease, format!("lease {lease:#x} expired or was revoked")));
                        return;
                    }
                    Err(e) if last_ok.elapsed() >= ttl => {
                        let _ = lost.send((
                            lease,
                            format!(
                                "could not renew lease {lease:#x} for {} (TTL {}): {e}",
                                human(last_ok.elapsed()),
                                human(ttl)
                            ),
                        ));
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, lease = format!("{lease:#x}"), "keep-alive failed; retrying until the lease would expire");
                    }
                }
            }
        }));
    }

    fn stop_keeper(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }

    fn emit(&self, ev: Event) {
        let _ = self.events.send(ev);
    }

    /// Reports a `gen/<g>/preempt` value (a [`SaveRequest`]) to the agent.
    fn emit_save_request(&self, value: &[u8]) {
        match serde_json::from_slice::<SaveRequest>(value) {
            Ok(req) => self.emit(Event::SaveRequested(req)),
            Err(e) => tracing::warn!(error = %e, "ignoring an undecodable save request"),
        }
    }

    async fn finished(&self) -> Result<Option<RunEnd>, StoreError> {
        let key = self.round.keys().finished();
        match self.store.get(&key).await? {
            None => Ok(None),
            Some(kv) => {
                serde_json::from_slice(&kv.value)
                    .map(Some)
                    .map_err(|e| StoreError::Corrupt {
                        key,
                        reason: e.to_string(),
                    })
            }
        }
    }

    async fn ensure_lease(&mut self) -> Result<LeaseId, StoreError> {
        if let Some(l) = self.lease {
            return Ok(l);
        }
        let l = self.store.lease_grant(self.cfg.lease_ttl).await?;
        self.lease = Some(l);
        self.start_keeper(l);
        self.claim(l).await?;
        self.emit(Event::Opened { lease: l });
        Ok(l)
    }

    async fn run(
        &mut self,
        resume: Option<Resume>,
        mut requests: mpsc::UnboundedReceiver<Request>,
    ) -> Result<(), RendezvousError> {
        let mut phase = Phase::Idle;
        match resume {
            Some(r) if self.store.lease_keep_alive(r.lease).await.is_ok() => {
                self.lease = Some(r.lease);
                self.start_keeper(r.lease);
                self.claim(r.lease).await?;
                self.emit(Event::Opened { lease: r.lease });
                if r.generation > 0 {
                    if let Some(plan) = self.round.plan(r.generation).await? {
                        self.last_gen = r.generation;
                        phase = self.running(plan, false).await?;
                    }
                } else if let Some(c) = r.waiting {
                    phase = self.join(c).await?;
                }
            }
            Some(r) => {
                self.emit(Event::Fenced(format!(
                    "lease {:#x} expired while reconnecting",
                    r.lease
                )));
            }
            None => {
                if let Some(end) = self.finished().await? {
                    self.emit(Event::Finished(end));
                    return Ok(());
                }
                self.ensure_lease().await?;
            }
        }
        loop {
            phase = match phase {
                Phase::Left => return Ok(()),
                Phase::Idle => tokio::select! {
                    req = requests.recv() => match req {
                        None => return self.abandoned().await,
                        Some(r) => self.on_request(r, Phase::Idle).await?,
                    },
                    Some((l, reason)) = self.lost_rx.recv() => { self.lease_lost(l, reason); Phase::Idle }
                },
                Phase::Waiting(cand, mut waiter) => tokio::select! {
                    req = requests.recv() => match req {
                        None => return self.abandoned().await,
                        Some(r) => self.on_request(r, Phase::Waiting(cand, waiter)).await?,
                    },
                    plan = &mut waiter => match plan {
                        Ok(plan) => {
                            self.last_gen = plan.generation;
                            match self.running(plan.clone(), true).await {
                                Ok(p) => p,
                                Err(e) if is_transient(&e) => self.rewatch(plan).await,
                                Err(e) => return Err(e),
                            }
                        }
                        Err(RendezvousError::RunFinished(_)) => {
                            // A standby (or a late joiner) of a run that ended: the agent ends
                            // as a joiner of a finished run does.
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
                            self.emit(Event::Error(e.to_string()));
                            Phase::Idle
                        }
                    },
                    Some((l, reason)) = self.lost_rx.recv() => { self.lease_lost(l, reason); Phase::Idle }
                },
                Phase::Running(plan, mut watch) => tokio::select! {
                    req = requests.recv() => match req {
                        None => return self.abandoned().await,
                        Some(r) => self.on_request(r, Phase::Running(plan, watch)).await?,
                    },
                    ev = watch.recv() => match ev.flatten() {
                        None => self.rewatch(plan).await,
                        Some(ev) => match self.on_watch(plan.clone(), watch, ev).await {
                            Ok(p) => p,
                            Err(e) if is_transient(&e) => {
                                tracing::warn!(error = %e, "store error while watching the group; re-watching");
                                self.rewatch(plan).await
                            }
                            Err(e) => return Err(e),
                        },
                    },
                    Some((l, reason)) = self.lost_rx.recv() => { self.lease_lost(l, reason); Phase::Idle }
                    _ = sleep_until_opt(self.succ_deadline) => {
                        self.succ_deadline = None;
                        match self.check_successor_started(&plan).await {
                            Ok(()) => Phase::Running(plan, watch),
                            Err(e) if is_transient(&e) => self.rewatch(plan).await,
                            Err(e) => return Err(e),
                        }
                    }
                    _ = sleep_until_opt(self.scale_up.as_ref().map(|p| p.deadline)) => {
                        match self.scale_up_timed_out(&plan).await {
                            Ok(()) => Phase::Running(plan, watch),
                            Err(e) if is_transient(&e) => self.rewatch(plan).await,
                            Err(e) => return Err(e),
                        }
                    }
                },
            };
        }
    }

    /// Closes the generation if the successor never wrote its membership key.
    async fn check_successor_started(&self, plan: &Plan) -> Result<(), RendezvousError> {
        let keys = self.round.keys();
        if let Some(succ) = successor(plan, &self.cfg.node_id) {
            if self
                .store
                .get(&keys.member(plan.generation, &succ))
                .await?
                .is_none()
            {
                self.close(
                    plan.generation,
                    format!(
                        "node {succ} did not start within the lease TTL ({})",
                        human(self.cfg.lease_ttl)
                    ),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// The keeper gave up on `lease`: fence, unless that lease was already replaced.
    fn lease_lost(&mut self, lease: LeaseId, reason: String) {
        if self.lease == Some(lease) {
            self.fence(reason);
        }
    }

    fn fence(&mut self, reason: String) {
        tracing::error!(node = %self.cfg.node_id, "{reason}");
        self.stop_keeper();
        self.lease = None;
        self.emit(Event::Fenced(reason));
    }

    async fn join(&mut self, cand: Candidate) -> Result<Phase, RendezvousError> {
        let mut lease = self.ensure_lease().await?;
        // A node that comes back is no longer lost; its old membership goes.
        let mut stale = vec![Op::Delete(self.round.keys().lost(&self.cfg.node_id))];
        if self.last_gen > 0 {
            stale.push(Op::Delete(
                self.round.keys().member(self.last_gen, &self.cfg.node_id),
            ));
        }
        self.store
            .txn(Txn {
                compares: vec![],
                success: stale,
                failure: vec![],
            })
            .await?;
        let joined = self.round.join(&cand, lease).await;
        if let Err(StoreError::LeaseLost(_)) = joined {
            // The lease ran out while this node was stopped or cut off (the keeper has not said
            // so yet): this node was fenced; it joins as a newcomer with a fresh lease.
            tracing::warn!(node = %self.cfg.node_id, "lease {lease:#x} expired; joining with a new lease");
            self.stop_keeper();
            self.lease = None;
            lease = self.ensure_lease().await?;
            self.round.join(&cand, lease).await?;
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

    /// Enters generation `plan.generation`: membership key, watch, and a check of what may have
    /// happened before the watch started.
    /// Re-establishes the watch of a running generation after the store hiccuped, retrying
    /// transient errors; the agent hears nothing unless something really changed.
    async fn rewatch(&mut self, plan: Plan) -> Phase {
        loop {
            match self.running(plan.clone(), false).await {
                Ok(p) => return p,
                Err(e) if is_transient(&e) && self.lease.is_some() => {
                    tracing::warn!(error = %e, "store unavailable; retrying the watch");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    self.emit(Event::Error(e.to_string()));
                    return Phase::Idle;
                }
            }
        }
    }

    async fn running(&mut self, plan: Plan, announce: bool) -> Result<Phase, RendezvousError> {
        let Some(lease) = self.lease else {
            return Ok(Phase::Idle);
        };
        let keys = self.round.keys().clone();
        // Membership of generation g, under our lease, replaces the join that got us in. A
        // lease that is gone fences us; a generation already closed is reported below.
        let member = keys.member(plan.generation, &self.cfg.node_id);
        let resp = self
            .store
            .txn(Txn {
                compares: vec![],
                success: vec![
                    Op::Put {
                        key: member,
                        value: b"{}".to_vec(),
                        lease: Some(lease),
                    },
                    Op::Delete(keys.waiting(&self.cfg.node_id)),
                ],
                failure: vec![],
            })
            .await;
        match resp {
            Err(StoreError::LeaseLost(_)) => {
                self.fence(format!(
                    "lease lost before joining generation {}",
                    plan.generation
                ));
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
        if let Some(kv) = self.store.get(&keys.preempt(plan.generation)).await? {
            self.emit_save_request(&kv.value);
        }
        if let Some(kv) = self.store.get(&keys.scale_up_save(plan.generation)).await? {
            self.emit_save_request(&kv.value);
        }
        if let Some(reason) = self.closed_reason(&plan).await? {
            self.emit(Event::Reform {
                generation: plan.generation,
                reason,
            });
            return Ok(Phase::Idle);
        }
        if self
            .scale_up
            .as_ref()
            .is_some_and(|p| p.generation != plan.generation)
        {
            self.scale_up = None;
        }
        // The successor writes its membership key as soon as it sees the plan; if it has not
        // within a lease TTL, it died before starting.
        self.succ_deadline = None;
        if let Some(succ) = successor(&plan, &self.cfg.node_id) {
            if self
                .store
                .get(&keys.member(plan.generation, &succ))
                .await?
                .is_none()
            {
                self.succ_deadline = Some(Instant::now() + self.cfg.lease_ttl);
            }
        }
        Ok(Phase::Running(plan, watch))
    }

    /// The watches of a running generation, merged into one channel (`None` = a watch broke).
    ///
    /// Kept linear in the group size: each node watches the end of its generation
    /// (`gen/<g>/`), the end of the run, and only its successor's membership key in node-rank
    /// order, so every loss is seen by exactly one node; node rank 0 alone watches the
    /// waiting set for scale-up. Done records live outside `gen/<g>/` so nobody watches them: the
    /// last node to succeed writes the end of the run.
    async fn watch_generation(
        &self,
        plan: &Plan,
    ) -> Result<mpsc::UnboundedReceiver<Option<WatchEvent>>, StoreError> {
        let keys = self.round.keys();
        let g = plan.generation;
        let mut prefixes = vec![
            keys.generation_prefix(g),
            keys.finished(),
            keys.ckpt_latest(),
        ];
        if let Some(succ) = successor(plan, &self.cfg.node_id) {
            prefixes.push(keys.member(g, &succ));
        }
        let first = plan
            .members
            .first()
            .is_some_and(|m| m.node_id == self.cfg.node_id);
        if first && plan.members.len() < self.cfg.round.max_nodes {
            prefixes.push(keys.waiting_prefix());
        }
        let (tx, rx) = mpsc::unbounded_channel();
        for prefix in prefixes {
            let mut source = self.store.watch_prefix(&prefix, 0).await?;
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
        let keys = self.round.keys();
        if let Some(kv) = self.store.get(&keys.closed(plan.generation)).await? {
            return Ok(Some(kv.value_str()));
        }
        let (g, _) = self.round.current_generation().await?;
        if g > plan.generation {
            return Ok(Some(format!("generation {g} formed")));
        }
        Ok(None)
    }

    /// Closes generation `g` once (guarded) for a membership change, with `reason`, and counts
    /// one membership restart.
    async fn close(&self, g: u64, reason: String) -> Result<bool, RendezvousError> {
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
                success: vec![Op::put(keys.closed(g), reason.clone())],
                failure: vec![],
            })
            .await?;
        if resp.succeeded {
            tracing::info!(run = %self.cfg.run_id, gen = g, %reason, "generation closed for re-form");
            self.round.record_restart(RestartCause::Membership).await?;
        }
        Ok(resp.succeeded)
    }

    async fn on_watch(
        &mut self,
        plan: Plan,
        watch: mpsc::UnboundedReceiver<Option<WatchEvent>>,
        ev: WatchEvent,
    ) -> Result<Phase, RendezvousError> {
        let keys = self.round.keys().clone();
        let g = plan.generation;
        let succ = successor(&plan, &self.cfg.node_id);
        let is_succ = |node: &str| succ.as_deref() == Some(node);
        match ev {
            WatchEvent::Put(kv) if kv.key == keys.closed(g) => {
                self.emit(Event::Reform {
                    generation: g,
                    reason: kv.value_str(),
                });
                return Ok(Phase::Idle);
            }
            WatchEvent::Put(kv) if kv.key == keys.preempt(g) => {
                self.emit_save_request(&kv.value);
            }
            WatchEvent::Put(kv) if kv.key == keys.scale_up_save(g) => {
                self.emit_save_request(&kv.value);
            }
            WatchEvent::Put(kv) if kv.key == keys.ckpt_latest() => {
                let id = kv.value_str();
                self.emit(Event::Sealed(id.clone()));
                if let Some(p) = self
                    .scale_up
                    .take_if(|p| p.generation == g && id > p.latest_before)
                {
                    if !self.newcomer_waiting(&plan).await? {
                        tracing::info!(run = %self.cfg.run_id, gen = g, "node {} stopped waiting before the checkpoint was sealed: no re-form", p.node);
                        return Ok(Phase::Running(plan, watch));
                    }
                    self.close(
                        g,
                        format!(
                            "node {} is waiting to join (scale-up), admitted after {} was sealed",
                            p.node,
                            crate::ledger::describe_id(&id)
                        ),
                    )
                    .await?;
                }
            }
            WatchEvent::Put(kv) if kv.key == keys.finished() => {
                let end: RunEnd =
                    serde_json::from_slice(&kv.value).map_err(|e| StoreError::Corrupt {
                        key: kv.key.clone(),
                        reason: e.to_string(),
                    })?;
                self.emit(Event::Finished(end));
                return Ok(Phase::Idle);
            }
            WatchEvent::Put(kv) if kv.key.starts_with(&keys.waiting_prefix()) => {
                let node = &kv.key[keys.waiting_prefix().len()..];
                if plan.member(node).is_none() && plan.members.len() < self.cfg.round.max_nodes {
                    match self.cfg.scale_up_save {
                        None => {
                            self.close(g, format!("node {node} is waiting to join (scale-up)"))
                                .await?;
                        }
                        Some(limit) => {
                            if self.scale_up.as_ref().is_none_or(|p| p.generation != g) {
                                self.request_scale_up_save(g, node, limit).await?;
                            }
                        }
                    }
                }
            }
            WatchEvent::Put(kv)
                if kv.key.starts_with(&keys.members_prefix(g))
                    && is_succ(&kv.key[keys.members_prefix(g).len()..]) =>
            {
                self.succ_deadline = None;
            }
            WatchEvent::Delete(key, _)
                if key.starts_with(&keys.waiting_prefix())
                    && self.scale_up.as_ref().is_some_and(|p| p.generation == g) =>
            {
                let off = !self.newcomer_waiting(&plan).await?;
                if let Some(p) = self.scale_up.take_if(|_| off) {
                    tracing::info!(run = %self.cfg.run_id, gen = g, "node {} stopped waiting to join: the scale-up is called off, no re-form", p.node);
                }
            }
            WatchEvent::Delete(key, _) if key.starts_with(&keys.members_prefix(g)) => {
                let node = &key[keys.members_prefix(g).len()..];
                if is_succ(node) {
                    let why = self
                        .store
                        .get(&keys.lost(node))
                        .await?
                        .map_or_else(|| loss::LEASE_EXPIRED.to_string(), |kv| kv.value_str());
                    if self.preemption_sealed(g).await? {
                        // Every node stops after a preemption checkpoint (exit 5): nothing
                        // re-forms, and saying so would mislead.
                        tracing::debug!(run = %self.cfg.run_id, gen = g, "node {node} left after the preemption checkpoint");
                    } else {
                        self.close(g, loss::describe(&plan, node, &why)).await?;
                    }
                }
            }
            _ => {}
        }
        Ok(Phase::Running(plan, watch))
    }

    /// Asks every rank of generation `g` for a coordinated checkpoint before `node` is admitted;
    /// the generation closes when it is sealed, or after `limit` without one.
    async fn request_scale_up_save(
        &mut self,
        g: u64,
        node: &str,
        limit: Duration,
    ) -> Result<(), RendezvousError> {
        let latest_before = self
            .request_save(
                g,
                format!("node {node} is waiting to join (scale-up)"),
                true,
            )
            .await?;
        tracing::info!(
            run = %self.cfg.run_id,
            gen = g,
            "node {node} is waiting to join: asking every rank for a checkpoint first (--on-scale-up checkpoint, up to {})", human(limit)
        );
        self.scale_up = Some(PendingScaleUp {
            generation: g,
            node: node.to_string(),
            latest_before,
            deadline: Instant::now() + limit,
        });
        Ok(())
    }

    /// Writes generation `g`'s request for a coordinated checkpoint, once (`gen/<g>/preempt`, or
    /// `gen/<g>/scale-up-save` for a scale-up); every member sees it through its watch. Returns
    /// `ckpt/latest` at the time: a newer manifest id is the requested save.
    async fn request_save(
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
    async fn newcomer_waiting(&self, plan: &Plan) -> Result<bool, RendezvousError> {
        let prefix = self.round.keys().waiting_prefix();
        Ok(self
            .store
            .get_prefix(&prefix)
            .await?
            .iter()
            .any(|kv| plan.member(&kv.key[prefix.len()..]).is_none()))
    }

    /// The scale-up save was not sealed in time: admit the newcomer anyway.
    async fn scale_up_timed_out(&mut self, plan: &Plan) -> Result<(), RendezvousError> {
        // Taken whatever its generation: a deadline left from an older one must not fire again.
        if let Some(p) = self
            .scale_up
            .take()
            .filter(|p| p.generation == plan.generation)
        {
            if !self.newcomer_waiting(plan).await? {
                return Ok(());
            }
            let limit = self.cfg.scale_up_save.unwrap_or_default();
            self.close(
                p.generation,
                format!(
                    "node {} is waiting to join (scale-up); no checkpoint was sealed within {}, re-forming without one",
                    p.node,
                    human(limit)
                ),
            )
            .await?;
        }
        Ok(())
    }

    async fn maybe_finish(&self, plan: &Plan) -> Result<(), RendezvousError> {
        let keys = self.round.keys();
        let done = self
            .store
            .get_prefix(&keys.done_prefix(plan.generation))
            .await?;
        let all = plan.members.iter().all(|m| {
            done.iter()
                .any(|kv| kv.key == keys.done(plan.generation, &m.node_id))
        });
        if all {
            let end = RunEnd::now(
                true,
                format!(
                    "all {} workers of generation {} succeeded",
                    plan.world_size, plan.generation
                ),
            );
            self.store
                .txn(Txn {
                    compares: vec![
                        Compare::Missing(keys.finished()),
                        Compare::Missing(keys.closed(plan.generation)),
                    ],
                    success: vec![Op::put(
                        keys.finished(),
                        serde_json::to_vec(&end).expect("serializes"),
                    )],
                    failure: vec![],
                })
                .await?;
        }
        Ok(())
    }

    /// Handles a request, retrying transient store errors for up to ~10 s.
    async fn on_request(&mut self, req: Request, phase: Phase) -> Result<Phase, RendezvousError> {
        let mut phase = phase;
        for attempt in 0..20 {
            match self.handle(req.clone(), &mut phase).await {
                Err(e) if is_transient(&e) && attempt < 19 => {
                    tracing::warn!(error = %e, ?req, "store unavailable; retrying the request");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Ok(Some(next)) => return Ok(next),
                Ok(None) => return Ok(phase),
                Err(e) => return Err(e),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// One attempt at a request; `Some(phase)` replaces the phase.
    async fn handle(
        &mut self,
        req: Request,
        phase: &mut Phase,
    ) -> Result<Option<Phase>, RendezvousError> {
        match req {
            Request::Join(cand, after) => {
                match &*phase {
                    Phase::Waiting(..) => return Ok(None),
                    Phase::Running(plan, _) if plan.generation > after => return Ok(None),
                    _ => {}
                }
                if let Some(end) = self.finished().await? {
                    self.emit(Event::Finished(end));
                    return Ok(Some(Phase::Idle));
                }
                self.join(cand).await.map(Some)
            }
            // Noted by the forwarder in `spawn_session`; the keeper task renews.
            Request::KeepAlive => Ok(None),
            Request::Succeeded(g) => {
                let keys = self.round.keys().clone();
                self.store
                    .put(&keys.done(g, &self.cfg.node_id), b"{}".to_vec(), None)
                    .await?;
                if let Phase::Running(plan, _) = &*phase {
                    if plan.generation == g {
                        self.maybe_finish(plan).await?;
                    }
                }
                Ok(None)
            }
            Request::Failed {
                generation,
                description,
            } => {
                let (restart, restarts) = self.decide_failure(generation, &description).await?;
                self.emit(Event::FailureDecision { restart, restarts });
                Ok(None)
            }
            Request::Commit { commit, retention } => {
                let result = match &*phase {
                    Phase::Running(plan, _) if plan.generation == commit.generation => {
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
                Ok(None)
            }
            Request::Preempt { generation, reason } => {
                self.request_save(generation, reason, false).await?;
                Ok(None)
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
                )
                .await?;
                Ok(None)
            }
            Request::Leave => {
                if let Some(l) = self.lease {
                    self.stop_keeper();
                    let lost = self.round.keys().lost(&self.cfg.node_id);
                    self.store.put(&lost, loss::LEFT.into(), None).await?;
                    self.store.lease_revoke(l).await?;
                    self.lease = None;
                }
                Ok(Some(Phase::Left))
            }
        }
    }

    /// Spends one restart of the job-wide budget and closes `g`, or ends the run as failed.
    async fn decide_failure(
        &self,
        g: u64,
        description: &str,
    ) -> Result<(bool, Restarts), RendezvousError> {
        if let Some(restarts) = self.attribute_to_loss(g, description).await? {
            return Ok((true, restarts));
        }
        let keys = self.round.keys();
        loop {
            let restarts = self.round.restarts().await?;
            let (cur, cur_rev) = self.round.current_generation().await?;
            if let Some(kv) = self.store.get(&keys.closed(g)).await? {
                // Someone already re-forms this generation (e.g. a peer failed first).
                tracing::info!(gen = g, reason = %kv.value_str(), "failure joins an ongoing re-form");
                return Ok((true, restarts));
            }
            if cur != g {
                return Ok((true, restarts));
            }
            if restarts.failures < self.cfg.max_restarts {
                let restarts_key = keys.restarts();
                let rev = self
                    .store
                    .get(&restarts_key)
                    .await?
                    .map_or(0, |kv| kv.mod_revision);
                let mut next = restarts.clone();
                next.failures += 1;
                next.history.push(format!("generation {g}: {description}"));
                let resp = self
                    .store
                    .txn(Txn {
                        compares: vec![
                            Compare::ModRevisionEquals(keys.gen_current(), cur_rev),
                            Compare::ModRevisionEquals(restarts_key.clone(), rev),
                            Compare::Missing(keys.closed(g)),
                        ],
                        success: vec![
                            Op::put(restarts_key, serde_json::to_vec(&next).expect("serializes")),
                            Op::put(keys.closed(g), format!("worker failure: {description}")),
                        ],
                        failure: vec![],
                    })
                    .await?;
                if resp.succeeded {
                    return Ok((true, next));
                }
                continue;
            }
            let end = RunEnd::now(
                false,
                format!(
                    "{description}; restart budget spent ({} of {} used)",
                    restarts.failures, self.cfg.max_restarts
                ),
            );
            let mut last = restarts.clone();
            last.history.push(format!("generation {g}: {description}"));
            self.store
                .txn(Txn {
                    compares: vec![Compare::Missing(keys.finished())],
                    success: vec![
                        Op::put(
                            keys.finished(),
                            serde_json::to_vec(&end).expect("serializes"),
                        ),
                        Op::put(
                            keys.restarts(),
                            serde_json::to_vec(&last).expect("serializes"),
                        ),
                    ],
                    failure: vec![],
                })
                .await?;
            let restarts = last;
            return Ok((false, restarts));
        }
    }
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The node after `node` in node-rank order (wrapping), if the group has another node.
fn successor(plan: &Plan, node: &str) -> Option<String> {
    let n = plan.members.len();
    let i = plan.members.iter().position(|m| m.node_id == node)?;
    (n > 1).then(|| plan.members[(i + 1) % n].node_id.clone())
}

/// Errors worth retrying: the store did not answer (as opposed to a decision or a timeout).
fn is_transient(e: &RendezvousError) -> bool {
    matches!(e, RendezvousError::Store(StoreError::Unavailable { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn cfg(i: usize, n: usize) -> SessionConfig {
        SessionConfig {
            run_id: "many".into(),
            node_id: format!("node{i:04}"),
            round: RoundConfig {
                min_nodes: n,
                max_nodes: n,
                last_call: Duration::ZERO,
                join_timeout: Duration::from_secs(60),
                settle: Duration::ZERO,
            },
            lease_ttl: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(10),
            max_restarts: 0,
            auto_keep_alive: true,
            scale_up_save: None,
        }
    }

    #[tokio::test]
    async fn many_sessions_form_one_group() {
        let n = 64;
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let mut links: Vec<_> = (0..n)
            .map(|i| spawn_session(store.clone(), cfg(i, n), None))
            .collect();
        for (i, (tx, _)) in links.iter().enumerate() {
            tx.send(Request::Join(
                Candidate {
                    node_id: format!("node{i:04}"),
                    advertise_addr: "127.0.0.1".into(),
                    slots: 2,
                    requested_node_rank: None,
                    master_port: 1,
                    resume_hint: None,
                },
                0,
            ))
            .unwrap();
        }
        let mut plans = Vec::new();
        for (_, rx) in links.iter_mut() {
            let plan = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    match rx.recv().await.unwrap() {
                        Event::Formed(p) => return p,
                        Event::Error(e) => panic!("{e}"),
                        _ => {}
                    }
                }
            })
            .await
            .expect("formed in time");
            plans.push(plan);
        }
        assert!(plans.windows(2).all(|w| w[0] == w[1]), "one identical plan");
        assert_eq!(plans[0].world_size, 2 * n as u32);
    }
}
