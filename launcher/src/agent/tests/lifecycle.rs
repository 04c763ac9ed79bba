//! Forming, fences, re-forms, signals and the stop sequence.

#[allow(unused_imports)]
use super::*;

#[test]
fn a_plan_is_verified_then_its_workers_spawned() {
    let mut t = T::new();
    assert_eq!(
        t.ev(Event::Waiting("waiting for 1 more node".into())).len(),
        1
    );
    let fx = t.ev(Event::Formed(plan(1, 1, 0)));
    assert_eq!(fx, vec![Effect::Formed(Box::new(plan(1, 1, 0)))]);
    assert!(matches!(t.phase(), Phase::Verifying { .. }));
    assert_eq!(
        t.feed(Input::Verified(Checked::Use(None))),
        vec![Effect::Spawn(None)]
    );
    assert!(t.feed(Input::Spawned).is_empty());
    assert!(matches!(
        t.phase(),
        Phase::Running {
            save: Save::Idle,
            ..
        }
    ));
    // Progress lines are for forming only.
    assert!(t.ev(Event::Waiting("late".into())).is_empty());
}

#[test]
fn a_reform_stops_the_workers_gently_and_joins_again() {
    let mut t = T::running(1, 2);
    let fx = t.ev(Event::Reform {
        generation: 1,
        reason: "node n2 joined".into(),
    });
    assert!(logged(&fx, "re-forming the group: node n2 joined"));
    assert_eq!(fx.last(), Some(&Effect::Stop(Signal::SIGTERM)));
    // Events wait while stopping.
    assert!(!t.machine().reads_session());
    // The agent lives on with its staged checkpoints: the stop does not wait for the disk.
    assert!(!t.machine().end_waits_for_disk());
    assert_eq!(
        t.workers_gone(None),
        vec![Effect::Join {
            fresh: true,
            after: 1
        }]
    );
    let clock = t.machine().clock.expect("a restart is timed");
    assert_eq!(clock.stopped, Some(t.now));
}

#[test]
fn a_fence_while_running_kills_the_workers_and_joins_again() {
    let mut t = T::running(3, 2);
    assert!(
        t.machine().end_waits_for_disk(),
        "workers that end by themselves may end the run"
    );
    let fx = t.ev(Event::Fenced("lease lost".into()));
    assert!(!t.machine().end_waits_for_disk());
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Log(Level::Error, Some(3), _))));
    assert_eq!(fx.last(), Some(&Effect::Stop(Signal::SIGKILL)));
    assert_eq!(
        t.workers_gone(None),
        vec![Effect::Join {
            fresh: true,
            after: 3
        }]
    );
}

#[test]
fn a_fence_while_stopping_changes_nothing() {
    let mut t = T::running(1, 2);
    t.feed(Input::Signal(Signal::SIGTERM));
    assert!(t.ev(Event::Fenced("lease lost".into())).is_empty());
    assert!(t.ev(Event::Error("etcd is gone".into())).is_empty());
    assert!(t.feed(Input::SessionClosed).is_empty());
    assert!(matches!(t.phase(), Phase::Stopping(s) if s.then == Then::Exit(Signal::SIGTERM)));
    assert!(
        t.machine().end_waits_for_disk(),
        "an agent that exits persists its staged checkpoints first"
    );
}

#[test]
fn a_handled_signal_is_forwarded_once_then_the_agent_exits_128_plus_n() {
    let mut t = T::running(1, 1);
    let fx = t.feed(Input::Signal(Signal::SIGTERM));
    assert_eq!(fx.last(), Some(&Effect::Stop(Signal::SIGTERM)));
    let fx = t.feed(Input::Signal(Signal::SIGTERM));
    assert!(!fx
        .iter()
        .any(|e| matches!(e, Effect::Stop(_) | Effect::Relay(_) | Effect::Kill)));
    assert!(t.workers_gone(None).is_empty());
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Signal(15))));
}

