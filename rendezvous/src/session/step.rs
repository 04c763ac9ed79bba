//! The session's transitions: [`step`], a pure function of (state, input, now, params)
//! returning the next state, the effects for the driver (`actor.rs`) to carry out and a reason
//! a human can read. Every [`Input`] is matched here, exhaustively; a running generation's
//! inputs go on to the generation core ([`generation::step`]). Retries are decided here: a
//! store operation that failed transiently becomes a [`Retry`] with its deadline in the state,
//! and the driver only sleeps until [`Session::wake_at`]. Two concerns have a file of their
//! own: an abandoned agent (`step/abandoned.rs`) and a worker failure's attribution and
//! budget (`step/failure.rs`).

use tokio::time::Instant;

use super::generation::{self, Running};
use super::keeper::Lost;
use super::protocol::{Event, Request};
use super::standby::{self, Look, Seen};
use super::state::{
    Attempt, Attribution, Decided, Effect, Failure, Input, LeaseChange, Opened, Params, Phase,
    Read, Retry, Session, REQUEST_TRIES, RETRY_PAUSE,
};
use super::verdicts;

/// One transition: the session after `input` at `now`, what the driver must do, and why
/// (empty: nothing worth saying).
pub(crate) fn step(
    mut s: Session,
    input: Input,
    now: Instant,
    p: &Params,
) -> (Session, Vec<Effect>, String) {
    let mut fx = Vec::new();
    let reason = match input {
        Input::Opened(o) => on_opened(&mut s, o),
        Input::Leased(change) => on_leased(&mut s, change),
        Input::Request(req) => on_request(&mut s, req, now, p, &mut fx),
        Input::RequestsClosed => abandoned::on_closed(&mut s, now, p, &mut fx),
        Input::Knocked(k) => abandoned::on_knocked(&mut s, k, &mut fx),
        Input::Speaks(r) => abandoned::on_speaks(&mut s, r, now, p, &mut fx),
        Input::Decided(d) => on_decided(&mut s, d, now, &mut fx),
        Input::Progress(line) => on_progress(&s, line, &mut fx),
        Input::Watch(ev) => on_generation(&mut s, ev, now, p, &mut fx),
        Input::WatchBroke => match std::mem::take(&mut s.phase) {
            Phase::Running(run) => {
                let g = run.generation();
                fx.push(rewatch(run));
                format!("the watch of generation {g} broke; watching it again")
            }
            other => {
                s.phase = other;
                String::new()
            }
        },
        Input::LeaseLost(lost) => on_lost(&mut s, lost, &mut fx),
        Input::Tick => on_tick(&mut s, now, p, &mut fx),
        Input::Tried {
            what,
            tries,
            result,
        } => on_tried(&mut s, what, tries, result, now, p, &mut fx),
        Input::Budgeted {
            spending,
            tries,
            result,
        } => failure::on_budget(&mut s, spending, tries, result, now, p, &mut fx),
        Input::Executed {
            run,
            ends,
            result,
            read,
        } => on_executed(&mut s, *run, ends, result, read, now, p, &mut fx),
        Input::Seen(seen) => on_seen(&mut s, seen, now, p, &mut fx),
        Input::Looked {
            attribution,
            tries,
            result,
        } => failure::on_looked(&mut s, attribution, tries, result, now, &mut fx),
    };
    (s, fx, reason)
}

/// The session opened: its first phase (none: the run had ended, the session ends) and the
/// last generation the agent came from.
fn on_opened(s: &mut Session, o: Opened) -> String {
    s.last_gen = s.last_gen.max(o.last_gen);
    match o.phase {
        Some(phase) => {
            let why = match &phase {
                Phase::Fenced { reason } => format!("the session opens fenced: {reason}"),
                Phase::Running(run) => format!(
                    "the session opens in generation {}, taken over from the reconnecting agent",
                    run.generation()
                ),
                Phase::Waiting { .. } => {
                    "the session opens waiting in the round, taken over from the reconnecting agent"
                        .into()
                }
                _ => String::new(),
            };
            s.phase = phase;
            why
        }
        None => {
            s.phase = Phase::Left;
            "the run had ended before the session opened".into()
        }
    }
}

/// Store work changed the lease: the session holds what it left (a grant, or none).
fn on_leased(s: &mut Session, change: LeaseChange) -> String {
    s.lease = change.held();
    match change {
        LeaseChange::Granted(l) => format!("holding lease {l:#x}"),
        LeaseChange::Released => "the lease is given up".into(),
    }
}

