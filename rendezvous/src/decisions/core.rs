//! The decision core: when does a waiting set of nodes become a group?
//!
//! A pure function of (what the store shows, now, configuration) → [`Decision`] with a reason a
//! human can read. It never sleeps; callers re-evaluate at [`Decision::Wait::wake_at`] or when the
//! store changes. Completion rules follow torchrun's dynamic rendezvous
//! (`torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`): form at once when `max_nodes`
//! joined; with at least `min_nodes`, form when the last-call window (counted from the moment the
//! minimum was reached) closes; fail when `join_timeout` (counted from the opening of the round)
//! passes below the minimum. Arrivals beyond `max_nodes` are standbys, not errors.
//!
//! A set that is due to form but cannot be ranked into a plan ([`crate::decisions::plan::formable`]) fails
//! the round at once ([`FailCause::Unformable`]) rather than waiting for a set that can: the
//! decider publishes the verdict and every waiting node ends with the same line (see
//! [`crate::Round::wait_for_plan`]). With pinned node ranks as an order (see [`crate::decisions::plan`]),
//! nothing a drun agent sends is unformable; what is left are malformed candidates from a foreign
//! or broken client (no worker slots, a world size beyond `u32`).

use std::time::Duration;

use tokio::time::Instant;

use crate::decisions::names::node_list;
pub use crate::store::records::{Candidate, Join};

/// Knobs of one rendezvous round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundConfig {
    /// `--nnodes` MIN, ≥ 1.
    pub min_nodes: usize,
    /// `--nnodes` MAX, ≥ MIN.
    pub max_nodes: usize,
    /// Last-call window after MIN is reached (torchrun `last_call_timeout`, default 30 s).
    pub last_call: Duration,
    /// Give up below MIN after this long (torchrun `join_timeout`, default 600 s).
    pub join_timeout: Duration,
    /// A re-form whose surviving members have all joined again together with newcomers forms
    /// this long after MIN was reached, batching further arrivals, instead of waiting out
    /// `last_call` (`reform_settle`, default [`DEFAULT_SETTLE`]); one without newcomers forms
    /// at once.
    pub settle: Duration,
}

/// Default settle window of a re-form: 1 s.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);

impl RoundConfig {
    /// A one-node group (`--standalone`): forms as soon as its only node joins.
    pub fn single_node() -> Self {
        Self {
            min_nodes: 1,
            max_nodes: 1,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(600),
            settle: Duration::ZERO,
        }
    }
}

/// What the round looks like right now.
#[derive(Debug, Clone)]
pub struct RoundView {
    /// When this round opened (first join or previous generation's end).
    pub opened_at: Instant,
    /// When the waiting set first reached `min_nodes`, if it has.
    pub min_reached_at: Option<Instant>,
    /// Waiting nodes in arrival order.
    pub candidates: Vec<Candidate>,
    /// For a re-form, the members of the previous generation that are still alive (their
    /// membership lease holds) and have not joined again yet; `None` for the first formation.
    pub outstanding: Option<Vec<String>>,
    /// For a re-form, how many waiting nodes were not members of the previous generation and
    /// were not already batched by its last call while it ran (fresh arrivals): only they are
    /// worth a settle window that batches further arrivals.
    pub newcomers: usize,
    /// The previous generation, if it still runs (not closed, a member alive or starting):
    /// nobody forms beside it.
    pub running: Option<RunningGeneration>,
}

/// A generation that still runs while nodes wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningGeneration {
    /// Its number.
    pub generation: u64,
    /// How many nodes it has.
    pub members: usize,
}

/// How often the decider re-reads a round that waits on a running generation (and publishes
/// its progress line, at most).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// How many progress lines a second the waiting agents are sent in all, at most: every
/// waiting node watches the line, and a server relays each one to each of its agents.
pub const PROGRESS_LINES_PER_SECOND: usize = 1_000;

/// The longest the decider keeps a changed progress line to itself.
pub const PROGRESS_EVERY_MAX: Duration = Duration::from_secs(10);

/// How long a progress line whose countdown alone moved is kept back: a wait that goes on
/// (below MIN for minutes) is printed again this often, so that it is seen to go on.
pub const PROGRESS_REPEAT: Duration = Duration::from_secs(30);

