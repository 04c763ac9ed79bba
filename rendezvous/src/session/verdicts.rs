//! The job-wide verdicts beside a running generation, pure like the generation core
//! (`generation.rs`): the failure budget, the exit barrier, fencing, duplicate joins.

use super::generation::Rules;
use super::protocol::RunEnd;
use crate::round::Restarts;
use crate::store::LeaseId;
use crate::Plan;

/// What a worker failure of generation `g` does to the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FailureVerdict {
    /// A re-form is already under way, or `g` is over: restart, spending nothing.
    Joins {
        /// Counters as they are.
        restarts: Restarts,
        /// Why nothing is spent.
        reason: String,
    },
    /// Spend one unit of the budget and close `g` with `closed`.
    Spend {
        /// Counters after spending.
        next: Restarts,
        /// The close reason.
        closed: String,
    },
    /// The budget is spent: end the run as failed.
    End {
        /// The run's end.
        end: RunEnd,
        /// Counters with this failure in the history.
        last: Restarts,
    },
}

/// The failure budget: a failure of generation `g` (`description`), given the counters, the
/// current generation and `gen/<g>/closed`. `at_ms`: the time of a run end.
pub(crate) fn failure_verdict(
    g: u64,
    description: &str,
    restarts: &Restarts,
    current: u64,
    closed: Option<&str>,
    rules: &Rules,
    at_ms: u64,
) -> FailureVerdict {
    if let Some(why) = closed {
        return FailureVerdict::Joins {
            restarts: restarts.clone(),
            reason: format!("the failure joins an ongoing re-form ({why})"),
        };
    }
    if current != g {
        return FailureVerdict::Joins {
            restarts: restarts.clone(),
            reason: format!("generation {g} is over (current: {current})"),
        };
    }
    let mut next = restarts.clone();
    next.history.push(format!("generation {g}: {description}"));
    if restarts.failures < rules.max_restarts {
        next.failures += 1;
        return FailureVerdict::Spend {
            next,
            closed: format!("worker failure: {description}"),
        };
    }
    FailureVerdict::End {
        end: RunEnd {
            success: false,
            reason: format!(
                "{description}; restart budget spent ({} of {} used)",
                restarts.failures, rules.max_restarts
            ),
            at_ms,
            root_cause: None,
            retryable: false,
            unfit: false,
        },
        last: next,
    }
}

/// The exit barrier: when every member of `plan` has succeeded (`done` holds their node ids),
/// the run's successful end; `None` while a node is still late.
pub(crate) fn exit_barrier(plan: &Plan, done: &[String], at_ms: u64) -> Option<RunEnd> {
    plan.members
        .iter()
        .all(|m| done.contains(&m.node_id))
        .then(|| RunEnd {
            success: true,
            reason: format!(
                "all {} workers of generation {} succeeded",
                plan.world_size, plan.generation
            ),
            at_ms,
            root_cause: None,
            retryable: false,
            unfit: false,
        })
}

/// The keeper gave up on lease `lost`: fence unless the session holds another lease by now.
pub(crate) fn fences(held: Option<LeaseId>, lost: LeaseId) -> bool {
    held == Some(lost)
}

/// A Join of an agent that last ran generation `after`, while the session runs `running`
/// (`None`: not running) or waits: ignored as a duplicate.
pub(crate) fn join_is_duplicate(waiting: bool, running: Option<u64>, after: u64) -> bool {
    waiting || running.is_some_and(|g| g > after)
}

#[cfg(test)]
mod tests;
