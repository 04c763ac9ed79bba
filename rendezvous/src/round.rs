//! `Round`: drives one run's rendezvous through a [`Store`].
//!
//! Any participant may form the next generation: it reads the round
//! ([`snapshot::RoundSnapshot`]), judges it ([`judge::judge`], pure, which asks
//! [`crate::decide`]), and if the answer is "form" writes `gen/current = g + 1` and the plan in one
//! transaction guarded by the `mod_revision` of `gen/current` it read. Losers of that race see
//! the winner's plan on their next pass. So the same code serves the embedded single-node group,
//! a server replica, or every agent acting as a replica against etcd.
//!
//! A round that fails (too few nodes before `join_timeout`, or a set that cannot form) fails for
//! every node in it, with one line: the decider publishes its error at `gen/current.failed`
//! ([`RoundFailure`], naming the waiting nodes) in a transaction, and every named node that
//! joined before it — all of them watch `gen/current*` anyway — ends with that message. A node
//! that joins later starts a new round; the record is overwritten by the next failure and deleted
//! by the next formation. A follower ends on its own (with its own line) only when no verdict
//! comes within `join_timeout` plus a grace: the decider was stuck.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::decisions::core::{progress_due, progress_every, FailCause, PROGRESS_EVERY};
use crate::ledger::Ledger;
use crate::store::keys::RunKeys;
use crate::store::run_state::RunState;
use crate::store::{LeaseId, Store, WatchEvent};
use crate::{Join, Plan, RendezvousError, RoundConfig, StoreError};
use judge::RoundTimes;

pub use crate::store::records::{RestartCause, Restarts, RoundFailure};

/// A run's rendezvous on a store. Cheap to clone.
#[derive(Clone)]
pub struct Round {
    keys: RunKeys,
    ledger: Ledger,
    state: RunState,
    run_id: String,
    cfg: RoundConfig,
}

impl Round {
    /// The rendezvous of run `run_id` with completion rules `cfg`.
    pub fn new(store: Arc<dyn Store>, run_id: &str, cfg: RoundConfig) -> Self {
        Self {
            state: RunState::new(store.clone(), run_id),
            ledger: Ledger::new(store, run_id),
            keys: RunKeys::new(run_id),
            run_id: run_id.to_string(),
            cfg,
        }
    }

    /// Current generation (0 before the first formation) and the `mod_revision` of its key.
    pub async fn current_generation(&self) -> Result<(u64, i64), StoreError> {
        self.state.current_generation().await
    }

    /// The plan of generation `g`, if written.
    pub async fn plan(&self, g: u64) -> Result<Option<Plan>, StoreError> {
        self.state.plan(g).await
    }

    /// The run's typed keys.
    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// The key layout of this run.
    pub fn keys(&self) -> &RunKeys {
        &self.keys
    }

    /// Asks to be admitted to the next generation; the key lives as long as `lease`.
    pub async fn join(&self, join: &Join, lease: LeaseId) -> Result<(), StoreError> {
        self.state.join(join, lease, None).await
    }

    /// [`Self::join`] of a node that comes back after generation `last` (0: none): its
    /// `lost/<node>` record and its membership key of `last` go in the same transaction, so a
    /// decider never sees a survivor of a re-form in neither the old generation's members nor
    /// the waiting set and never forms without it (see `decider.rs`, which reads the members
    /// before the waiting set).
    pub async fn rejoin(&self, join: &Join, lease: LeaseId, last: u64) -> Result<(), StoreError> {
        self.state.join(join, lease, Some(last)).await
    }

    /// Restart counters as stored now.
    pub async fn restarts(&self) -> Result<Restarts, StoreError> {
        Ok(self.read_restarts().await?.0)
    }

    async fn read_restarts(&self) -> Result<(Restarts, i64), StoreError> {
        self.state.restarts().await
    }

    /// Node ids whose membership key of generation `g` still exists (their lease holds and
    /// they have not joined again yet).
    pub async fn live_members(&self, g: u64) -> Result<Vec<String>, StoreError> {
        self.state.live_members(g).await
    }

    /// The candidates waiting for the next generation, oldest first.
    pub async fn waiting(&self) -> Result<Vec<Join>, StoreError> {
        Ok(self
            .state
            .waiting()
            .await?
            .into_iter()
            .map(|(j, _)| j)
            .collect())
    }

