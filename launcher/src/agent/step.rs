//! The agent's transitions: [`step`], a pure function of (state, input, now) returning the next
//! state and the effects for the loop to carry out. Every session [`Event`] is matched here,
//! in `on_event`, exhaustively. Imports point one way: `step` → `supervise` → `failure` →
//! `moves` (what they all share).

use drun_rendezvous::session::{Request, RunEnd, SaveRequest};
use drun_rendezvous::{Event, Plan};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::failure;
use super::moves::{exit, preempted, rejoin, run_ended, stop, Cx};
use super::progress;
use super::state::{
    Checked, Effect, End, Input, Level, Machine, Params, Phase, Progress, Save, Then, REJOIN_PAUSE,
};
use super::supervise::{on_signal, on_stopped, on_tick, on_workers};
use crate::AgentExit;

/// One transition: the machine after `input` at `now`, and what the loop must do.
pub fn step(mut m: Machine, input: Input, now: Instant, p: &Params) -> (Machine, Vec<Effect>) {
    let mut cx = Cx {
        now,
        p,
        fx: Vec::new(),
    };
    let phase = std::mem::replace(&mut m.phase, Phase::Done(End::Fatal));
    let snapshot_held =
        matches!(&phase, Phase::Running { progress, .. } if progress.beacons.snapshot_held());
    m.phase = match input {
        Input::Event(ev) => on_event(&mut m, phase, ev, &mut cx),
        Input::SessionClosed => on_closed(&mut m, phase, &mut cx),
        Input::Signal(sig) => on_signal(&mut m, phase, sig, &mut cx),
        Input::Workers(w) => on_workers(&mut m, phase, w, &mut cx),
        Input::Tick => on_tick(&mut m, phase, &mut cx),
        Input::Monitor => {
            if matches!(phase, Phase::Running { .. }) {
                cx.fx.push(Effect::CheckStalled);
            }
            phase
        }
        Input::Verified(v) => on_verified(&mut m, phase, v, &mut cx),
        Input::Spawned => on_spawned(&mut m, phase, &mut cx),
        Input::SpawnFailed(why) => match phase {
            Phase::Verifying { plan, .. } => {
                // A worker failure of this node, like a worker exiting non-zero: the session
                // decides job-wide (restart, or end every node), so no other node waits.
                let d = format!("{why} (node {})", cx.p.node_id);
                stop(
                    &mut m,
                    plan,
                    Signal::SIGKILL,
                    Then::ReportUnstarted(d),
                    &mut cx,
                )
            }
            other => other,
        },
        Input::Hung(line) => match phase {
            Phase::Running { plan, .. } => {
                // A worker failure of this node: the session decides job-wide (one restart of
                // the budget, or the end of the run with this line).
                let then = Then::Report {
                    partial: Some(line),
                };
                stop(&mut m, plan, Signal::SIGTERM, then, &mut cx)
            }
            other => other,
        },
        Input::Beacon { rank, step } => progress::beacon(phase, rank, step, &mut cx),
        Input::HangCheck => progress::hang_check(phase, &mut cx),
        Input::PaceDue => progress::pace_due(phase, &mut cx),
        Input::Stopped { failure, cause } => on_stopped(&mut m, phase, failure, cause, &mut cx),
        Input::Api => {
            cx.fx.push(match &phase {
                Phase::Running { save, .. } => Effect::Serve {
                    should_save: *save != Save::Idle,
                },
                _ => Effect::Refuse,
            });
            phase
        }
    };
    // The group stops in a silence whose flight recorder dumps were taken ahead of a verdict
    // (a hang judged here resets the beacons, and reports its own dumps).
    if snapshot_held && matches!(m.phase, Phase::Stopping(_)) {
        cx.fx.push(Effect::ReportFlightSnapshot);
    }
    (m, cx.fx)
}

