//! `Round`: drives one run's rendezvous through a [`Store`].
//!
//! Any participant may form the next generation: it reads the waiting set, asks
//! [`crate::decide`], and if the answer is "form" writes `gen/current = g + 1` and the plan in one
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

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::core::{FailCause, RoundView, RunningGeneration, PROGRESS_EVERY};
use crate::human::without_countdown;
use crate::keys::RunKeys;
use crate::ledger::{Ledger, Manifest};
use crate::run_state::{self, RunState};
use crate::store::{Compare, LeaseId, Op, Store, Txn, WatchEvent};
use crate::{assign, decide, Candidate, Decision, Plan, RendezvousError, RoundConfig, StoreError};

/// Job-wide restart counters (key `restarts`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restarts {
    /// Group restarts caused by worker failures (counted against `--max-restarts`).
    pub failures: u32,
    /// Group restarts caused by membership changes (free, reported separately).
    pub membership: u32,
    /// Every worker failure of the run, oldest first ("generation 2: rank 3 ... on node b").
    #[serde(default)]
    pub history: Vec<String>,
}

/// The verdict of a failed round (key `gen/current.failed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundFailure {
    /// The decider's error, one line: what every named node reports.
    pub message: String,
    /// The nodes that were waiting in the round.
    pub nodes: Vec<String>,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// Why the group is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartCause {
    /// A worker exited non-zero or by a signal.
    Failure,
    /// A node joined or left.
    Membership,
}

/// A run's rendezvous on a store. Cheap to clone.
#[derive(Clone)]
pub struct Round {
    store: Arc<dyn Store>,
    keys: RunKeys,
    state: RunState,
    run_id: String,
    cfg: RoundConfig,
}

