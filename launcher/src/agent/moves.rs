//! What the transitions share: their context ([`Cx`]: the instant, the launch, the effects so
//! far) and the moves that `step`, `supervise` and `failure` all make — stop the workers, join
//! again, exit, end with the run, end on a sealed preemption checkpoint. A leaf: it imports
//! none of those three, which import it.

use drun_rendezvous::session::RunEnd;
use drun_rendezvous::Plan;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::state::{Effect, End, Level, Machine, Params, Phase, StopStage, Stopping, Then};
use crate::phases::RestartClock;
use crate::AgentExit;

/// What a transition sees besides the state: the time, the launch, and the effects so far.
pub(super) struct Cx<'a> {
    pub now: Instant,
    pub p: &'a Params,
    pub fx: Vec<Effect>,
}

impl Cx<'_> {
    pub fn log(&mut self, level: Level, gen: Option<u64>, text: impl Into<String>) {
        self.fx.push(Effect::Log(level, gen, text.into()));
    }
}

/// Joins the generation after `plan`'s with a fresh candidate.
pub(super) fn rejoin(plan: Box<Plan>, cx: &mut Cx<'_>) -> Phase {
    cx.fx.push(Effect::Join {
        fresh: true,
        after: plan.generation,
    });
    Phase::Forming {
        rejoin_at: None,
        after: Some(plan),
    }
}

/// Stops the workers of `plan` with `sig`; `then` follows once they are gone.
pub(super) fn stop(
    m: &mut Machine,
    plan: Box<Plan>,
    sig: Signal,
    then: Then,
    cx: &mut Cx<'_>,
) -> Phase {
    m.clock = Some(RestartClock::detected(cx.now));
    cx.fx.push(Effect::Stop(sig));
    Phase::Stopping(Stopping {
        plan,
        stage: StopStage::Grace {
            deadline: cx.now + cx.p.shutdown_timeout,
        },
        sigints: usize::from(sig == Signal::SIGINT),
        then,
    })
}

pub(super) fn exit(e: AgentExit) -> Phase {
    Phase::Done(End::Exit(e))
}

pub(super) fn signal_exit(sig: Signal) -> Phase {
    exit(AgentExit::Signal(sig as i32))
}

/// The run ended: exit 0 when it succeeded, 1 when not.
pub(super) fn run_ended(end: &RunEnd, cx: &mut Cx<'_>) -> Phase {
    if end.success {
        cx.log(Level::Info, None, format!("run finished: {}", end.reason));
        exit(AgentExit::Success)
    } else if end.retryable {
        // The rendezvous went away, not the training: exit 3, which a restart policy retries.
        cx.fx.push(Effect::Say(format!(
            "drun: run {} ended: {}",
            cx.p.run_id, end.reason
        )));
        exit(AgentExit::Rendezvous)
    } else {
        // The failing node prints its own workers' summary; every other node names its cause.
        if let Some(c) = end.root_cause.as_ref().filter(|c| c.node != cx.p.node_id) {
            cx.fx.push(Effect::RemoteCause(c.clone()));
        }
        cx.fx.push(Effect::Say(format!(
            "drun: run {} failed: {}",
            cx.p.run_id, end.reason
        )));
        exit(AgentExit::WorkerFailure)
    }
}

/// The preemption checkpoint is sealed and no worker runs: requeue (node rank 0), exit 5.
pub(super) fn preempted(plan: &Plan, cx: &mut Cx<'_>) -> Phase {
    let first = plan.member(&cx.p.node_id).is_some_and(|m| m.node_rank == 0);
    if cx.p.requeue && first {
        cx.fx.push(Effect::Requeue);
    }
    exit(AgentExit::Preempted)
}
