//! What the agent's metrics learn from the machine's inputs, before each step: formations,
//! re-form reasons, seals, the resume point's verification and the spawn that ends a restart
//! (with the machine's [`crate::phases::RestartClock`]). The loop reports the rest (stops,
//! worker exits, commits, step beacons) where it carries them out.

use drun_rendezvous::Event;
use tokio::time::Instant;

use super::state::{Input, Machine, Phase};
use crate::group::WorkerGroup;
use crate::metrics::AgentMetrics;

/// Records what `input` says about the run, given the machine `m` it is about to step (for a
/// spawn, its plan's resume step) and, for a spawn, the group (its workers).
pub(super) fn input(
    metrics: &AgentMetrics,
    m: &Machine,
    input: &Input,
    group: Option<&WorkerGroup>,
    now: Instant,
) {
    match input {
        Input::Event(Event::Formed(plan)) if matches!(m.phase, Phase::Forming { .. }) => {
            metrics.formed(plan, now);
        }
        Input::Event(Event::Reform { generation, reason }) => {
            metrics.reform(*generation, reason);
        }
        Input::Event(Event::Sealed(id)) => metrics.sealed(id),
        Input::Verified(_) => metrics.verified(now),
        Input::Spawned if matches!(m.phase, Phase::Verifying { .. }) => {
            let resume_step = m
                .plan()
                .and_then(|p| p.resume.as_ref())
                .map_or(0, |r| r.step);
            let workers = group.map(WorkerGroup::running).unwrap_or_default();
            metrics.spawned(m.clock.as_ref(), resume_step, workers, now);
        }
        _ => {}
    }
}