    /// Adds one restart of `cause` to the job-wide counters (compare-and-swap loop).
    pub async fn record_restart(&self, cause: RestartCause) -> Result<Restarts, StoreError> {
        self.state.record_restart(cause).await
    }

    /// Waits until a generation newer than `after` that includes `node_id` is formed, forming it
    /// when this participant is the round's decider and the decision core says so. `lease` is
    /// the participant's lease (the decider key lives under it); `progress` receives each new
    /// waiting reason.
    ///
    /// One decider per round keeps the cost linear in the number of nodes: the decider (whoever
    /// creates `gen/current.leader` first) watches the waiting set and forms the group; the others
    /// only watch `gen/current*` (the generation, the decider key and its progress line). When the
    /// decider dies its key expires with its lease and another participant takes over.
    ///
    /// # Errors
    /// [`RendezvousError::Timeout`] when `join_timeout` passes below `min_nodes`;
    /// [`RendezvousError::Unformable`] when the nodes due to form cannot; either published to
    /// every node of the round, which report it as [`RendezvousError::RoundFailed`] with the same
    /// message; store errors.
    pub async fn wait_for_plan(
        &self,
        node_id: &str,
        after: u64,
        lease: LeaseId,
        mut progress: impl FnMut(&str),
    ) -> Result<Plan, RendezvousError> {
        let mut w = WaitState::new(Instant::now());
        let mut round_events = self.state.watch(&self.keys.gen_current()).await?;
        // This node's join: a published verdict counts for it only when written after it.
        let joined = self.state.join_revisions(node_id).await?;
        let join_rev = joined.map_or(0, |(m, _)| m);
        // When this node's join first appeared: a join sent again on the same lease (a
        // reconnect while waiting) keeps the key and so its creation.
        let joined_at = joined.map_or(0, |(_, c)| c);
        let (now_gen, _) = self.current_generation().await?;
        let after = if now_gen < after {
            // The store lost its history (etcd restarted with a wiped data dir): generations
            // start again from there rather than waiting forever for one above `after`.
            tracing::warn!(run = %self.run_id, "the rendezvous store is at generation {now_gen}, this node was at {after}: its history was lost; forming anew");
            now_gen
        } else {
            after
        };
        let mut waiting_events: Option<mpsc::UnboundedReceiver<WatchEvent>> = None;
        // Whether the generation/decider state must be re-read (start, or an event said so).
        let mut check = true;
        loop {
            let now = Instant::now();
            let mut leader = waiting_events.is_some();
            if check {
                match self
                    .recheck(
                        node_id,
                        after,
                        lease,
                        (join_rev, joined_at),
                        &mut w,
                        &mut progress,
                    )
                    .await?
                {
                    Recheck::Member(plan) => return Ok(*plan),
                    Recheck::Leader(l) => leader = l,
                }
                if !leader {
                    waiting_events = None;
                }
                check = false;
            }
            let wake_at = if leader {
                if waiting_events.is_none() {
                    waiting_events = Some(self.state.watch(&self.keys.waiting_prefix()).await?);
                }
                match self
                    .lead_step(node_id, join_rev, now, &mut w, &mut progress)
                    .await?
                {
                    LeadStep::Member(plan) => return Ok(*plan),
                    LeadStep::Again => {
                        waiting_events = None;
                        check = true;
                        continue;
                    }
                    LeadStep::WakeAt(at) => at,
                }
            } else {
                self.follower_wake(now, &w)?
            };
            let waiting_changed = async {
                match waiting_events.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = round_events.recv() => match ev {
                    None => {
                        // The watch broke (store restart, network): subscribe again and re-read.
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        round_events = self.state.watch(&self.keys.gen_current()).await?;
                        check = true;
                    }
                    Some(ev) => check |= self.on_round_event(ev, &mut w.last_reason, &mut progress),
                },
                ev = waiting_changed => {
                    if ev.is_none() {
                        waiting_events = None;
                        check = true;
                    }
                }
                _ = tokio::time::sleep_until(wake_at) => check |= !leader,
            }
            // Coalesce bursts (many nodes arriving at once): one re-read for all of them.
            while let Ok(ev) = round_events.try_recv() {
                check |= self.on_round_event(ev, &mut w.last_reason, &mut progress);
            }
            if let Some(rx) = waiting_events.as_mut() {
                while rx.try_recv().is_ok() {}
            }
        }
    }

