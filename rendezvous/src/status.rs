//! A run's state as `status` reports it ([`RunStatus`], the JSON of `drun-rendezvous status
//! --json` and of the `Status` RPC), read from the store, with each node's state decided purely
//! ([`node_states`]).
//!
//! Every field decodes with a default, so a status from an older server (without `nodes`,
//! `formation`, ...) still renders ([`crate::status::view`]), with `-` for what it lacks.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::decisions::formation::Formation;
use crate::decisions::loss;
use crate::decisions::root_cause::RootCause;
use crate::round::Restarts;
use crate::session::RunEnd;
use crate::{Ledger, Plan, Round, RoundConfig, Store, StoreError};

/// A run's state. Serialized, it is the `status --json` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunStatus {
    /// Run id.
    pub run: String,
    /// Current generation (0: never formed).
    pub generation: u64,
    /// The plan of the current generation.
    pub plan: Option<Plan>,
    /// The nodes waiting to join (JSON [`crate::Join`]s): standbys, or a round forming.
    pub waiting: Vec<serde_json::Value>,
    /// The decider's latest progress line, while a round forms.
    pub progress: Option<String>,
    /// The verdict of a failed round (JSON [`crate::round::RoundFailure`]).
    pub round_failed: Option<serde_json::Value>,
    /// Group restarts so far, by cause.
    pub restarts: RestartCounts,
    /// How the run ended, if it did.
    pub finished: Option<RunEnd>,
    /// The first worker failure of each generation that one ended, oldest first.
    pub root_causes: Vec<RootCause>,
    /// The checkpoint ledger.
    pub checkpoints: Checkpoints,
    /// When this status was read, milliseconds since the Unix epoch (0: an older server).
    pub now_ms: u64,
    /// Why the current generation must re-form, once it must.
    pub closed: Option<String>,
    /// The current generation's formation (`None`: formed by an older drun, or not yet).
    pub formation: Option<FormationStatus>,
    /// Every node the run knows now: members, standbys, and the nodes the last re-form lost.
    pub nodes: Vec<NodeStatus>,
    /// The nodes' reports (see [`crate::store::reports`]): kind (`preflight`, `stragglers`) → node →
    /// JSON.
    #[serde(default)]
    pub reports: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// The checkpoint interval in force (`--ckpt-interval`; `None`: off).
    pub ckpt_interval: Option<crate::decisions::ckpt_interval::Interval>,
    /// The job-wide failure history (worker failures and lost nodes), oldest first.
    pub failures: Vec<crate::ledger::failure_log::FailureRecord>,
}

/// Group restarts by cause.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RestartCounts {
    /// Caused by worker failures (counted against `--max-restarts`).
    pub failures: u32,
    /// Caused by membership changes (nodes lost, left or added; free).
    pub membership: u32,
}

/// The current generation's formation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FormationStatus {
    /// The stored record.
    #[serde(flatten)]
    pub record: Formation,
    /// Round opened → plan written, milliseconds.
    pub duration_ms: u64,
    /// Why the group formed when it did.
    pub because: String,
}

/// The checkpoint ledger as `status` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Checkpoints {
    /// The newest sealed checkpoint not marked bad.
    pub latest: Option<LatestCheckpoint>,
    /// Every sealed checkpoint, oldest first.
    pub sealed: Vec<SealedRef>,
    /// Checkpoints that failed verification: id → why.
    pub bad: BTreeMap<String, String>,
}

/// The newest usable checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatestCheckpoint {
    /// Its step.
    pub step: u64,
    /// The generation that saved it.
    pub generation: u64,
    /// The WORLD_SIZE that saved it.
    pub world_size: u32,
    /// The data cursor after `step`.
    pub cursor: crate::Cursor,
    /// Number of files.
    pub files: usize,
    /// Total size, bytes.
    pub bytes: u64,
    /// The deepest directory holding every file.
    pub path: std::path::PathBuf,
    /// When it was sealed, milliseconds since the Unix epoch (0: an older server).
    pub sealed_at_ms: u64,
    /// Its save cost as the ranks saw it (first rank's save start → seal), milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save_ms: Option<u64>,
}

