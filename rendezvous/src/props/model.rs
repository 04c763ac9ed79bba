//! A small simulated run that the decision-core property drives: nodes, their leases, the
//! waiting set, the running generation, and a real [`Ledger`] on a [`MemoryStore`].
//!
//! The round view is built the way the decider builds it (`round/decider.rs` `decide_once`):
//! `opened_at` follows the running generation, `min_reached_at` is set when the waiting set
//! first reaches MIN, `outstanding` lists the live members of the previous generation that have
//! not joined again, `newcomers` counts the others not seen waiting while it ran. Formations go through the real [`decide`], [`assign`] and
//! [`Ledger::resume_point`]; seals through the real [`Ledger::commit`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::core::{FailCause, RoundView, RunningGeneration};
use crate::keys::RunKeys;
use crate::ledger::{CommitOutcome, Cursor, Ledger, LedgerError, NodeCommit, Retention};
use crate::store::{Op, Store, Txn};
use crate::{assign, decide, Candidate, Decision, MemoryStore, Plan, RoundConfig};

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
    opened_at: Instant,
    min_reached_at: Option<Instant>,
    batched: BTreeSet<String>,
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
            opened_at: now,
            min_reached_at: None,
            batched: BTreeSet::new(),
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

    /// The round as the decider sees it now (`decide_once`).
    pub fn view(&mut self) -> RoundView {
        let running = match &self.plan {
            Some(p) if self.running => Some(RunningGeneration {
                generation: p.generation,
                members: p.members.len(),
            }),
            _ => None,
        };
        if running.is_some() {
            self.opened_at = self.now;
            self.min_reached_at = None;
        } else if self.waiting.len() >= self.cfg.min_nodes {
            self.min_reached_at.get_or_insert(self.now);
        } else {
            self.min_reached_at = None;
        }
        let outstanding = match &self.plan {
            Some(p) if running.is_none() => Some(
                p.members
                    .iter()
                    .map(|m| m.node_id.clone())
                    .filter(|id| self.alive.contains(id))
                    .filter(|id| !self.waiting.iter().any(|w| &w.node_id == id))
                    .collect(),
            ),
            _ => None,
        };
        let newcomers = match &self.plan {
            Some(p) => {
                let new: Vec<String> = self
                    .waiting
                    .iter()
                    .filter(|w| p.member(&w.node_id).is_none())
                    .map(|w| w.node_id.clone())
                    .collect();
                if running.is_some() {
                    self.batched.extend(new);
                    0
                } else {
                    new.iter().filter(|n| !self.batched.contains(*n)).count()
                }
            }
            None => 0,
        };
        RoundView {
            opened_at: self.opened_at,
            min_reached_at: self.min_reached_at,
            candidates: self.waiting.clone(),
            outstanding,
            newcomers,
            running,
        }
    }

    async fn decide(&mut self) -> Outcome {
        let view = self.view();
        match decide(&view, self.now, &self.cfg) {
            Decision::Wait { wake_at, .. } => {
                assert!(wake_at > self.now, "a wait names a future instant");
                Outcome::Waited
            }
            Decision::Fail { cause, .. } => {
                // Every waiting node ends with the verdict; the round opens anew.
                let waiting = std::mem::take(&mut self.waiting).len();
                self.opened_at = self.now;
                self.min_reached_at = None;
                Outcome::Failed { waiting, cause }
            }
            Decision::Form {
                admitted, standby, ..
            } => {
                let beside_running = self.running;
                let waiting = std::mem::replace(&mut self.waiting, standby.clone());
                let plan = self.form(&admitted).await;
                Outcome::Formed {
                    plan: Box::new(plan),
                    waiting,
                    standby,
                    beside_running,
                }
            }
        }
    }

    async fn form(&mut self, admitted: &[Candidate]) -> Plan {
        let g = self.plan.as_ref().map_or(0, |p| p.generation);
        let mut plan = assign(RUN, g + 1, admitted, 0, 0).expect("admitted sets are formable");
        let resume = self.ledger.resume_point(&[]).await.expect("memory store");
        plan.resume = resume.manifest;
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