impl Round {
    /// The rendezvous of run `run_id` with completion rules `cfg`.
    pub fn new(store: Arc<dyn Store>, run_id: &str, cfg: RoundConfig) -> Self {
        Self {
            state: RunState::new(store.clone(), run_id),
            store,
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
    pub async fn join(&self, cand: &Candidate, lease: LeaseId) -> Result<(), StoreError> {
        let value = serde_json::to_vec(cand).expect("Candidate serializes");
        self.store
            .put(&self.keys.waiting(&cand.node_id), value, Some(lease))
            .await?;
        Ok(())
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
        let prefix = self.keys.members_prefix(g);
        Ok(self
            .store
            .get_prefix(&prefix)
            .await?
            .iter()
            .map(|kv| kv.key[prefix.len()..].to_string())
            .collect())
    }

    /// Adds one restart of `cause` to the job-wide counters (compare-and-swap loop).
    pub async fn record_restart(&self, cause: RestartCause) -> Result<Restarts, StoreError> {
        loop {
            let (mut r, rev) = self.read_restarts().await?;
            match cause {
                RestartCause::Failure => r.failures += 1,
                RestartCause::Membership => r.membership += 1,
            }
            let key = self.keys.restarts();
            let resp = self
                .store
                .txn(Txn {
                    compares: vec![Compare::ModRevisionEquals(key.clone(), rev)],
                    success: vec![Op::put(key, run_state::encode(&r))],
                    failure: vec![],
                })
                .await?;
            if resp.succeeded {
                return Ok(r);
            }
        }
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
        let mut opened_at = Instant::now();
        let mut min_reached_at: Option<Instant> = None;
        let mut round_events = self.store.watch_prefix(&self.keys.gen_current(), 0).await?;
        // This node's join: a published verdict counts for it only when written after it.
        let join_rev = self
            .store
            .get(&self.keys.waiting(node_id))
            .await?
            .map_or(0, |kv| kv.mod_revision);
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
        let mut last_reason = String::new();
        let mut last_published = None::<Instant>;
        let mut published = String::new();
        // Whether the generation/decider state must be re-read (start, or an event said so).
        let mut check = true;
        loop {
            let now = Instant::now();
            let mut leader = waiting_events.is_some();
            if check {
                if self.store.get(&self.keys.finished()).await?.is_some() {
                    return Err(RendezvousError::RunFinished(self.run_id.clone()));
                }
                if let Some(message) = self.failure_for(node_id, join_rev).await? {
                    return Err(RendezvousError::RoundFailed(message));
                }
                let (g, _) = self.current_generation().await?;
                if g > after {
                    if let Some(plan) = self.plan(g).await? {
                        if plan.member(node_id).is_some() {
                            return Ok(plan);
                        }
                    }
                }
                leader = self.lead(node_id, lease).await?;
                if !leader {
                    waiting_events = None;
                    if let Some(kv) = self.store.get(&self.keys.progress()).await? {
                        let reason = kv.value_str();
                        if !reason.is_empty()
                            && without_countdown(&reason) != without_countdown(&last_reason)
                        {
                            progress(&reason);
                            last_reason = reason;
                        }
                    }
                }
                check = false;
            }
            let wake_at = if leader {
                if waiting_events.is_none() {
                    waiting_events = Some(
                        self.store
                            .watch_prefix(&self.keys.waiting_prefix(), 0)
                            .await?,
                    );
                }
                let (g, rev) = self.current_generation().await?;
                match self
                    .decide_once(g, rev, &mut opened_at, &mut min_reached_at)
                    .await?
                {
                    Step::Formed(plan) if plan.member(node_id).is_some() => return Ok(*plan),
                    Step::Formed(_) | Step::Retry => {
                        waiting_events = None;
                        check = true;
                        continue;
                    }
                    Step::Failed {
                        reason,
                        cause,
                        nodes,
                    } => {
                        let err = match cause {
                            FailCause::JoinTimeout => RendezvousError::Timeout {
                                run: self.run_id.clone(),
                                waited: now - opened_at,
                                joined: nodes.len(),
                                min: self.cfg.min_nodes,
                                detail: reason,
                            },
                            FailCause::Unformable => RendezvousError::Unformable {
                                run: self.run_id.clone(),
                                reason,
                            },
                        };
                        return Err(self.publish_failure(err, nodes, node_id, join_rev).await);
                    }
                    Step::Wait(reason, wake_at) => {
                        // One line per change of state, not one per second of countdown.
                        if !reason.is_empty()
                            && without_countdown(&reason) != without_countdown(&last_reason)
                        {
                            progress(&reason);
                            last_reason = reason.clone();
                        }
                        // Published at most once a second: every waiting node watches it.
                        if !reason.is_empty()
                            && without_countdown(&reason) != without_countdown(&published)
                            && last_published.is_none_or(|t| now - t >= PROGRESS_EVERY)
                        {
                            let _ = self
                                .store
                                .put(&self.keys.progress(), reason.clone().into_bytes(), None)
                                .await;
                            last_published = Some(now);
                            published = reason;
                        }
                        wake_at.min(now + PROGRESS_EVERY)
                    }
                }
            } else {
                // The decider's verdict normally comes first (it opened the round no later);
                // this is for a decider that never gives one.
                let deadline = opened_at + self.cfg.join_timeout + FOLLOWER_GRACE;
                if now >= deadline {
                    return Err(RendezvousError::Timeout {
                        run: self.run_id.clone(),
                        waited: now - opened_at,
                        joined: 0,
                        min: self.cfg.min_nodes,
                        detail: format!(
                            "no group formed within join_timeout; last progress: {last_reason}"
                        ),
                    });
                }
                // A safety net only: changes arrive as watch events.
                deadline.min(now + RECHECK_EVERY)
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
                        round_events = self.store.watch_prefix(&self.keys.gen_current(), 0).await?;
                        check = true;
                    }
                    Some(ev) => check |= self.on_round_event(ev, &mut last_reason, &mut progress),
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
                check |= self.on_round_event(ev, &mut last_reason, &mut progress);
            }
            if let Some(rx) = waiting_events.as_mut() {
                while rx.try_recv().is_ok() {}
            }
        }
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

    /// The published verdict on this node's round, if any: a [`RoundFailure`] naming `node_id`,
    /// written after its join (`join_rev`).
    async fn failure_for(
        &self,
        node_id: &str,
        join_rev: i64,
    ) -> Result<Option<String>, StoreError> {
        let key = self.keys.round_failed();
        let Some(kv) = self.store.get(&key).await? else {
            return Ok(None);
        };
        if kv.mod_revision <= join_rev {
            return Ok(None); // an earlier round's
        }
        let f: RoundFailure =
            serde_json::from_slice(&kv.value).map_err(|e| StoreError::Corrupt {
                key,
                reason: e.to_string(),
            })?;
        Ok(f.nodes.iter().any(|n| n == node_id).then_some(f.message))
    }

    /// Publishes the decider's verdict `err` to every node of the round (`nodes`) and returns
    /// what this node reports: `err`, or the verdict another participant published on the same
    /// round first. Best effort: a store error leaves the others to their own deadline.
    async fn publish_failure(
        &self,
        err: RendezvousError,
        nodes: Vec<String>,
        node_id: &str,
        join_rev: i64,
    ) -> RendezvousError {
        let record = RoundFailure {
            message: err.to_string(),
            nodes,
            at_ms: crate::clock::now_ms(),
        };
        for _ in 0..5 {
            match self.try_publish(&record, node_id, join_rev).await {
                Ok(Published::Raced) => continue,
                Ok(Published::Mine) => {
                    tracing::debug!(run = %self.run_id, "round failed: {}", record.message);
                    return err;
                }
                Ok(Published::Earlier(message)) => return RendezvousError::RoundFailed(message),
                Err(e) => {
                    tracing::warn!(run = %self.run_id, error = %e, "could not publish the round's failure; the other nodes end at their own deadline");
                    return err;
                }
            }
        }
        err
    }

    /// One attempt of [`Self::publish_failure`].
    async fn try_publish(
        &self,
        record: &RoundFailure,
        node_id: &str,
        join_rev: i64,
    ) -> Result<Published, StoreError> {
        let key = self.keys.round_failed();
        if let Some(message) = self.failure_for(node_id, join_rev).await? {
            return Ok(Published::Earlier(message));
        }
        // Missing, or an earlier round's record (replaced).
        let compare = match self.store.get(&key).await? {
            None => Compare::Missing(key.clone()),
            Some(kv) => Compare::ModRevisionEquals(key.clone(), kv.mod_revision),
        };
        let resp = self
            .store
            .txn(Txn {
                compares: vec![compare],
                success: vec![Op::put(
                    key,
                    serde_json::to_vec(record).expect("RoundFailure serializes"),
                )],
                failure: vec![],
            })
            .await?;
        if !resp.succeeded {
            return Ok(Published::Raced);
        }
        // A new round need not wait for this decider's lease to expire.
        self.store
            .txn(Txn {
                compares: vec![Compare::ValueEquals(
                    self.keys.leader(),
                    node_id.as_bytes().to_vec(),
                )],
                success: vec![
                    Op::Delete(self.keys.leader()),
                    Op::Delete(self.keys.progress()),
                ],
                failure: vec![],
            })
            .await?;
        Ok(Published::Mine)
    }

    /// Takes or confirms the decider role of the current round.
    async fn lead(&self, node_id: &str, lease: LeaseId) -> Result<bool, StoreError> {
        let key = self.keys.leader();
        let resp = self
            .store
            .txn(Txn {
                compares: vec![Compare::Missing(key.clone())],
                success: vec![Op::Put {
                    key: key.clone(),
                    value: node_id.as_bytes().to_vec(),
                    lease: Some(lease),
                }],
                failure: vec![],
            })
            .await;
        match resp {
            Ok(r) if r.succeeded => Ok(true),
            Ok(_) => Ok(self
                .store
                .get(&key)
                .await?
                .is_some_and(|kv| kv.value == node_id.as_bytes())),
            Err(StoreError::LeaseLost(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether generation `plan` still runs: not closed, and a member
    /// alive (a membership key under its lease, or `starting`: a member's join not yet replaced
    /// by its membership key). A generation whose members all died (leases expired) has ended.
    async fn running(&self, plan: &Plan, starting: bool) -> Result<bool, StoreError> {
        let g = plan.generation;
        if self.store.get(&self.keys.closed(g)).await?.is_some() {
            return Ok(false);
        }
        Ok(starting
            || !self
                .store
                .get_prefix(&self.keys.members_prefix(g))
                .await?
                .is_empty())
    }

    /// The decider's step: read the waiting set, decide, and form the next generation if due.
    async fn decide_once(
        &self,
        g: u64,
        rev: i64,
        opened_at: &mut Instant,
        min_reached_at: &mut Option<Instant>,
    ) -> Result<Step, RendezvousError> {
        let mut waiting = self.store.get_prefix(&self.keys.waiting_prefix()).await?;
        waiting.sort_by_key(|kv| kv.create_revision);
        // A waiting key written before generation `g` formed, by a node admitted to `g`, is the
        // join that got it in; the node deletes it once it starts. Not a new candidate.
        let current = if g > 0 { self.plan(g).await? } else { None };
        let mut candidates = Vec::with_capacity(waiting.len());
        let mut starting = false;
        for kv in waiting {
            let c: Candidate =
                serde_json::from_slice(&kv.value).map_err(|e| StoreError::Corrupt {
                    key: kv.key.clone(),
                    reason: e.to_string(),
                })?;
            let consumed = kv.mod_revision <= rev
                && current
                    .as_ref()
                    .is_some_and(|p| p.member(&c.node_id).is_some());
            if consumed {
                starting = true;
            } else {
                candidates.push(c);
            }
        }
        let now = Instant::now();
        if self.store.get(&self.keys.finished()).await?.is_some() {
            return Err(RendezvousError::RunFinished(self.run_id.clone()));
        }
        let running = match &current {
            Some(plan) if self.running(plan, starting).await? => Some(RunningGeneration {
                generation: g,
                members: plan.members.len(),
            }),
            _ => None,
        };
        if running.is_some() {
            // Nobody forms beside it (see `core::decide`); the round starts over when it closes.
            *opened_at = now;
            *min_reached_at = None;
        } else if candidates.len() >= self.cfg.min_nodes {
            min_reached_at.get_or_insert(now);
        } else {
            *min_reached_at = None;
        }
        // A re-form: which live members of generation `g` are still to rejoin.
        let outstanding = match &current {
            Some(plan) if running.is_none() => {
                let live = self.live_members(g).await?;
                Some(
                    plan.members
                        .iter()
                        .map(|m| &m.node_id)
                        .filter(|id| {
                            live.contains(id) && !candidates.iter().any(|c| &c.node_id == *id)
                        })
                        .cloned()
                        .collect(),
                )
            }
            _ => None,
        };
        let view = RoundView {
            opened_at: *opened_at,
            min_reached_at: *min_reached_at,
            candidates,
            outstanding,
            running,
        };
        match decide(&view, now, &self.cfg) {
            Decision::Wait { reason, wake_at } => Ok(Step::Wait(reason, wake_at)),
            Decision::Fail { reason, cause } => Ok(Step::Failed {
                reason,
                cause,
                nodes: view.candidates.iter().map(|c| c.node_id.clone()).collect(),
            }),
            Decision::Form {
                admitted, reason, ..
            } => {
                let (restarts, _) = self.read_restarts().await?;
                let mut plan = assign(
                    &self.run_id,
                    g + 1,
                    &admitted,
                    restarts.failures,
                    restarts.membership,
                )?;
                // Every rank of the generation resumes from the same checkpoint: the newest
                // sealed one not marked bad (or one a node found in its checkpoint directory).
                // Another run's checkpoint (`--ckpt-resume-from`) only starts a run: adopted
                // later, it would throw away the progress of the generations so far.
                let hints: Vec<&Manifest> = admitted
                    .iter()
                    .filter_map(|c| c.resume_hint.as_deref())
                    .filter(|m| g == 0 || m.adopted_from.is_none())
                    .collect();
                let ledger = Ledger::new(self.store.clone(), &self.run_id);
                let resume = ledger.resume_point(&hints).await?;
                plan.resume = resume.manifest.clone();
                plan.formed_because = reason.clone();
                // Constant size whatever the node count (etcd allows 128 ops per txn): admitted
                // nodes find themselves in the plan and write their own membership keys.
                let mut ops = vec![
                    Op::put(self.keys.gen_current(), run_state::encode_generation(g + 1)),
                    Op::put(self.keys.plan(g + 1), run_state::encode(&plan)),
                    Op::Delete(self.keys.leader()),
                    Op::Delete(self.keys.progress()),
                    Op::Delete(self.keys.round_failed()),
                ];
                if let (true, Some(m)) = (resume.import, &resume.manifest) {
                    ops.extend(ledger.import_ops(m));
                }
                let txn = Txn {
                    compares: vec![
                        Compare::ModRevisionEquals(self.keys.gen_current(), rev),
                        // A seal that landed since the read: decide again with it.
                        Compare::ModRevisionEquals(self.keys.ckpt_latest(), resume.latest_revision),
                    ],
                    success: ops,
                    failure: vec![],
                };
                match self.store.txn(txn).await {
                    Err(e) => Err(e.into()),
                    Ok(r) if r.succeeded => {
                        tracing::debug!(run = %self.run_id, gen = g + 1, "group formed: {reason}");
                        Ok(Step::Formed(Box::new(plan)))
                    }
                    Ok(_) => Ok(Step::Retry),
                }
            }
        }
    }
}

/// How often a waiting node re-reads the round without an event (a safety net).
const RECHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a follower waits past `join_timeout` for the decider's verdict before it gives up
/// on its own.
const FOLLOWER_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// One step of the decider.
enum Step {
    Formed(Box<Plan>),
    Retry,
    Wait(String, Instant),
    Failed {
        reason: String,
        cause: FailCause,
        /// Every node waiting in the round.
        nodes: Vec<String>,
    },
}

/// What [`Round::try_publish`] achieved.
enum Published {
    /// This node's verdict is the round's.
    Mine,
    /// Another participant's verdict on this round came first: its message.
    Earlier(String),
    /// The record changed under the attempt: try again.
    Raced,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::MemoryStore;

    fn cand(id: &str, port: u16) -> Candidate {
        Candidate {
            node_id: id.into(),
            advertise_addr: "127.0.0.1".into(),
            slots: 2,
            requested_node_rank: None,
            master_port: port,
            resume_hint: None,
        }
    }

    #[tokio::test]
    async fn single_node_generations_increase_and_carry_restarts() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let round = Round::new(store.clone(), "job", RoundConfig::single_node());
        let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
        round.join(&cand("n0", 4000), lease).await.unwrap();
        let p1 = round.wait_for_plan("n0", 0, lease, |_| {}).await.unwrap();
        assert_eq!((p1.generation, p1.world_size, p1.master_port), (1, 2, 4000));
        assert!(
            store
                .get("/drun/v1/job/gen/current.leader")
                .await
                .unwrap()
                .is_none(),
            "formation clears the decider key for the next round"
        );

        let r = round.record_restart(RestartCause::Failure).await.unwrap();
        assert_eq!(
            r,
            Restarts {
                failures: 1,
                membership: 0,
                history: vec![]
            }
        );
        round.join(&cand("n0", 4001), lease).await.unwrap();
        let p2 = round.wait_for_plan("n0", 1, lease, |_| {}).await.unwrap();
        assert_eq!(
            (p2.generation, p2.master_port, p2.restarts_failures),
            (2, 4001, 1)
        );
        assert_eq!(round.current_generation().await.unwrap().0, 2);
    }

    #[tokio::test]
    async fn two_participants_agree_on_one_plan() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let cfg = RoundConfig {
            min_nodes: 2,
            max_nodes: 2,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(30),
            settle: Duration::ZERO,
        };
        let a = Round::new(store.clone(), "job", cfg);
        let b = Round::new(store.clone(), "job", cfg);
        let lease = store.lease_grant(Duration::from_secs(10)).await.unwrap();
        a.join(&cand("a", 1), lease).await.unwrap();
        let wait_a = tokio::spawn(async move { a.wait_for_plan("a", 0, lease, |_| {}).await });
        let lease2 = store.lease_grant(Duration::from_secs(10)).await.unwrap();
        b.join(&cand("b", 2), lease2).await.unwrap();
        let pb = b.wait_for_plan("b", 0, lease2, |_| {}).await.unwrap();
        let pa = wait_a.await.unwrap().unwrap();
        assert_eq!(pa, pb);
        assert_eq!(pa.generation, 1);
        assert_eq!(pa.members[0].node_id, "a");
    }

    #[tokio::test(start_paused = true)]
    async fn join_timeout_reports_who_came() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let cfg = RoundConfig {
            min_nodes: 2,
            max_nodes: 2,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(5),
            settle: Duration::ZERO,
        };
        let round = Round::new(store.clone(), "job", cfg);
        let lease = store.lease_grant(Duration::from_secs(100)).await.unwrap();
        round.join(&cand("lonely", 1), lease).await.unwrap();
        let mut seen = vec![];
        let err = round
            .wait_for_plan("lonely", 0, lease, |r| seen.push(r.to_string()))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                RendezvousError::Timeout {
                    joined: 1,
                    min: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("lonely"), "{err}");
        assert!(
            seen[0].contains("waiting for 1 more node (1/2)"),
            "{seen:?}"
        );
    }

    /// Two participants in a round that fails: the decider's verdict is published and the
    /// follower ends with the same line, long before its own deadline.
    async fn both_fail_alike(cfg: RoundConfig, b_slots: u32) -> (RendezvousError, RendezvousError) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let a = Round::new(store.clone(), "job", cfg);
        let b = Round::new(store.clone(), "job", cfg);
        let la = store.lease_grant(Duration::from_secs(100)).await.unwrap();
        let lb = store.lease_grant(Duration::from_secs(100)).await.unwrap();
        a.join(&cand("a", 1), la).await.unwrap();
        let wait_a = tokio::spawn(async move { a.wait_for_plan("a", 0, la, |_| {}).await });
        // b joins once a is the decider.
        while store
            .get("/drun/v1/job/gen/current.leader")
            .await
            .unwrap()
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        b.join(
            &Candidate {
                slots: b_slots,
                ..cand("b", 2)
            },
            lb,
        )
        .await
        .unwrap();
        let t0 = Instant::now();
        let eb = b.wait_for_plan("b", 0, lb, |_| {}).await.unwrap_err();
        assert!(
            t0.elapsed() < cfg.join_timeout + FOLLOWER_GRACE,
            "the follower heard the verdict before its own deadline"
        );
        let ea = wait_a.await.unwrap().unwrap_err();
        assert_eq!(ea.to_string(), eb.to_string(), "one line on every node");
        assert!(
            matches!(eb, RendezvousError::RoundFailed(_)),
            "the follower reports the decider's verdict: {eb:?}"
        );
        // The verdict was for that round only: a node joining afterwards forms a new one, and
        // the formation clears the record.
        let one = RoundConfig {
            min_nodes: 1,
            max_nodes: 1,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(5),
            settle: Duration::ZERO,
        };
        let c = Round::new(store.clone(), "job", one);
        let lc = store.lease_grant(Duration::from_secs(100)).await.unwrap();
        store.lease_revoke(la).await.unwrap();
        store.lease_revoke(lb).await.unwrap();
        c.join(&cand("a", 3), lc).await.unwrap();
        let plan = c.wait_for_plan("a", 0, lc, |_| {}).await.unwrap();
        assert_eq!(plan.generation, 1);
        assert!(store
            .get("/drun/v1/job/gen/current.failed")
            .await
            .unwrap()
            .is_none());
        (ea, eb)
    }

    #[tokio::test(start_paused = true)]
    async fn a_join_timeout_ends_every_waiting_node_with_the_same_line() {
        let cfg = RoundConfig {
            min_nodes: 3,
            max_nodes: 3,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(5),
            settle: Duration::ZERO,
        };
        let (ea, _) = both_fail_alike(cfg, 2).await;
        assert!(
            matches!(
                ea,
                RendezvousError::Timeout {
                    joined: 2,
                    min: 3,
                    ..
                }
            ),
            "{ea:?}"
        );
        assert!(ea.to_string().contains("only 2 of min 3"), "{ea}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unformable_set_ends_every_waiting_node_with_the_same_line() {
        let cfg = RoundConfig {
            min_nodes: 2,
            max_nodes: 2,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(600),
            settle: Duration::ZERO,
        };
        let (ea, _) = both_fail_alike(cfg, 0).await;
        assert!(matches!(ea, RendezvousError::Unformable { .. }), "{ea:?}");
        assert!(
            ea.to_string().contains("node b offers no worker slots"),
            "{ea}"
        );
    }
}