/// The one place every session event is handled (no catch-all: a new variant does not compile
/// until it is).
fn on_event(m: &mut Machine, phase: Phase, ev: Event, cx: &mut Cx<'_>) -> Phase {
    match ev {
        Event::Opened { .. } => phase,
        Event::Waiting(line) => {
            if matches!(phase, Phase::Forming { .. }) {
                cx.log(Level::Info, None, line);
            }
            phase
        }
        Event::Formed(plan) => match phase {
            Phase::Forming { .. } => formed(m, plan, cx),
            other => other,
        },
        Event::Reform { reason, .. } => on_reform(m, phase, reason, cx),
        Event::Finished(end) => on_finished(m, phase, end, cx),
        Event::FailureDecision {
            restart,
            restarts,
            cause,
        } => match phase {
            Phase::Reporting(r) if r.decided.is_none() => {
                failure::decided(r, restart, restarts, cause, cx)
            }
            other => other,
        },
        Event::Fenced(reason) => on_fenced(m, phase, reason, cx),
        Event::Error(e) => on_error(m, phase, e, cx),
        Event::SaveRequested(req) => on_save_requested(m, phase, req, cx),
        Event::Sealed(id) => on_sealed(m, phase, id, cx),
        Event::Pace(pace) => progress::job_pace(phase, pace),
        // Answered by the driver (a keep-alive at once); no state changes.
        Event::Ping => phase,
        // Whom a node standing by after a partition must reach: the driver's probes; no state
        // changes.
        Event::StandBy(_) => phase,
        Event::Committed {
            generation,
            step,
            result,
        } => {
            if matches!(phase, Phase::Running { .. }) {
                cx.fx.push(Effect::Committed {
                    generation,
                    step,
                    result,
                });
            }
            phase
        }
    }
}

fn formed(m: &mut Machine, plan: Plan, cx: &mut Cx<'_>) -> Phase {
    if let Some(c) = m.clock.as_mut() {
        c.formed = Some(cx.now);
    }
    let plan = Box::new(plan);
    cx.fx.push(Effect::Formed(plan.clone()));
    Phase::Verifying {
        plan,
        save: Save::Idle,
    }
}

fn on_reform(m: &mut Machine, phase: Phase, reason: String, cx: &mut Cx<'_>) -> Phase {
    match phase {
        Phase::Running { plan, .. } => {
            let gen = Some(plan.generation);
            cx.log(Level::Warn, gen, format!("re-forming the group: {reason}"));
            stop(m, plan, Signal::SIGTERM, Then::Rejoin, cx)
        }
        Phase::Verifying { plan, .. } => {
            let gen = Some(plan.generation);
            cx.log(Level::Warn, gen, format!("re-forming the group: {reason}"));
            rejoin(plan, cx)
        }
        Phase::AwaitingReform { plan } => rejoin(plan, cx),
        Phase::Reporting(r) => failure::reform(r, reason, cx),
        Phase::AwaitingEnd { plan, .. } => {
            cx.log(
                Level::Warn,
                None,
                format!("the group re-forms after this node finished: {reason}"),
            );
            rejoin(plan, cx)
        }
        other @ (Phase::Forming { .. } | Phase::Stopping(_) | Phase::Done(_)) => other,
    }
}

fn on_finished(m: &mut Machine, phase: Phase, end: RunEnd, cx: &mut Cx<'_>) -> Phase {
    match phase {
        Phase::Forming { after: None, .. } => Phase::Done(End::RunFinished(end)),
        Phase::Forming { .. }
        | Phase::Verifying { .. }
        | Phase::AwaitingReform { .. }
        | Phase::AwaitingEnd { .. } => run_ended(&end, cx),
        Phase::Running { plan, .. } => stop(m, plan, Signal::SIGTERM, Then::Finished(end), cx),
        // The decision on the failure comes first (the end of the run follows it).
        Phase::Reporting(r) => failure::run_ended(r, end),
        other @ (Phase::Stopping(_) | Phase::Done(_)) => other,
    }
}