/// Whether the progress line `line` is worth printing (or publishing) after `last`, printed at
/// `last_at`: its state changed, not only its countdown
/// ([`crate::human::without_countdown`]), or [`PROGRESS_REPEAT`] passed since.
pub fn progress_due(line: &str, last: &str, last_at: Option<Instant>, now: Instant) -> bool {
    use crate::human::without_countdown;
    !line.is_empty()
        && (without_countdown(line) != without_countdown(last)
            || last_at.is_none_or(|t| now.saturating_duration_since(t) >= PROGRESS_REPEAT))
}

/// How long the decider waits between two progress lines it publishes while `waiting` nodes
/// wait: [`PROGRESS_EVERY`], stretched so that relaying one line to every waiting node costs at
/// most [`PROGRESS_LINES_PER_SECOND`] lines a second (10,000 agents arriving got ten thousand
/// lines a second, most of a formation's messages), up to [`PROGRESS_EVERY_MAX`].
pub fn progress_every(waiting: usize) -> Duration {
    let per_line = Duration::from_secs(1) * waiting.min(u32::MAX as usize) as u32
        / PROGRESS_LINES_PER_SECOND as u32;
    per_line.clamp(PROGRESS_EVERY, PROGRESS_EVERY_MAX)
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Form the group from `admitted`; `standby` wait for a free place.
    Form {
        /// Nodes of the new generation, in arrival order (ranks are assigned by [`crate::assign`]).
        admitted: Vec<Candidate>,
        /// Arrivals beyond `max_nodes`.
        standby: Vec<Candidate>,
        /// Why now.
        reason: String,
    },
    /// Not yet; decide again at `wake_at` or when the waiting set changes.
    Wait {
        /// Progress line for the user.
        reason: String,
        /// Next instant at which the answer can change by time alone.
        wake_at: Instant,
    },
    /// The round failed for every waiting node.
    Fail {
        /// What came and what was missing, or why the set cannot form.
        reason: String,
        /// Which rule failed it.
        cause: FailCause,
    },
}

/// Why a round failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailCause {
    /// Fewer than `min_nodes` joined before `join_timeout`.
    JoinTimeout,
    /// The nodes due to form cannot be ranked into a plan (waiting longer would not help).
    Unformable,
}

/// Decides the round. Pure: same inputs, same answer.
pub fn decide(view: &RoundView, now: Instant, cfg: &RoundConfig) -> Decision {
    let n = view.candidates.len();
    if let Some(run) = view.running {
        return standing_by(run, n, now);
    }
    if n >= cfg.max_nodes {
        return at_max(view, cfg);
    }
    if n >= cfg.min_nodes {
        return above_min(view, now, cfg);
    }
    below_min(view, now, cfg)
}

/// Nodes wait while generation `run` still runs: no second world beside it.
fn standing_by(run: RunningGeneration, n: usize, now: Instant) -> Decision {
    // Standbys (the group is at MAX, or its re-form is pending): forming from them would
    // start a second world beside the running one. The round starts over when the
    // generation closes; its members then join this waiting set. No line when nobody
    // stands by: the waiting keys are the members' own, whose agents are about to see the
    // plan.
    let reason = if n == 0 {
        String::new()
    } else {
        format!(
            "generation {} is running with {} node(s); {n} node(s) standing by until it re-forms",
            run.generation, run.members
        )
    };
    Decision::Wait {
        reason,
        wake_at: now + PROGRESS_EVERY,
    }
}

/// The waiting nodes' ids, sorted as unpinned node ranks are: the same order as the "world
/// formed" line; a large group by its first nodes and a count ([`node_list`]: this line goes
/// into the plan and the progress every agent receives).
fn names(view: &RoundView) -> String {
    let mut ids: Vec<&str> = view.candidates.iter().map(|c| c.node_id.as_str()).collect();
    ids.sort_unstable();
    node_list(&ids)
}

/// A failure if the set due to form cannot be ranked into a plan.
fn unformable(admitted: &[Candidate]) -> Option<Decision> {
    crate::decisions::plan::formable(admitted)
        .err()
        .map(|why| Decision::Fail {
            reason: format!(
                "the {} node(s) due to form [{}] cannot form a group: {why}",
                admitted.len(),
                node_list(
                    &admitted
                        .iter()
                        .map(|c| c.node_id.as_str())
                        .collect::<Vec<_>>()
                )
            ),
            cause: FailCause::Unformable,
        })
}