/// One sealed checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedRef {
    /// Its step.
    pub step: u64,
    /// The generation that saved it.
    pub generation: u64,
}

/// One node as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node id.
    pub node: String,
    /// What it is doing.
    pub state: NodeState,
    /// Why it is lost or left, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Its node rank in the current generation (`None`: not a member).
    #[serde(default)]
    pub node_rank: Option<u32>,
    /// Its global ranks in the current generation, first and last (`None`: not a member).
    #[serde(default)]
    pub ranks: Option<(u32, u32)>,
    /// The address it advertised.
    #[serde(default)]
    pub addr: String,
}

/// A node's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// A member whose agent holds its membership.
    Running,
    /// A member (or a rejoining one) whose join is pending, or a node waiting in a round
    /// that forms (no generation runs): starting, or re-forming.
    Joining,
    /// A member whose workers all succeeded.
    Done,
    /// A member of a run that has ended.
    Ended,
    /// Waiting outside a running group: admitted at the next re-form.
    Standby,
    /// Gone without leaving: connection closed, lease expired.
    Lost,
    /// Its agent left on purpose (a signal, an error).
    Left,
}

/// What the store says about the nodes, for [`node_states`].
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// Node ids holding a membership key of the current generation.
    pub present: Vec<String>,
    /// Node ids whose workers all succeeded in it.
    pub done: Vec<String>,
    /// Node ids with a waiting key (a join), with their advertised address.
    pub waiting: Vec<(String, String)>,
    /// Why nodes were dropped (the `lost/<node>` keys).
    pub lost: BTreeMap<String, String>,
    /// The run has ended.
    pub ended: bool,
    /// No generation runs: none formed yet, or the current one re-forms. Nodes waiting then
    /// are joining the round, not standing by beside a running group.
    pub forming: bool,
}

/// Each node's state (pure): the members of `plan` in node-rank order, then the standbys,
/// then the members of `previous` (the generation before) that are neither.
pub fn node_states(
    plan: Option<&Plan>,
    previous: Option<&Plan>,
    facts: &NodeFacts,
) -> Vec<NodeStatus> {
    let has = |list: &[String], id: &str| list.iter().any(|n| n == id);
    let waits = |id: &str| facts.waiting.iter().any(|(n, _)| n == id);
    let gone = |id: &str| {
        let why = facts
            .lost
            .get(id)
            .cloned()
            .unwrap_or_else(|| loss::LEASE_EXPIRED.to_string());
        let state = if why == loss::LEFT {
            NodeState::Left
        } else {
            NodeState::Lost
        };
        (state, Some(why))
    };
    let mut out = Vec::new();
    for m in plan.map(|p| &p.members[..]).unwrap_or_default() {
        let (state, why) = if has(&facts.done, &m.node_id) {
            (NodeState::Done, None)
        } else if facts.ended && facts.lost.contains_key(&m.node_id) {
            // Dropped before the run ended, with a recorded reason: that is its story.
            gone(&m.node_id)
        } else if facts.ended {
            (NodeState::Ended, None)
        } else if has(&facts.present, &m.node_id) {
            (NodeState::Running, None)
        } else if waits(&m.node_id) {
            (NodeState::Joining, None)
        } else {
            gone(&m.node_id)
        };
        out.push(NodeStatus {
            node: m.node_id.clone(),
            state,
            why,
            node_rank: Some(m.node_rank),
            ranks: (m.slots > 0).then(|| (m.base_rank, m.base_rank + m.slots - 1)),
            addr: m.advertise_addr.clone(),
        });
    }
    let member = |id: &str| plan.is_some_and(|p| p.member(id).is_some());
    for (id, addr) in facts.waiting.iter().filter(|(id, _)| !member(id)) {
        out.push(NodeStatus {
            node: id.clone(),
            state: if facts.forming {
                NodeState::Joining
            } else {
                NodeState::Standby
            },
            why: None,
            node_rank: None,
            ranks: None,
            addr: addr.clone(),
        });
    }
    for m in previous.map(|p| &p.members[..]).unwrap_or_default() {
        if !member(&m.node_id) && !waits(&m.node_id) && !facts.ended {
            let (state, why) = gone(&m.node_id);
            out.push(NodeStatus {
                node: m.node_id.clone(),
                state,
                why,
                node_rank: None,
                ranks: None,
                addr: m.advertise_addr.clone(),
            });
        }
    }
    out
}