    /// Re-reads the run: its end, a verdict on this node's round, a plan that includes this
    /// node; else takes or confirms the decider role (a follower reports the decider's progress).
    async fn recheck(
        &self,
        node_id: &str,
        after: u64,
        lease: LeaseId,
        (join_rev, joined_at): (i64, i64),
        w: &mut WaitState,
        progress: &mut impl FnMut(&str),
    ) -> Result<Recheck, RendezvousError> {
        if self.state.has_finished().await? {
            return Err(RendezvousError::RunFinished(self.run_id.clone()));
        }
        if let Some(message) = self.failure_for(node_id, join_rev).await? {
            return Err(RendezvousError::RoundFailed(message));
        }
        let (g, g_rev) = self.current_generation().await?;
        // A plan formed before this node's join first appeared was formed for an earlier life
        // of this node (fenced: its lease, and the keys under it, are gone): its world ended
        // without it, even when no one was left to close it (a lone node fenced past its
        // lease). Only a generation formed from this join counts (`gen/current` is written
        // with the plan); a join re-sent on the same lease after a reconnect keeps its key,
        // so the plan formed while the server was away still counts (chaos seed 1159).
        // While the store keeps its history, a generation formed after this node last wrote its
        // join is above `after` (generations only grow, and this node was in `after`). One
        // that is not was formed on a store that lost its history (a wiped etcd) by another
        // node that found that out first, from this very join: it is this node's, though its
        // number is not new to it. (Before, this node waited for a generation above it while
        // the others waited for it to start, until the join timeout.)
        let formed_anew = join_rev > 0 && g <= after && g_rev > join_rev;
        if (g > after && g_rev > joined_at) || formed_anew {
            if let Some(plan) = self.plan(g).await? {
                if plan.member(node_id).is_some() {
                    return Ok(Recheck::Member(Box::new(plan)));
                }
            }
        }
        let leader = self.lead(node_id, lease).await?;
        if !leader {
            // The decider publishes a line when it is due (`progress_due`): a follower says
            // each line it publishes once.
            if let Some(reason) = self.state.progress().await? {
                if !reason.is_empty() && reason != w.last_reason {
                    progress(&reason);
                    w.last_reason = reason;
                }
            }
        }
        Ok(Recheck::Leader(leader))
    }

    /// The decider's turn: decide once; form, fail the round for everyone, or report progress.
    async fn lead_step(
        &self,
        node_id: &str,
        join_rev: i64,
        now: Instant,
        w: &mut WaitState,
        progress: &mut impl FnMut(&str),
    ) -> Result<LeadStep, RendezvousError> {
        let (g, rev) = self.current_generation().await?;
        match self.decide_once(g, rev, &mut w.times).await? {
            Step::Formed(plan) if plan.member(node_id).is_some() => Ok(LeadStep::Member(plan)),
            Step::Formed(_) | Step::Retry => Ok(LeadStep::Again),
            Step::Failed {
                reason,
                cause,
                nodes,
            } => {
                let err = match cause {
                    FailCause::JoinTimeout => RendezvousError::Timeout {
                        run: self.run_id.clone(),
                        waited: now - w.times.opened_at,
                        joined: nodes.len(),
                        min: self.cfg.min_nodes,
                        detail: reason,
                    },
                    FailCause::Unformable => RendezvousError::Unformable {
                        run: self.run_id.clone(),
                        reason,
                    },
                };
                Err(self.publish_failure(err, nodes, node_id, join_rev).await)
            }
            Step::TurnAway { reason, nodes } => {
                let err = RendezvousError::Unformable {
                    run: self.run_id.clone(),
                    reason,
                };
                if nodes.iter().any(|n| n == node_id) {
                    return Err(self.publish_failure(err, nodes, node_id, join_rev).await);
                }
                if !self.turned_away_already(&nodes).await? {
                    self.publish_turn_away(&err, nodes).await?;
                }
                // Decide again once they left (their waiting keys go with their leases).
                Ok(LeadStep::WakeAt(now + PROGRESS_EVERY))
            }
            Step::Wait {
                reason,
                until: wake_at,
                waiting,
            } => {
                // One line per change of state, not one per second of countdown (and the
                // same line again after a quiet while).
                if progress_due(&reason, &w.last_reason, w.last_reason_at, now) {
                    progress(&reason);
                    w.last_reason = reason.clone();
                    w.last_reason_at = Some(now);
                }
                // Published at most once a second, less often when many wait: every waiting
                // node watches it.
                if progress_due(&reason, &w.published, w.last_published, now)
                    && w.last_published
                        .is_none_or(|t| now - t >= progress_every(waiting))
                {
                    let _ = self.state.publish_progress(&reason).await;
                    w.last_published = Some(now);
                    w.published = reason;
                }
                Ok(LeadStep::WakeAt(wake_at.min(now + PROGRESS_EVERY)))
            }
        }
    }