/// MAX nodes joined: form at once; the rest stand by.
fn at_max(view: &RoundView, cfg: &RoundConfig) -> Decision {
    let (admitted, standby) = view.candidates.split_at(cfg.max_nodes);
    if let Some(fail) = unformable(admitted) {
        return fail;
    }
    Decision::Form {
        admitted: admitted.to_vec(),
        standby: standby.to_vec(),
        reason: format!(
            "{} of max {} nodes joined [{}]",
            cfg.max_nodes,
            cfg.max_nodes,
            names(view)
        ),
    }
}

/// At least MIN joined: form when the last call closes; a re-form whose survivors are all back
/// forms at once, or, when newcomers came with them, once the settle window (which batches
/// further arrivals) closes.
fn above_min(view: &RoundView, now: Instant, cfg: &RoundConfig) -> Decision {
    let n = view.candidates.len();
    let since = view.min_reached_at.unwrap_or(now);
    // A re-form waits for the survivors, not for latecomers nobody expects: once every
    // live member of the previous generation is back, only the settle window remains (a
    // lost node that returns later is a scale-up).
    let (deadline, why) = match &view.outstanding {
        // Nobody else is expected: waiting would only idle the survivors.
        Some(left) if left.is_empty() && view.newcomers == 0 => {
            (since, "every surviving member rejoined".to_string())
        }
        Some(left) if left.is_empty() => (
            since + cfg.settle.min(cfg.last_call),
            format!(
                "every surviving member rejoined (and {} newcomer{})",
                view.newcomers,
                if view.newcomers == 1 { "" } else { "s" }
            ),
        ),
        _ => (since + cfg.last_call, "last call closed".to_string()),
    };
    if now >= deadline {
        if let Some(fail) = unformable(&view.candidates) {
            return fail;
        }
        return Decision::Form {
            admitted: view.candidates.clone(),
            standby: vec![],
            reason: format!(
                "{why} with {n} node{} (min {}, max {}) [{}]",
                if n == 1 { "" } else { "s" },
                cfg.min_nodes,
                cfg.max_nodes,
                names(view)
            ),
        };
    }
    let left = (deadline - now).as_secs_f64().ceil() as u64;
    let reason = match &view.outstanding {
        Some(out) if out.is_empty() => format!(
            "{n}/{} nodes rejoined (min {}), every surviving member is back with {} newcomer(s), forming in {left} s",
            cfg.max_nodes, cfg.min_nodes, view.newcomers
        ),
        Some(out) => format!(
            "{n}/{} nodes joined (min {}), waiting for {} member(s) of the last generation to rejoin [{}], last call in {left} s",
            cfg.max_nodes,
            cfg.min_nodes,
            out.len(),
            node_list(out)
        ),
        None => format!(
            "{n}/{} nodes joined (min {}), last call in {left} s",
            cfg.max_nodes, cfg.min_nodes
        ),
    };
    Decision::Wait {
        reason,
        wake_at: deadline,
    }
}

/// Below MIN: wait, or fail the round once `join_timeout` passed.
fn below_min(view: &RoundView, now: Instant, cfg: &RoundConfig) -> Decision {
    let n = view.candidates.len();
    let deadline = view.opened_at + cfg.join_timeout;
    if now >= deadline {
        return Decision::Fail {
            reason: format!(
                "only {n} of min {} nodes joined within join_timeout {} s (came: [{}])",
                cfg.min_nodes,
                cfg.join_timeout.as_secs(),
                names(view)
            ),
            cause: FailCause::JoinTimeout,
        };
    }
    let missing = cfg.min_nodes - n;
    Decision::Wait {
        reason: format!(
            "waiting for {missing} more node{} ({n}/{}), join timeout in {} s",
            if missing == 1 { "" } else { "s" },
            cfg.min_nodes,
            (deadline - now).as_secs_f64().ceil() as u64
        ),
        wake_at: deadline,
    }
}

#[cfg(test)]
mod tests;