/// A run's state read from `store`.
///
/// # Errors
/// Store errors; a run record that does not decode is [`StoreError::Corrupt`].
pub async fn read_status(store: &Arc<dyn Store>, run: &str) -> Result<RunStatus, StoreError> {
    let round = Round::new(store.clone(), run, RoundConfig::single_node());
    let state = round.state().clone();
    let (generation, _) = round.current_generation().await?;
    let plan = round.plan(generation).await?;
    let previous = match generation {
        0 | 1 => None,
        g => round.plan(g - 1).await?,
    };
    let waiting = state.waiting_json().await?;
    let waiting_ids: Vec<(String, String)> = waiting
        .iter()
        .filter_map(|w| {
            let id = w["node_id"].as_str()?.to_string();
            Some((id, w["advertise_addr"].as_str().unwrap_or("").to_string()))
        })
        .collect();
    let present = state.live_members(generation).await?;
    let done = state.done_nodes(generation).await?;
    let lost = state.lost_all().await?;
    let finished = state.finished().await?;
    let closed = state.closed(generation).await?;
    let facts = NodeFacts {
        present,
        done,
        waiting: waiting_ids,
        lost,
        ended: finished.is_some(),
        forming: plan.is_none() || closed.is_some(),
    };
    let nodes = node_states(plan.as_ref(), previous.as_ref(), &facts);
    let (restarts, _): (Restarts, _) = state.restarts().await?;
    let formation = state
        .formation(generation)
        .await?
        .map(|record| FormationStatus {
            duration_ms: record.duration_ms(),
            because: plan
                .as_ref()
                .map(|p| p.formed_because.clone())
                .unwrap_or_default(),
            // The members' environments stay out of `status`: they are the session's to judge
            // newcomers with, not part of the run's story.
            record: Formation {
                door: None,
                ..record
            },
        });
    let ledger = Ledger::new(store.clone(), run);
    let sealed = ledger.manifests().await?;
    let bad = ledger.bad().await?;
    let latest = sealed
        .iter()
        .rev()
        .find(|m| !bad.contains_key(&m.id()))
        .map(|m| LatestCheckpoint {
            step: m.step,
            generation: m.generation,
            world_size: m.world_size,
            cursor: m.cursor.clone(),
            files: m.files.len(),
            bytes: m.bytes(),
            path: m.dir(),
            sealed_at_ms: m.sealed_at_ms,
            save_ms: m.save_ms,
        });
    Ok(RunStatus {
        run: run.to_string(),
        generation,
        plan,
        waiting,
        progress: state.progress().await?,
        round_failed: state.round_failure_json().await?,
        restarts: RestartCounts {
            failures: restarts.failures,
            membership: restarts.membership,
        },
        finished,
        root_causes: state.root_causes().await?,
        ckpt_interval: state.ckpt_interval().await?,
        failures: state.failures().await?,
        checkpoints: Checkpoints {
            latest,
            sealed: sealed
                .iter()
                .map(|m| SealedRef {
                    step: m.step,
                    generation: m.generation,
                })
                .collect(),
            bad,
        },
        now_ms: now_ms(),
        closed,
        formation,
        nodes,
        reports: state.reports().await?,
    })
}

/// [`read_status`] as JSON (the `Status` RPC's answer).
///
/// # Errors
/// As [`read_status`].
pub async fn status_json(
    store: &Arc<dyn Store>,
    run: &str,
) -> Result<serde_json::Value, StoreError> {
    let status = read_status(store, run).await?;
    Ok(serde_json::to_value(status).expect("a run status serializes"))
}

impl RunStatus {
    /// Whether the store knows nothing of this run (nothing waiting, formed or finished).
    pub fn is_unknown(&self) -> bool {
        self.generation == 0 && self.finished.is_none() && self.waiting.is_empty()
    }
}

pub mod client;
pub mod view;

#[cfg(test)]
mod tests;