fn on_fenced(m: &mut Machine, phase: Phase, reason: String, cx: &mut Cx<'_>) -> Phase {
    match phase {
        Phase::Forming { after, .. } => {
            cx.log(
                Level::Warn,
                None,
                format!("{reason}; joining again as a new member"),
            );
            Phase::Forming {
                rejoin_at: Some(cx.now + REJOIN_PAUSE),
                after,
            }
        }
        Phase::Verifying { plan, .. } => {
            let gen = Some(plan.generation);
            cx.log(
                Level::Error,
                gen,
                format!("fenced: {reason}; joining again"),
            );
            rejoin(plan, cx)
        }
        Phase::AwaitingReform { plan } => rejoin(plan, cx),
        Phase::Running { plan, .. } => {
            let gen = Some(plan.generation);
            cx.log(
                Level::Error,
                gen,
                format!("fenced: {reason}; killing workers and joining again"),
            );
            stop(m, plan, Signal::SIGKILL, Then::Rejoin, cx)
        }
        Phase::Reporting(r) => failure::fenced(r, reason, cx),
        Phase::AwaitingEnd { plan, .. } => {
            cx.log(
                Level::Warn,
                None,
                format!("fenced after this node finished: {reason}"),
            );
            rejoin(plan, cx)
        }
        other @ (Phase::Stopping(_) | Phase::Done(_)) => other,
    }
}

fn on_error(m: &mut Machine, phase: Phase, e: String, cx: &mut Cx<'_>) -> Phase {
    match phase {
        Phase::Forming { .. } | Phase::AwaitingReform { .. } | Phase::AwaitingEnd { .. } => {
            Phase::Done(End::RendezvousFailed(e))
        }
        p @ (Phase::Verifying { .. } | Phase::Running { .. }) => {
            on_fenced(m, p, format!("rendezvous error: {e}"), cx)
        }
        Phase::Reporting(r) => failure::unreported(r, Some(e), cx),
        other @ (Phase::Stopping(_) | Phase::Done(_)) => other,
    }
}

fn on_closed(m: &mut Machine, phase: Phase, cx: &mut Cx<'_>) -> Phase {
    const ENDED: &str = "the rendezvous session ended";
    match phase {
        Phase::Forming { .. } => Phase::Done(End::SessionEnded),
        p @ (Phase::Verifying { .. } | Phase::Running { .. }) => on_fenced(m, p, ENDED.into(), cx),
        Phase::AwaitingReform { .. } => Phase::Done(End::RendezvousFailed(ENDED.into())),
        Phase::Reporting(r) => failure::closed(r, cx),
        Phase::AwaitingEnd { .. } => exit(AgentExit::Success),
        other @ (Phase::Stopping(_) | Phase::Done(_)) => other,
    }
}

fn on_save_requested(m: &mut Machine, phase: Phase, req: SaveRequest, cx: &mut Cx<'_>) -> Phase {
    let update = |save: Save, m: &mut Machine, cx: &mut Cx<'_>| {
        let line = format!(
            "coordinated checkpoint requested ({}); workers see should_save = true",
            req.reason
        );
        if req.interval {
            // Any pending save serves: the seal of any newer checkpoint ends it. Not logged
            // here: node rank 0's session says once why it asked (one line per save is enough).
            match save {
                Save::Idle => Save::Interval {
                    latest_before: req.latest_before.clone(),
                },
                other => other,
            }
        } else if req.scale_up {
            match save {
                Save::Preempt { .. } => save,
                Save::Idle | Save::ScaleUp { .. } | Save::Interval { .. } => {
                    if save == Save::Idle {
                        cx.log(Level::Info, None, line);
                        // The newcomer waits for its seal (`--scale-up-save-timeout`): a step
                        // staged in memory goes to the disk at full speed.
                        cx.fx.push(Effect::PersistNow);
                    }
                    Save::ScaleUp {
                        latest_before: req.latest_before.clone(),
                    }
                }
            }
        } else {
            if !matches!(save, Save::Preempt { .. }) {
                cx.log(Level::Warn, None, line);
                cx.fx.push(Effect::PersistNow);
            }
            m.preempt_pending.get_or_insert(req.reason.clone());
            Save::Preempt {
                latest_before: req.latest_before.clone(),
            }
        }
    };
    match phase {
        Phase::Verifying { plan, save } => Phase::Verifying {
            plan,
            save: update(save, m, cx),
        },
        Phase::Running {
            plan,
            save,
            partial,
            progress,
        } => Phase::Running {
            plan,
            save: update(save, m, cx),
            partial,
            progress,
        },
        other => other,
    }
}

