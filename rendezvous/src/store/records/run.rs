//! The records of a run's life: its restart counters (key `restarts`), a failed round's
//! verdict (`gen/current.failed`), a formation (`formation/<g>`), a save request
//! (`gen/<g>/preempt`, …), the job-wide failure history (`failure/<g>`) and its end (`finished`).

use serde::{Deserialize, Serialize};

use super::{Door, RootCause};

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
    /// Newcomers turned away by an earlier verdict that had not read it yet when this one was
    /// written: node → its own message (see `Round::publish_turn_away`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub earlier: std::collections::BTreeMap<String, String>,
}

impl RoundFailure {
    /// The message for `node`, if the verdict names it.
    pub fn message_for(&self, node: &str) -> Option<&str> {
        if self.nodes.iter().any(|n| n == node) {
            return Some(&self.message);
        }
        self.earlier.get(node).map(String::as_str)
    }

    /// Every node the verdict names, with its message.
    pub fn verdicts(&self) -> impl Iterator<Item = (&str, &str)> {
        self.nodes
            .iter()
            .map(|n| (n.as_str(), self.message.as_str()))
            .chain(self.earlier.iter().map(|(n, m)| (n.as_str(), m.as_str())))
    }
}

/// Why the group is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartCause {
    /// A worker exited non-zero or by a signal.
    Failure,
    /// A node joined or left.
    Membership,
}

/// When generation `g` formed, and what its re-form lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Formation {
    /// When the decider's round opened (its own join, or the end of the previous generation),
    /// milliseconds since the Unix epoch.
    pub round_opened_at_ms: u64,
    /// When the plan was written, milliseconds since the Unix epoch.
    pub formed_at_ms: u64,
    /// The work the previous generation did that this one repeats; `None` for the first
    /// generation, or when the previous generation's formation was not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_work: Option<LostWork>,
    /// What the members' environments agreed on: a newcomer the next re-form would refuse is
    /// turned away at it ([`crate::decisions::door::refusal`]). `None`: no member sent a fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub door: Option<Door>,
}

impl Formation {
    /// How long the formation took (round opened → plan written), milliseconds.
    pub fn duration_ms(&self) -> u64 {
        self.formed_at_ms.saturating_sub(self.round_opened_at_ms)
    }
}

/// The work of a generation that its successor repeats: the generation's running time after
/// the checkpoint the successor resumes from (all of it when that checkpoint is older than the
/// generation, or there is none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostWork {
    /// Running time lost, milliseconds.
    pub ms: u64,
    /// The step the successor resumes from (`None`: from the start, no checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_step: Option<u64>,
}

/// One failure of the job (key `failure/<g>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The generation it ended.
    pub generation: u64,
    /// When the generation was closed for it, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Why, one line (the failed rank, or the lost node).
    pub reason: String,
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
    /// A failed run's root cause: the worker failure that spent the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_cause: Option<RootCause>,
    /// The run ended because its rendezvous went away (the agent hosting a c10d-style
    /// rendezvous stopped, taking the run's in-memory state with it), not on a verdict about
    /// the training: agents end with exit 3, which a restart policy retries, and the restarted
    /// job resumes from the last checkpoint. Always false for a successful end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retryable: bool,
    /// The run's size is fixed and a node could not take part (its GPUs failed their health
    /// check; `reason` names the node and the GPUs): every agent ends with exit 6, as that
    /// node did, so a restart policy that retries exit 6 retries the job on other hardware.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unfit: bool,
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
    /// Asked by `--ckpt-interval` (the interval since the last seal passed): the agents carry on
    /// after the seal, as for a scale-up save.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interval: bool,
}
