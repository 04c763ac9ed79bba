//! The agent's transitions driven by the workers, signals and deadlines: supervision,
//! teardown (grace, SIGKILL, cleanup) and what follows a stop. Pure, like [`super::step()`].

use drun_rendezvous::decisions::root_cause::RootCause;
use drun_rendezvous::session::Request;
use nix::sys::signal::Signal;

use super::failure;
use super::moves::{preempted, rejoin, run_ended, signal_exit, stop, Cx};
use super::state::{
    Effect, Ending, Level, Machine, Phase, StopStage, Stopping, Then, Workers, JOB_CONTROL,
    KILL_WAIT, RELAYED,
};

pub(super) fn on_signal(m: &mut Machine, phase: Phase, sig: Signal, cx: &mut Cx<'_>) -> Phase {
    if JOB_CONTROL.contains(&sig) {
        job_control(m, sig, cx);
        return phase;
    }
    match phase {
        Phase::Running { plan, .. }
            if !RELAYED.contains(&sig) && Some(sig) != cx.p.preempt_signal =>
        {
            m.interrupted.get_or_insert(sig);
            cx.log(
                Level::Warn,
                None,
                format!(
                    "received {}; forwarding it to workers and shutting down",
                    sig.as_str()
                ),
            );
            stop(m, plan, sig, Then::Exit(sig), cx)
        }
        Phase::Running { ref plan, .. } if Some(sig) == cx.p.preempt_signal => {
            let generation = plan.generation;
            let reason = preemption_warning(m, sig, cx);
            cx.fx
                .push(Effect::Send(Request::Preempt { generation, reason }));
            phase
        }
        Phase::Stopping(s) if Some(sig) == cx.p.preempt_signal => {
            // Between two generations (a restart under way, chaos seed 35): the warning is
            // kept and asked of the next generation once its workers run; dropping it would
            // let the job be preempted without its checkpoint.
            preemption_warning(m, sig, cx);
            Phase::Stopping(s)
        }

        Phase::Running { .. } => {
            cx.log(
                Level::Info,
                None,
                format!("relaying {} to workers", sig.as_str()),
            );
            cx.fx.push(Effect::Relay(sig));
            phase
        }
        Phase::Stopping(s) => stopping_signal(m, s, sig, cx),
        Phase::Done(_) => phase,
        _ if Some(sig) == cx.p.preempt_signal => {
            // Not running yet (joining, waiting, reporting a failure, verifying the resume
            // point): asked of the generation once its workers run.
            preemption_warning(m, sig, cx);
            phase
        }
        _ if RELAYED.contains(&sig) => {
            cx.log(
                Level::Info,
                None,
                format!(
                    "received {} before workers started; nothing to relay",
                    sig.as_str()
                ),
            );
            phase
        }
        _ => {
            m.interrupted.get_or_insert(sig);
            cx.log(
                Level::Warn,
                None,
                format!(
                    "received {} before workers started; leaving the rendezvous and exiting",
                    sig.as_str()
                ),
            );
            signal_exit(sig)
        }
    }
}

/// Notes a preemption warning (kept across re-forms until its checkpoint is sealed); returns
/// its reason line.
fn preemption_warning(m: &mut Machine, sig: Signal, cx: &mut Cx<'_>) -> String {
    cx.log(
        Level::Warn,
        None,
        format!(
            "{}: preemption warning; asking every rank of the job for a coordinated checkpoint",
            sig.as_str()
        ),
    );
    let reason = format!(
        "{} (preemption warning) on node {}",
        sig.as_str(),
        cx.p.node_id
    );
    m.preempt_pending.get_or_insert(reason.clone());
    reason
}

/// A signal while stopping: USR1/USR2 are relayed; others were forwarded once already, except
/// that a second SIGINT kills at once.
fn stopping_signal(m: &mut Machine, mut s: Stopping, sig: Signal, cx: &mut Cx<'_>) -> Phase {
    if RELAYED.contains(&sig) {
        cx.fx.push(Effect::Relay(sig));
        return Phase::Stopping(s);
    }
    m.interrupted.get_or_insert(sig);
    if sig == Signal::SIGINT {
        s.sigints += 1;
    }
    if s.sigints >= 2 && matches!(s.stage, StopStage::Grace { .. }) {
        cx.log(Level::Warn, None, "second SIGINT: killing workers now");
        return kill(s, cx);
    }
    cx.log(
        Level::Info,
        None,
        format!(
            "{} received while stopping; already forwarded once",
            sig.as_str()
        ),
    );
    Phase::Stopping(s)
}

fn kill(mut s: Stopping, cx: &mut Cx<'_>) -> Phase {
    cx.log(Level::Warn, None, "workers still running; sending SIGKILL");
    cx.fx.push(Effect::Kill);
    s.stage = StopStage::Killing {
        deadline: cx.now + KILL_WAIT,
    };
    Phase::Stopping(s)
}

fn cleanup(mut s: Stopping, cx: &mut Cx<'_>) -> Phase {
    cx.fx.push(Effect::Cleanup);
    s.stage = StopStage::Cleaning;
    Phase::Stopping(s)
}

