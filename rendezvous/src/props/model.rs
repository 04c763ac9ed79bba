//! A small simulated run that the decision-core property drives: nodes, their leases, the
//! waiting set, the running generation, and a real [`Ledger`] on a [`MemoryStore`].
//!
//! Each step hands the decider's own judgement ([`judge`], `round/judge.rs`) a snapshot of the
//! simulated round, as `round/snapshot.rs` reads it from a store: the newest plan, its live
//! members, the waiting set in arrival order, whether the generation was closed. The judgement
//! keeps the decider's times (`opened_at` follows the running generation, `min_reached_at` is
//! set when the waiting set first reaches MIN, newcomers seen while it ran are batched).
//! Formations go through the real [`formation`] (with [`crate::assign`] and the ledger's
//! manifests); seals through the real [`Ledger::commit`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::decisions::core::FailCause;
use crate::ledger::{CommitOutcome, Cursor, Ledger, LedgerError, NodeCommit, Retention};
use crate::round::judge::{formation, judge, Judgement, RoundTimes};
use crate::round::snapshot::{FormationInputs, RoundSnapshot};
use crate::store::keys::RunKeys;
use crate::store::{Op, Store, Txn};
use crate::{Candidate, MemoryStore, Plan, RoundConfig};

/// The run id of every simulated run.
pub const RUN: &str = "props";

/// One thing that happens to the run.
#[derive(Debug, Clone)]
pub enum Event {
    /// Node `i` asks to join (a no-op for a member of the running generation).
    Join(usize),
    /// Node `i` leaves cleanly.
    Leave(usize),
    /// Node `i`'s lease expires (it vanished).
    Expire(usize),
    /// A worker of the running generation fails: the generation closes.
    Fail,
    /// A node waits beside a running generation below MAX: the generation re-forms to admit it.
    ScaleUp,
    /// Every member of the running generation saves step `k`.
    Seal(u64),
    /// Every member of the generation before the newest one saves step `k` (workers of an
    /// old world that still run for a while).
    StaleSeal(u64),
    /// The clock moves on by this many milliseconds.
    Advance(u64),
}

/// What one event led to, for the invariants to judge.
#[derive(Debug)]
pub enum Outcome {
    /// The decision core formed a plan.
    Formed {
        /// The plan written to the store.
        plan: Box<Plan>,
        /// The nodes that were waiting, in arrival order.
        waiting: Vec<Candidate>,
        /// The nodes left standing by.
        standby: Vec<Candidate>,
        /// A generation was still running when this one formed (a second world).
        beside_running: bool,
    },
    /// The round failed for every waiting node.
    Failed {
        /// How many nodes were waiting.
        waiting: usize,
        /// Which rule failed it.
        cause: FailCause,
    },
    /// Not yet.
    Waited,
    /// A generation saved a step: the ledger's answers, one per member.
    Sealed(Vec<Result<CommitOutcome, LedgerError>>),
    /// An old generation tried to save a step: the ledger's answers, one per member.
    StaleSealed(Vec<Result<CommitOutcome, LedgerError>>),
}

/// The simulated run.
pub struct Sim {
    /// Rendezvous knobs.
    pub cfg: RoundConfig,
    /// Every node that may take part (index = event argument).
    pub nodes: Vec<Candidate>,
    /// Nodes whose lease holds.
    pub alive: BTreeSet<String>,
    /// Nodes waiting, in arrival order.
    pub waiting: Vec<Candidate>,
    /// The newest plan, and whether its generation still runs.
    pub plan: Option<Plan>,
    /// Whether `plan`'s generation runs.
    pub running: bool,
    /// The plan before `plan`, if any.
    pub previous: Option<Plan>,
    /// The synthetic clock.
    pub now: Instant,
    times: RoundTimes,
    /// The store the ledger and the plans live on.
    pub store: Arc<dyn Store>,
    /// The ledger of the run.
    pub ledger: Ledger,
    keys: RunKeys,
}

impl Sim {
    /// A run of `nodes` under `cfg`, nobody joined yet.
    pub fn new(cfg: RoundConfig, nodes: Vec<Candidate>) -> Self {
        let now = Instant::now();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        Sim {
            cfg,
            nodes,
            alive: BTreeSet::new(),
            waiting: Vec::new(),
            plan: None,
            running: false,
            previous: None,
            now,
            times: RoundTimes::new(now),
            ledger: Ledger::new(store.clone(), RUN),
            store,
            keys: RunKeys::new(RUN),
        }
    }

    fn member(&self, node: &str) -> bool {
        self.running && self.plan.as_ref().is_some_and(|p| p.member(node).is_some())
    }