/// Store work left the session in `next`: fenced from inside the work (the lease was found
/// gone, or the node was given up or sent away) goes through [`fence`], which tells the agent.
fn go_to(s: &mut Session, next: Phase, fx: &mut Vec<Effect>) -> String {
    match next {
        Phase::Fenced { reason } => {
            fence(s, reason.clone(), fx);
            format!("fenced: {reason}")
        }
        next => {
            s.phase = next;
            String::new()
        }
    }
}

/// An agent's request. Keep-alives, stand-bys and duplicate joins are decided here; the rest
/// is store work for the driver.
fn on_request(
    s: &mut Session,
    req: Request,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    match req {
        Request::Join(_, after)
            if verdicts::join_is_duplicate(
                s.phase.is_waiting(),
                s.phase.running_generation(),
                after,
            ) =>
        {
            format!("a duplicate join (after generation {after}) is ignored")
        }
        // Noted by the forwarder in `spawn_session`; the keeper task renews. It may be the
        // answer to a ping (`silence`).
        Request::KeepAlive => match &mut s.phase {
            Phase::Running(run) => {
                generation::step(run, generation::Input::AgentHeard, now, &p.rules).reason
            }
            _ => String::new(),
        },
        // A repeat while standing by, or a stale one once the node joined again: nothing.
        Request::StandBy(g) if s.phase.can_stand_by() => {
            s.phase = Phase::StandingBy {
                at: now,
                told: None,
            };
            format!("the agent stands by after generation {g}")
        }
        Request::StandBy(_) => String::new(),
        // A worker failure: first, is it a lost member's doing (`crate::decisions::loss`)?
        Request::Failed {
            generation,
            description,
            cause,
        } => {
            fx.push(Effect::Try {
                what: Attempt::Attribute(Attribution {
                    generation,
                    description,
                    cause,
                    until: now + crate::decisions::loss::ATTRIBUTION_WINDOW,
                    knocked: false,
                }),
                tries: 0,
            });
            format!("a worker failure of generation {generation}: looking for a lost member first")
        }
        req @ (Request::Join(..)
        | Request::Succeeded(_)
        | Request::Leave
        | Request::Unfit { .. }
        | Request::Preempt { .. }
        | Request::Commit { .. }
        | Request::Report { .. }
        | Request::MarkBad { .. }) => {
            fx.push(Effect::Try {
                what: Attempt::Request(req),
                tries: 0,
            });
            String::new()
        }
    }
}

/// The round's progress reaches the agent while this node waits in it. A line read after the
/// round decided (the driver reads the round's lines before its decision) or after the node
/// left the round is dropped: the plan, the end or the fence says more.
fn on_progress(s: &Session, line: String, fx: &mut Vec<Effect>) -> String {
    if s.phase.is_waiting() {
        fx.push(Effect::Emit(Event::Waiting(line)));
    }
    String::new()
}

/// The round this node waited in decided.
fn on_decided(s: &mut Session, d: Decided, now: Instant, fx: &mut Vec<Effect>) -> String {
    let join = match std::mem::take(&mut s.phase) {
        Phase::Waiting { join, .. } => join,
        other => {
            // A decision nobody waits for any more (the driver drops the round when it
            // leaves the waiting phase).
            s.phase = other;
            return String::new();
        }
    };
    match d {
        Decided::Plan(plan) => {
            s.last_gen = plan.generation;
            let why = format!("generation {} formed with this node", plan.generation);
            fx.push(Effect::Try {
                what: Attempt::Enter {
                    plan,
                    before: None,
                    announce: true,
                },
                tries: 0,
            });
            why
        }
        Decided::RunFinished => {
            // A standby (or a late joiner) of a run that ended: the agent ends as a joiner of
            // a finished run does.
            release(s, fx);
            fx.push(Effect::ReportFinished);
            "the run ended while this node waited".into()
        }
        Decided::StoreError(e) if s.lease.is_some() => {
            s.retry = Some(Retry {
                what: Attempt::Join(join),
                tries: 1,
                at: now + RETRY_PAUSE,
            });
            format!("rendezvous store error while waiting ({e}); joining again shortly")
        }
        Decided::StoreError(e) | Decided::Failed(e) => {
            release(s, fx);
            fx.push(Effect::Emit(Event::Error(e.clone())));
            format!("the round failed: {e}")
        }
    }
}

/// A node whose round failed (join timeout, refused) is no candidate any more: its lease, and
/// with it its waiting key, goes now — not once its agent's connection closes and the
/// reconnect grace passes, during which a node arriving would form a group with it.
fn release(s: &mut Session, fx: &mut Vec<Effect>) {
    if let Some(l) = s.lease.take() {
        fx.push(Effect::Release(l));
    }
}