fn on_sealed(m: &mut Machine, phase: Phase, id: String, cx: &mut Cx<'_>) -> Phase {
    // Said in every phase: the last step of a run is sealed while the workers end (a user
    // found the last sealed step missing from the log).
    let described = drun_rendezvous::ledger::describe_id(&id);
    cx.log(Level::Info, None, format!("checkpoint {described} sealed"));
    let (plan, save, partial) = match phase {
        Phase::Verifying { plan, save } => (plan, save, None),
        Phase::Running {
            plan,
            save,
            partial,
            progress,
        } => (plan, save, Some((partial, progress))),
        other => return other,
    };
    let save = match save {
        Save::Preempt { latest_before } if id > latest_before => {
            cx.fx.push(Effect::Say(format!(
                "drun: preempted: checkpoint {described} sealed; stopping the workers (exit 5: requeue to resume from it)"
            )));
            return match partial {
                Some(_) => stop(m, plan, Signal::SIGTERM, Then::Preempted, cx),
                None => preempted(&plan, cx),
            };
        }
        Save::ScaleUp { latest_before } | Save::Interval { latest_before }
            if id > latest_before =>
        {
            Save::Idle
        }
        other => other,
    };
    match partial {
        Some((partial, progress)) => Phase::Running {
            plan,
            save,
            partial,
            progress,
        },
        None => Phase::Verifying { plan, save },
    }
}

fn on_verified(m: &mut Machine, phase: Phase, v: Checked, cx: &mut Cx<'_>) -> Phase {
    let Phase::Verifying { plan, save } = phase else {
        return phase;
    };
    match v {
        Checked::Use(file) => {
            cx.fx.push(Effect::Spawn(file));
            Phase::Verifying { plan, save }
        }
        Checked::Bad { id, reason } => {
            cx.fx.push(Effect::Send(Request::MarkBad {
                generation: plan.generation,
                id,
                reason,
            }));
            Phase::AwaitingReform { plan }
        }
        Checked::Refuse(mark_bad) => {
            if let Some((id, reason)) = mark_bad {
                cx.fx.push(Effect::Send(Request::MarkBad {
                    generation: plan.generation,
                    id,
                    reason,
                }));
            }
            let _ = m;
            Phase::Done(End::Fatal)
        }
    }
}

fn on_spawned(m: &mut Machine, phase: Phase, cx: &mut Cx<'_>) -> Phase {
    let Phase::Verifying { plan, save } = phase else {
        return phase;
    };
    if let Some(c) = m.clock.take() {
        let line = c.line(plan.generation, cx.now);
        cx.log(Level::Info, Some(plan.generation), line);
    }
    if let Some(reason) = &m.preempt_pending {
        // A preemption warning outlives a re-form that came before its checkpoint: the new
        // generation is asked again (once per generation; any member may ask).
        cx.fx.push(Effect::Send(Request::Preempt {
            generation: plan.generation,
            reason: reason.clone(),
        }));
    }
    Phase::Running {
        plan,
        save,
        partial: None,
        progress: Progress::new(cx.p),
    }
}
