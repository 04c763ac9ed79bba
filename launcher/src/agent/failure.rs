//! Reporting a worker failure to the rendezvous and acting on the job-wide decision: restart,
//! end, or — when the failure came from a lost node or this node was fenced — re-form without
//! spending the restart budget. Transitions of [`Phase::Reporting`], pure like [`super::step()`].

use drun_rendezvous::decisions::root_cause::RootCause;
use drun_rendezvous::round::Restarts;
use drun_rendezvous::session::{Request, RunEnd};
use drun_rendezvous::Plan;

use super::moves::{rejoin, Cx};
use super::state::{Effect, End, Ending, Level, Phase, Reporting, REFORM_REASON_WAIT};
use crate::AgentExit;

/// Reports `description`, a failure of `plan`'s generation (`cause`: the failed worker, when
/// one failed), and waits for the decision (`ending`: what to print if the run ends with it).
pub(super) fn report(
    plan: Box<Plan>,
    description: String,
    cause: Option<RootCause>,
    ending: Ending,
    cx: &mut Cx<'_>,
) -> Phase {
    let cause = cause.map(|c| RootCause {
        generation: plan.generation,
        ..c
    });
    cx.fx.push(Effect::Send(Request::Failed {
        generation: plan.generation,
        description: description.clone(),
        cause: cause.clone(),
    }));
    Phase::Reporting(Reporting {
        plan,
        description,
        cause,
        ending,
        reform: None,
        decided: None,
        ended: None,
    })
}

/// The session decided: restart (spending the budget or not) or end (`cause`: the run's root
/// cause, perhaps another node's failure).
pub(super) fn decided(
    mut r: Reporting,
    restart: bool,
    restarts: Restarts,
    cause: Option<RootCause>,
    cx: &mut Cx<'_>,
) -> Phase {
    if restart && restarts.failures <= r.plan.restarts_failures {
        // Not the workers' own failure: say what closed the generation (the re-form follows
        // the decision that the loss of a node caused).
        r.decided = Some((restarts, cx.now + REFORM_REASON_WAIT));
        return if r.reform.is_some() {
            concluded(r, cx)
        } else {
            Phase::Reporting(r)
        };
    }
    if restart {
        cx.log(
            Level::Warn,
            None,
            format!(
                "{}; restarting the worker group ({}/{} restarts used)",
                r.description, restarts.failures, cx.p.max_restarts
            ),
        );
        return rejoin(r.plan, cx);
    }
    end(r, restarts.history, cause, AgentExit::WorkerFailure, cx)
}

/// A re-form without spending the budget, its reason known (or waited for long enough).
pub(super) fn concluded(r: Reporting, cx: &mut Cx<'_>) -> Phase {
    let used = r.decided.as_ref().map_or(0, |(d, _)| d.failures);
    cx.log(
        Level::Warn,
        None,
        format!(
            "{}; re-forming the group: {}; the restart budget is not spent ({used}/{} used)",
            r.description,
            r.reform.as_deref().unwrap_or("a membership change"),
            cx.p.max_restarts
        ),
    );
    rejoin(r.plan, cx)
}

/// The session announced a re-form: why the generation closed.
pub(super) fn reform(mut r: Reporting, reason: String, cx: &mut Cx<'_>) -> Phase {
    r.reform = Some(reason);
    if r.decided.is_some() {
        concluded(r, cx)
    } else {
        Phase::Reporting(r)
    }
}

/// Fenced while reporting: a fence by the rendezvous, or by the link of a node cut off from its
/// peers as well (`rdzv::grpc::CUT_OFF`: the others gave it up), means the group went on without
/// this node (its failure is moot; it joins again as a newcomer); a rendezvous unreachable while
/// the peers answer leaves the failure undecided.
pub(super) fn fenced(r: Reporting, reason: String, cx: &mut Cx<'_>) -> Phase {
    if r.decided.is_some() {
        return Phase::Reporting(r);
    }
    if reason.starts_with(crate::rdzv::grpc::UNREACHABLE) {
        return unreported(r, Some(reason), cx);
    }
    cx.log(
        Level::Warn,
        None,
        format!(
            "{}; fenced while reporting it: {reason}; the group went on without this node: joining again",
            r.description
        ),
    );
    rejoin(r.plan, cx)
}

/// No decision will come (`why`: the rendezvous trouble, appended after the failure, which
/// stays the primary error): nothing restarts. With the rendezvous lost the restart budget was
/// never consulted, so the exit is 3 (rendezvous failed: a requeue may rejoin), not 1 (budget
/// spent: an operator's failure policy ends the job on it).
pub(super) fn unreported(r: Reporting, why: Option<String>, cx: &mut Cx<'_>) -> Phase {
    if r.decided.is_some() {
        return Phase::Reporting(r);
    }
    let exit = match why {
        Some(e) => {
            cx.fx.push(Effect::Also(format!(
                "could not report the failure to the rendezvous: {e}"
            )));
            AgentExit::Rendezvous
        }
        None => AgentExit::WorkerFailure,
    };
    end(r, Vec::new(), None, exit, cx)
}

/// The session said the run ended while this node's failure waits for its decision: the
/// decision still comes first when it comes (it carries the failure history), so the end is
/// kept for [`closed`].
pub(super) fn run_ended(mut r: Reporting, end: RunEnd) -> Phase {
    r.ended = Some(Box::new(end));
    Phase::Reporting(r)
}

/// The session closed while reporting. Closed unanswered after the run ended, the end is the
/// decision: a run another node's failure ended names that node's root cause.
pub(super) fn closed(mut r: Reporting, cx: &mut Cx<'_>) -> Phase {
    if r.decided.is_some() {
        return concluded(r, cx);
    }
    match r.ended.take() {
        Some(end) if end.retryable => unreported(r, Some(end.reason.clone()), cx),
        // Every node succeeded after all (this report was of a generation the others left).
        Some(end) if end.success => super::moves::run_ended(&end, cx),
        Some(end) => self::end(r, Vec::new(), end.root_cause, AgentExit::WorkerFailure, cx),
        None => unreported(r, None, cx),
    }
}

/// The run ends with this failure: the summary, its one line or the loop's error; `exit` (1
/// when the job decided, 3 when the rendezvous was lost before it could). When another node's
/// failure ended the run first (`cause`), its summary follows this node's.
fn end(
    r: Reporting,
    history: Vec<String>,
    cause: Option<RootCause>,
    exit: AgentExit,
    cx: &mut Cx<'_>,
) -> Phase {
    match r.ending {
        Ending::Summary => cx.fx.push(Effect::Summarize(history)),
        Ending::Line => cx.fx.push(Effect::Say(format!("drun: {}", r.description))),
        Ending::Fatal => return Phase::Done(End::Fatal),
    }
    if let Some(c) = cause.filter(|c| c.node != cx.p.node_id) {
        cx.fx.push(Effect::RemoteCause(c));
    }
    Phase::Done(End::Exit(exit))
}