/// An input of the running generation, judged by the generation core.
fn on_generation(
    s: &mut Session,
    ev: generation::Input,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    let Phase::Running(run) = &mut s.phase else {
        return String::new();
    };
    let step = generation::step(run, ev, now, &p.rules);
    if !step.effects.is_empty() || step.ends {
        fx.push(Effect::Generation {
            effects: step.effects,
            ends: step.ends,
        });
    }
    step.reason
}

/// The keeper lost `lease`: fence when it is the current one (a stale keeper's report is
/// not). A pending retry goes with the membership: fencing stays bounded by the TTL.
fn on_lost(s: &mut Session, (lease, reason): Lost, fx: &mut Vec<Effect>) -> String {
    if !verdicts::fences(s.lease, lease) {
        return format!("lease {lease:#x} of an earlier join was lost: {reason}");
    }
    if let Phase::Abandoned(_) = s.phase {
        // Nobody to tell, nothing left to revoke.
        s.lease = None;
        s.phase = Phase::Left;
        fx.push(Effect::StopKeeper);
        return format!("the abandoned agent's {reason}");
    }
    fence(s, reason.clone(), fx);
    reason
}

/// The lease is gone: stop renewing it, tell the agent, drop what was pending.
fn fence(s: &mut Session, reason: String, fx: &mut Vec<Effect>) {
    s.lease = None;
    s.retry = None;
    fx.push(Effect::StopKeeper);
    fx.push(Effect::Emit(Event::Fenced(reason.clone())));
    if !s.phase.is_left() {
        s.phase = Phase::Fenced { reason };
    }
}

/// Time passed: a due retry is tried; otherwise the phase's deadlines.
fn on_tick(s: &mut Session, now: Instant, p: &Params, fx: &mut Vec<Effect>) -> String {
    if let Some(r) = s.retry.take() {
        if r.at > now {
            s.retry = Some(r);
            return String::new();
        }
        fx.push(Effect::Try {
            what: r.what,
            tries: r.tries,
        });
        return format!("trying again (try {})", r.tries + 1);
    }
    match &s.phase {
        Phase::Running(_) => on_generation(s, generation::Input::Tick, now, p, fx),
        Phase::StandingBy { at, .. } if *at <= now => {
            fx.push(Effect::Look);
            String::new()
        }
        Phase::Abandoned(a) if a.at.is_some_and(|at| at <= now) => {
            let lease = a.lease;
            if let Phase::Abandoned(a) = &mut s.phase {
                a.at = None;
            }
            fx.push(Effect::CheckSpeaks { lease });
            String::new()
        }
        Phase::StandingBy { .. }
        | Phase::Abandoned(_)
        | Phase::Idle
        | Phase::Waiting { .. }
        | Phase::Fenced { .. }
        | Phase::Left => String::new(),
    }
}

/// The driver tried `what`. A request is tried up to [`REQUEST_TRIES`] times; entering a
/// generation again after its watch broke, for as long as the lease lasts; a join after the
/// store failed in the round, once.
fn on_tried(
    s: &mut Session,
    what: Attempt,
    tries: u32,
    result: Result<Option<Phase>, Failure>,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    let failure = match result {
        Ok(next) => return next.map(|n| go_to(s, n, fx)).unwrap_or_default(),
        Err(f) => f,
    };
    let again = |s: &mut Session, what: Attempt| {
        s.retry = Some(Retry {
            what,
            tries: tries + 1,
            at: now + RETRY_PAUSE,
        });
    };
    match what {
        Attempt::Request(req) if failure.transient && tries + 1 < REQUEST_TRIES => {
            let why = format!(
                "store unavailable ({}); retrying the request {req:?}",
                failure.message
            );
            again(s, Attempt::Request(req));
            why
        }
        Attempt::Request(_) => end(s, failure.message, fx),
        // The store failed before the agent heard the plan (the driver hands back an entry
        // that got as far as telling it as `announce: false`): the next try still tells it.
        // Retrying without the announcement left the session in the generation and its agent
        // waiting for a plan it was never sent (chaos seed 1, an etcd leader killed while
        // the members of a re-form wrote their membership keys).
        Attempt::Enter {
            plan,
            announce: true,
            ..
        } if failure.transient => {
            s.phase = Phase::Idle;
            let g = plan.generation;
            if s.lease.is_none() {
                return format!(
                    "store unavailable entering generation {g} ({}) and the lease is gone",
                    failure.message
                );
            }
            // After a pause, from the driver's loop: a lease lost meanwhile fences first.
            again(
                s,
                Attempt::Enter {
                    plan,
                    before: None,
                    announce: true,
                },
            );
            format!(
                "store unavailable entering generation {g} ({}); entering it again shortly",
                failure.message
            )
        }
        Attempt::Enter { announce: true, .. } => end(s, failure.message, fx),
        Attempt::Enter {
            plan,
            before,
            announce: false,
        } if failure.transient && s.lease.is_some() => {
            let why = format!(
                "store unavailable ({}); retrying the watch",
                failure.message
            );
            s.phase = Phase::Idle;
            again(
                s,
                Attempt::Enter {
                    plan,
                    before,
                    announce: false,
                },
            );
            why
        }
        Attempt::Enter { .. } => {
            s.phase = Phase::Idle;
            fx.push(Effect::Emit(Event::Error(failure.message.clone())));
            format!("cannot watch the generation: {}", failure.message)
        }
        Attempt::Join(_) => {
            s.phase = Phase::Idle;
            format!("joining again failed: {}", failure.message)
        }
        Attempt::Attribute(a) => failure::on_looked(s, a, tries, Err(failure), now, fx),
        Attempt::Budget { spending, .. } => {
            failure::on_budget(s, spending, tries, Err(failure), now, p, fx)
        }
    }
}