    /// Applies `e`, then lets the decider look at the round once.
    pub async fn step(&mut self, e: &Event) -> Outcome {
        match *e {
            Event::Join(i) => {
                let c = self.nodes[i % self.nodes.len()].clone();
                self.alive.insert(c.node_id.clone());
                let waits = self.waiting.iter().any(|w| w.node_id == c.node_id);
                if !waits && !self.member(&c.node_id) {
                    self.waiting.push(c);
                }
            }
            Event::Leave(i) | Event::Expire(i) => {
                let id = self.nodes[i % self.nodes.len()].node_id.clone();
                self.alive.remove(&id);
                self.waiting.retain(|w| w.node_id != id);
                if self.member(&id) {
                    self.running = false;
                }
            }
            Event::Fail => self.running = false,
            Event::ScaleUp => {
                let members = self.plan.as_ref().map_or(0, |p| p.members.len());
                if self.running && !self.waiting.is_empty() && members < self.cfg.max_nodes {
                    self.running = false;
                }
            }
            Event::Seal(k) if self.running => {
                let plan = self.plan.clone().expect("a running generation has a plan");
                return Outcome::Sealed(self.seal(&plan, k).await);
            }
            Event::StaleSeal(k) => {
                if let Some(old) = self.previous.clone() {
                    return Outcome::StaleSealed(self.seal(&old, k).await);
                }
            }
            Event::Seal(_) => {}
            Event::Advance(ms) => self.now += Duration::from_millis(ms),
        }
        self.decide().await
    }

    /// The round as the decider would read it from a store now (`round/snapshot.rs`): every
    /// waiting key written after the newest plan's, none of them a member's consumed join.
    pub fn snapshot(&self) -> RoundSnapshot {
        RoundSnapshot {
            generation: self.plan.as_ref().map_or(0, |p| p.generation),
            revision: 0,
            current: self.plan.clone(),
            live: self
                .plan
                .iter()
                .flat_map(|p| p.members.iter())
                .map(|m| m.node_id.clone())
                .filter(|id| self.alive.contains(id))
                .collect(),
            waiting: self
                .waiting
                .iter()
                .cloned()
                .map(|c| (c.into(), 1))
                .collect(),
            finished: false,
            closed: !self.running,
            live_after: true,
        }
    }

    async fn decide(&mut self) -> Outcome {
        let snap = self.snapshot();
        let judged = judge(&snap, &self.times, self.now, &self.cfg);
        self.times = judged.times;
        match judged.judgement {
            Judgement::Wait { until } => {
                assert!(until > self.now, "a wait names a future instant");
                Outcome::Waited
            }
            Judgement::Fail { cause, .. } => {
                // Every waiting node ends with the verdict; the round opens anew.
                let waiting = std::mem::take(&mut self.waiting).len();
                self.times.opened_at = self.now;
                self.times.min_reached_at = None;
                Outcome::Failed { waiting, cause }
            }
            Judgement::Form(order) => {
                let beside_running = self.running;
                let standby = order.standby.clone();
                let waiting = std::mem::replace(&mut self.waiting, standby.clone());
                let plan = self.form(&snap, &order).await;
                Outcome::Formed {
                    plan: Box::new(plan),
                    waiting,
                    standby,
                    beside_running,
                }
            }
            other @ (Judgement::Finished | Judgement::TurnAway { .. }) => {
                unreachable!("no run ends and no fingerprint is sent here: {other:?}")
            }
        }
    }

    async fn form(&mut self, snap: &RoundSnapshot, order: &crate::round::judge::FormOrder) -> Plan {
        let g = snap.generation;
        let inputs = FormationInputs {
            // Every generation of the model ends closed: no restart is counted at formation.
            closed: true,
            manifests: self.ledger.manifests().await.expect("memory store"),
            bad: self.ledger.bad().await.expect("memory store"),
            ..FormationInputs::default()
        };
        let plan = formation(
            RUN,
            snap,
            order,
            "",
            &inputs,
            self.times.opened_at,
            self.now,
            0,
        )
        .expect("admitted sets are formable")
        .plan;
        let mut ops = vec![Op::put(self.keys.gen_current(), (g + 1).to_string())];
        for m in plan.members.iter() {
            ops.push(Op::put(self.keys.member(g + 1, &m.node_id), "alive"));
        }
        let txn = Txn {
            compares: vec![],
            success: ops,
            failure: vec![],
        };
        assert!(self.store.txn(txn).await.expect("memory store").succeeded);
        self.previous = self.plan.replace(plan.clone());
        self.running = true;
        plan
    }

    async fn seal(&self, plan: &Plan, step: u64) -> Vec<Result<CommitOutcome, LedgerError>> {
        let cursor = Cursor {
            consumed_in_epoch: step,
            ..Cursor::default()
        };
        let mut out = Vec::new();
        for m in plan.members.iter() {
            let rec = NodeCommit {
                node_id: m.node_id.clone(),
                generation: plan.generation,
                step,
                ranks: (m.base_rank..m.base_rank + m.slots).collect(),
                cursor: cursor.clone(),
                files: vec![],
                save_started_ms: None,
                staged_ms: None,
            };
            out.push(self.ledger.commit(plan, &rec, Retention::default()).await);
        }
        out
    }

    /// `ckpt/latest` as `(step, generation)`, if any step was sealed.
    pub async fn latest(&self) -> Option<(u64, u64)> {
        let kv = self.store.get(&self.keys.ckpt_latest()).await.ok()??;
        crate::ledger::parse_id(&kv.value_str())
    }
}