#[test]
fn a_second_sigint_kills_at_once() {
    let mut t = T::running(1, 1);
    t.feed(Input::Signal(Signal::SIGINT));
    let fx = t.feed(Input::Signal(Signal::SIGINT));
    assert!(logged(&fx, "second SIGINT"));
    assert_eq!(fx.last(), Some(&Effect::Kill));
    assert!(
        matches!(t.phase(), Phase::Stopping(s) if matches!(s.stage, StopStage::Killing { .. }))
    );
}

#[test]
fn usr1_and_usr2_are_relayed_and_never_tear_down() {
    let mut t = T::running(1, 1);
    t.p.preempt_signal = None;
    let fx = t.feed(Input::Signal(Signal::SIGUSR2));
    assert_eq!(fx.last(), Some(&Effect::Relay(Signal::SIGUSR2)));
    let fx = t.feed(Input::Signal(Signal::SIGUSR1));
    assert_eq!(fx.last(), Some(&Effect::Relay(Signal::SIGUSR1)));
    assert!(matches!(t.phase(), Phase::Running { .. }));
    // Before workers start there is nobody to relay to.
    let mut t = T::new();
    let fx = t.feed(Input::Signal(Signal::SIGUSR2));
    assert!(logged(&fx, "nothing to relay"));
    assert!(matches!(t.phase(), Phase::Forming { .. }));
}

#[test]
fn ctrl_z_stops_the_workers_then_the_agent_and_sigcont_resumes_them() {
    let mut t = T::running(1, 1);
    let fx = t.feed(Input::Signal(Signal::SIGTSTP));
    let tail: Vec<_> = fx.iter().rev().take(2).rev().cloned().collect();
    assert_eq!(
        tail,
        vec![Effect::Relay(Signal::SIGSTOP), Effect::SuspendSelf]
    );
    assert!(logged(&fx, "suspended (SIGTSTP)"));
    let fx = t.feed(Input::Signal(Signal::SIGCONT));
    assert_eq!(fx.last(), Some(&Effect::Relay(Signal::SIGCONT)));
    assert!(logged(&fx, "resumed (SIGCONT)"));
    // A SIGCONT with no Ctrl-Z before it (scancel's, before its SIGTERM) is relayed quietly.
    let fx = t.feed(Input::Signal(Signal::SIGCONT));
    assert_eq!(fx, vec![Effect::Relay(Signal::SIGCONT)]);
    // Neither tears anything down.
    assert!(matches!(t.phase(), Phase::Running { .. }));
    // While forming, the agent still stops itself (nothing to relay to).
    let mut t = T::new();
    let fx = t.feed(Input::Signal(Signal::SIGTSTP));
    assert_eq!(fx.last(), Some(&Effect::SuspendSelf));
    assert!(matches!(t.phase(), Phase::Forming { .. }));
}

#[test]
fn a_signal_while_forming_exits_at_once() {
    let mut t = T::new();
    let fx = t.feed(Input::Signal(Signal::SIGINT));
    // One line says why the agent ends (it exited silently before); nothing else happens.
    assert!(
        matches!(&fx[..], [Effect::Log(_, _, line)] if line.contains("received SIGINT before workers started")),
        "{fx:?}"
    );
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Signal(2))));
}

#[test]
fn a_stop_timeout_sends_sigkill_then_gives_up_waiting() {
    let mut t = T::running(1, 1);
    t.ev(Event::Reform {
        generation: 1,
        reason: "x".into(),
    });
    assert!(t.after(GRACE - Duration::from_millis(1)).is_empty());
    let fx = t.after(Duration::from_millis(1));
    assert!(logged(&fx, "sending SIGKILL"));
    assert_eq!(fx.last(), Some(&Effect::Kill));
    assert_eq!(t.after(KILL_WAIT), vec![Effect::Cleanup]);
    assert_eq!(
        t.feed(Input::Stopped {
            failure: None,
            cause: None
        }),
        vec![Effect::Join {
            fresh: true,
            after: 1
        }]
    );
}