/// The driver carried out the generation core's effects on `run`. A store that did not
/// answer re-watches the generation; a node given up meanwhile is fenced; a read the core
/// judges goes to it, and what it decides is carried out before the rest; a generation that
/// ended leaves the session idle.
// The step's own arguments and the input's fields: one call site.
#[allow(clippy::too_many_arguments)]
fn on_executed(
    s: &mut Session,
    run: Running,
    ends: bool,
    result: Result<Option<Phase>, Failure>,
    read: Option<Read>,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    match result {
        Err(f) if f.transient => {
            let g = run.generation();
            s.phase = Phase::Idle;
            fx.push(rewatch(run));
            format!(
                "store error while watching generation {g} ({}); re-watching",
                f.message
            )
        }
        Err(f) => end(s, f.message, fx),
        Ok(Some(next)) => go_to(s, next, fx),
        Ok(None) => match read {
            Some(read) => judge(s, run, ends, read, now, p, fx),
            None if ends || s.lease.is_none() => {
                s.phase = Phase::Idle;
                String::new()
            }
            None => {
                s.phase = Phase::Running(run);
                String::new()
            }
        },
    }
}

/// The generation core judges what one of its effects read; its decision, then the rest of
/// the effects, are carried out next. What it says goes to the operator
/// ([`Effect::Note`]).
fn judge(
    s: &mut Session,
    mut run: Running,
    ends: bool,
    read: Read,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    let g = run.generation();
    let step = generation::step(&mut run, read.input, now, &p.rules);
    s.phase = Phase::Running(run);
    if !step.reason.is_empty() {
        fx.push(Effect::Note {
            generation: g,
            line: step.reason,
        });
    }
    let mut effects = step.effects;
    effects.extend(read.rest);
    let ends = ends || step.ends;
    if !effects.is_empty() || ends {
        fx.push(Effect::Generation { effects, ends });
    }
    String::new()
}

/// What a standing-by node's session read of the run: tell the agent what changed, look again
/// in [`standby::LOOK_EVERY`]; a store that did not answer is asked again then.
fn on_seen(
    s: &mut Session,
    seen: Result<Seen, Failure>,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    let told = match std::mem::take(&mut s.phase) {
        Phase::StandingBy { told, .. } => told,
        other => {
            // A look the session no longer stands by for (it joined again).
            s.phase = other;
            return String::new();
        }
    };
    let at = now + standby::LOOK_EVERY;
    let seen = match seen {
        Ok(seen) => seen,
        Err(e) => {
            s.phase = Phase::StandingBy { at, told };
            return format!(
                "cannot look at the run for a standing-by node: {}",
                e.message
            );
        }
    };
    let look = standby::look(&p.node, seen);
    if told.as_ref() != Some(&look) {
        match &look {
            Look::Ended(end) => {
                fx.push(Effect::Emit(Event::Finished(end.clone())));
                return format!("the run ended while this node stood by: {}", end.reason);
            }
            Look::Reach(reach) => fx.push(Effect::Emit(Event::StandBy(reach.clone()))),
        }
    }
    s.phase = Phase::StandingBy {
        at,
        told: Some(look),
    };
    String::new()
}

mod abandoned;
mod ends;
mod failure;

use ends::end;
#[cfg(test)]
mod tests;

/// Enters `run`'s generation again (its watch broke): the same plan, quietly, keeping what the
/// running generation knew.
fn rewatch(run: Running) -> Effect {
    Effect::Try {
        what: Attempt::Enter {
            plan: run.plan.clone(),
            before: Some(Box::new(run)),
            announce: false,
        },
        tries: 0,
    }
}