    /// A follower's next re-read, or its own timeout: the decider's verdict normally comes first
    /// (it opened the round no later); this is for a decider that never gives one.
    fn follower_wake(&self, now: Instant, w: &WaitState) -> Result<Instant, RendezvousError> {
        let deadline = w.times.opened_at + self.cfg.join_timeout + FOLLOWER_GRACE;
        if now >= deadline {
            return Err(RendezvousError::Timeout {
                run: self.run_id.clone(),
                waited: now - w.times.opened_at,
                joined: 0,
                min: self.cfg.min_nodes,
                detail: format!(
                    "no group formed within join_timeout; last progress: {}",
                    w.last_reason
                ),
            });
        }
        // A safety net only: changes arrive as watch events.
        Ok(deadline.min(now + RECHECK_EVERY))
    }

    /// Interprets a `gen/current*` event; true when the generation or the decider changed.
    fn on_round_event(
        &self,
        ev: WatchEvent,
        last_reason: &mut String,
        progress: &mut impl FnMut(&str),
    ) -> bool {
        match ev {
            WatchEvent::Put(kv) if kv.key == self.keys.progress() => {
                let reason = kv.value_str();
                if &reason != last_reason {
                    progress(&reason);
                    *last_reason = reason;
                }
                false
            }
            WatchEvent::Put(kv) if kv.key == self.keys.leader() => false,
            _ => true,
        }
    }

    /// Takes or confirms the decider role of the current round.
    async fn lead(&self, node_id: &str, lease: LeaseId) -> Result<bool, StoreError> {
        self.state.lead(node_id, lease).await
    }
}

/// How often a waiting node re-reads the round without an event (a safety net).
const RECHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a follower waits past `join_timeout` for the decider's verdict before it gives up
/// on its own.
const FOLLOWER_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A waiting node's view of its round between two reads.
struct WaitState {
    /// The decider's memory of the round: when it opened, reached MIN, whom it batched.
    times: RoundTimes,
    /// The last progress line reported to this node's agent.
    last_reason: String,
    /// When.
    last_reason_at: Option<Instant>,
    /// When the decider last published its progress line.
    last_published: Option<Instant>,
    /// The line it published.
    published: String,
}

impl WaitState {
    fn new(now: Instant) -> Self {
        Self {
            times: RoundTimes::new(now),
            last_reason: String::new(),
            last_reason_at: None,
            last_published: None,
            published: String::new(),
        }
    }
}

/// What a re-read found.
enum Recheck {
    /// A plan that includes this node.
    Member(Box<Plan>),
    /// Whether this node decides the round.
    Leader(bool),
}

/// What the decider's turn came to.
enum LeadStep {
    /// This node is a member of the generation just formed.
    Member(Box<Plan>),
    /// Something changed under the decision: re-read.
    Again,
    /// Decide again at this instant (or on an event).
    WakeAt(Instant),
}

/// One step of the decider.
pub(super) enum Step {
    Formed(Box<Plan>),
    Retry,
    Wait {
        reason: String,
        until: Instant,
        /// How many nodes wait (the progress line goes to each).
        waiting: usize,
    },
    Failed {
        reason: String,
        cause: FailCause,
        /// Every node waiting in the round.
        nodes: Vec<String>,
    },
    /// The environment check refuses these newcomers of a re-form (the others wait for them
    /// to leave, then form).
    TurnAway {
        reason: String,
        nodes: Vec<String>,
    },
}

mod decider;
pub mod judge;
pub mod snapshot;
mod verdict;

#[cfg(test)]
mod envcheck_tests;

#[cfg(test)]
mod tests;