#[test]
fn a_run_that_ended_before_this_node_joined_is_an_error() {
    let mut t = T::new();
    t.ev(Event::Finished(end(true)));
    assert_eq!(t.done(), Some(&End::RunFinished(end(true))));
}

#[test]
fn a_fence_while_forming_joins_again_with_the_same_candidate_after_a_pause() {
    let mut t = T::new();
    let fx = t.ev(Event::Fenced("lease expired".into()));
    assert!(logged(&fx, "joining again as a new member"));
    assert!(t.after(REJOIN_PAUSE / 2).is_empty());
    assert_eq!(
        t.after(REJOIN_PAUSE),
        vec![Effect::Join {
            fresh: false,
            after: 0
        }]
    );
}

#[test]
fn a_node_forming_again_keeps_the_generation_it_was_last_part_of() {
    assert_eq!(T::new().machine().plan(), None, "never part of one");
    let mut t = T::running(3, 2);
    t.ev(Event::Reform {
        generation: 3,
        reason: "node n2 joined".into(),
    });
    t.workers_gone(None);
    assert!(matches!(t.phase(), Phase::Forming { .. }));
    // The peer probes still report on generation 3 until the next plan.
    assert_eq!(t.machine().plan().map(|p| p.generation), Some(3));
    // Fenced while forming: the Join after the pause still says "after 3".
    t.ev(Event::Fenced("lease expired".into()));
    assert_eq!(
        t.after(REJOIN_PAUSE),
        vec![Effect::Join {
            fresh: false,
            after: 3
        }]
    );
    assert_eq!(t.machine().plan().map(|p| p.generation), Some(3));
    // Part of a generation before: the run's end is its outcome, not an error.
    t.ev(Event::Finished(end(true)));
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Success)));
}

/// The workers of a formed generation could not start: a failure of this node.
fn unstarted(t: &mut T) {
    t.ev(Event::Formed(plan(1, 2, 0)));
    t.feed(Input::Verified(Checked::Use(None)));
    assert_eq!(
        t.feed(Input::SpawnFailed(
            "cannot start worker: x not found".into()
        )),
        vec![Effect::Stop(Signal::SIGKILL)]
    );
    assert_eq!(
        t.workers_gone(None),
        vec![Effect::Send(Request::Failed {
            generation: 1,
            description: "cannot start worker: x not found (node n0)".into(),
            cause: None,
        })]
    );
}

#[test]
fn workers_that_cannot_start_are_reported_and_the_error_ends_the_agent() {
    let mut t = T::new();
    unstarted(&mut t);
    let fx = t.ev(Event::FailureDecision {
        restart: false,
        restarts: restarts(0, &["generation 1: cannot start worker"]),
        cause: None,
    });
    assert!(fx.is_empty(), "the loop prints its error: {fx:?}");
    assert_eq!(t.done(), Some(&End::Fatal));
}

#[test]
fn workers_that_cannot_start_restart_with_budget_left() {
    let mut t = T::new();
    unstarted(&mut t);
    let fx = t.ev(Event::FailureDecision {
        restart: true,
        restarts: restarts(1, &["generation 1: cannot start worker"]),
        cause: None,
    });
    assert!(logged(&fx, "restarting the worker group"), "{fx:?}");
    assert!(matches!(
        t.phase(),
        Phase::Forming {
            rejoin_at: None,
            ..
        }
    ));
}

#[test]
fn a_signal_during_a_gentle_stop_wins_over_the_rejoin() {
    let mut t = T::running(1, 2);
    t.ev(Event::Reform {
        generation: 1,
        reason: "x".into(),
    });
    t.feed(Input::Signal(Signal::SIGTERM));
    assert!(t.workers_gone(None).is_empty());
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Signal(15))));
}