pub(super) fn on_workers(m: &mut Machine, phase: Phase, w: Workers, cx: &mut Cx<'_>) -> Phase {
    match phase {
        Phase::Running {
            plan,
            save,
            mut progress,
            ..
        } => {
            for &rank in &w.finished {
                progress.beacons.forget(rank);
            }
            if w.failed {
                return stop(m, plan, Signal::SIGTERM, Then::Report { partial: None }, cx);
            }
            if w.all_succeeded {
                return stop(m, plan, Signal::SIGTERM, Then::AwaitEnd, cx);
            }
            let partial = w
                .first_success
                .map(|(at, line)| (at + cx.p.peer_exit_wait, line));
            partial_due(
                m,
                Phase::Running {
                    plan,
                    save,
                    partial,
                    progress,
                },
                cx,
            )
        }
        Phase::Stopping(s) if !w.running && s.stage != StopStage::Cleaning => cleanup(s, cx),
        other => other,
    }
}

/// A running group whose partial success waited `--peer-exit-wait`: a failure.
fn partial_due(m: &mut Machine, phase: Phase, cx: &mut Cx<'_>) -> Phase {
    match phase {
        Phase::Running {
            plan,
            partial: Some((deadline, line)),
            ..
        } if deadline <= cx.now => {
            let description = format!("partial success on node {}: {line}", cx.p.node_id);
            let then = Then::Report {
                partial: Some(description),
            };
            stop(m, plan, Signal::SIGTERM, then, cx)
        }
        other => other,
    }
}

pub(super) fn on_tick(m: &mut Machine, phase: Phase, cx: &mut Cx<'_>) -> Phase {
    match phase {
        Phase::Forming {
            rejoin_at: Some(at),
            after,
        } if at <= cx.now => {
            cx.fx.push(Effect::Join {
                fresh: false,
                after: after.as_ref().map_or(0, |p| p.generation),
            });
            Phase::Forming {
                rejoin_at: None,
                after,
            }
        }
        p @ Phase::Running { .. } => partial_due(m, p, cx),
        Phase::Stopping(s) => match s.stage {
            StopStage::Grace { deadline } if deadline <= cx.now => kill(s, cx),
            StopStage::Killing { deadline } if deadline <= cx.now => cleanup(s, cx),
            _ => Phase::Stopping(s),
        },
        Phase::Reporting(r) if r.decided.as_ref().is_some_and(|(_, d)| *d <= cx.now) => {
            failure::concluded(r, cx)
        }
        Phase::AwaitingEnd { plan, deadline } if deadline <= cx.now => {
            let description = format!(
                "partial success: the workers of node {} finished, the other nodes' did not within --peer-exit-wait {}",
                cx.p.node_id,
                drun_rendezvous::human::duration(cx.p.peer_exit_wait)
            );
            failure::report(plan, description, None, Ending::Line, cx)
        }
        other => other,
    }
}

pub(super) fn on_stopped(
    m: &mut Machine,
    phase: Phase,
    failure: Option<String>,
    cause: Option<RootCause>,
    cx: &mut Cx<'_>,
) -> Phase {
    let Phase::Stopping(s) = phase else {
        return phase;
    };
    if s.stage != StopStage::Cleaning {
        return Phase::Stopping(s);
    }
    if let Some(c) = m.clock.as_mut() {
        c.stopped.get_or_insert(cx.now);
    }
    let plan = s.plan;
    match s.then {
        // Told to stop itself as well (the whole job is being stopped: scancel, pods deleted):
        // it ends as its signal says, not as a rendezvous failure to retry.
        Then::Finished(end) => {
            return match m.interrupted {
                Some(sig) if end.retryable => signal_exit(sig),
                _ => run_ended(&end, cx),
            }
        }
        Then::Exit(sig) => return signal_exit(sig),
        Then::Preempted => return preempted(&plan, cx),
        Then::AwaitEnd | Then::Rejoin | Then::Report { .. } | Then::ReportUnstarted(_) => {}
    }
    if let Some(sig) = m.interrupted {
        return signal_exit(sig);
    }
    match s.then {
        Then::AwaitEnd => {
            cx.fx.push(Effect::ReleasePort);
            if plan.node_count() > 1 {
                cx.log(
                    Level::Info,
                    Some(plan.generation),
                    "local workers succeeded; waiting for the other nodes",
                );
            }
            cx.fx
                .push(Effect::Send(Request::Succeeded(plan.generation)));
            Phase::AwaitingEnd {
                plan,
                deadline: cx.now + cx.p.peer_exit_wait,
            }
        }
        Then::Report { partial: Some(d) } => failure::report(plan, d, None, Ending::Line, cx),
        Then::Report { partial: None } => {
            let d = failure.unwrap_or_else(|| format!("a worker failed on node {}", cx.p.node_id));
            failure::report(plan, d, cause, Ending::Summary, cx)
        }
        Then::ReportUnstarted(d) => failure::report(plan, d, None, Ending::Fatal, cx),
        _ => rejoin(plan, cx),
    }
}

/// Ctrl-Z (SIGTSTP) stops the workers (SIGSTOP) and then the agent; SIGCONT (`fg`, `bg`) resumes the workers. In
/// any phase: a relay to no running worker does nothing.
fn job_control(m: &mut Machine, sig: Signal, cx: &mut Cx<'_>) {
    if sig == Signal::SIGTSTP {
        m.suspended = true;
        cx.log(
            Level::Info,
            None,
            "suspended (SIGTSTP): workers and agent stopped; fg or SIGCONT resumes them",
        );
        // SIGSTOP, not SIGTSTP: each worker leads a session of its own, an orphaned process
        // group to which the kernel does not deliver the terminal's stop signals.
        cx.fx.push(Effect::Relay(Signal::SIGSTOP));
        cx.fx.push(Effect::SuspendSelf);
    } else {
        if std::mem::take(&mut m.suspended) {
            cx.log(Level::Info, None, "resumed (SIGCONT)");
        }
        cx.fx.push(Effect::Relay(Signal::SIGCONT));
    }
}
