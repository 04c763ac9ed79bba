//! The running generation: its events, the generation core's effects carried out, and what they read.

use super::*;

/// The one store effect of a session that lost sight of its generation: enter it again, at once,
/// with the view it had (and without announcing it a second time).
fn entered_again(view: Running) -> Vec<(Attempt, u32)> {
    vec![(
        Attempt::Enter {
            plan: view.plan.clone(),
            before: Some(Box::new(view)),
            announce: false,
        },
        0,
    )]
}

#[test]
fn a_closed_generation_ends_after_its_reform_is_told() {
    let t0 = Instant::now();
    let closed = generation::Input::Closed("node c left".into());
    let (s, fx, why) = run(running(t0), Input::Watch(closed), t0);
    assert!(why.contains("node c left"));
    assert_eq!(
        fx,
        vec![Effect::Generation {
            effects: vec![generation::Effect::Emit(Event::Reform {
                generation: 3,
                reason: "node c left".into()
            })],
            ends: true
        }]
    );
    assert!(s.phase.is_running(), "until the effects are carried out");
}

#[test]
fn a_watch_event_of_no_use_does_nothing() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), Input::Watch(generation::Input::Other), t0);
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
}

#[test]
fn a_watch_event_while_idle_is_ignored() {
    let t0 = Instant::now();
    let closed = generation::Input::Closed("x".into());
    let (s, fx, _) = run(idle(), Input::Watch(closed), t0);
    assert_eq!((s, fx), (idle(), vec![]));
}

#[test]
fn a_broken_watch_enters_the_generation_again_with_the_view_it_had() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let (s, fx, _) = run(running(t0), Input::WatchBroke, ms(t0, 10));
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(tries_of(&fx), entered_again(view));
}

#[test]
fn a_broken_watch_after_the_generation_ended_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = run(idle(), Input::WatchBroke, t0);
    assert_eq!((s, fx), (idle(), vec![]));
}

#[test]
fn the_successors_start_deadline_is_checked_at_its_tick() {
    let t0 = Instant::now();
    let s = session(Phase::Running(running_view(t0, false)));
    assert_eq!(s.wake_at(), Some(ms(t0, 10_000)));
    let (s, fx, _) = run(s, Input::Tick, ms(t0, 9_999));
    assert!(fx.is_empty(), "not yet");
    let (s, fx, _) = run(s, Input::Tick, ms(t0, 10_000));
    assert!(matches!(
        &fx[..],
        [Effect::Generation { effects, ends: false }]
            if matches!(&effects[..], [generation::Effect::CheckSuccessorStarted { node, .. }] if node == "b")
    ));
    assert_eq!(s.wake_at(), None);
}

#[test]
fn a_generation_that_goes_on_runs_on_with_the_view_the_effects_left() {
    let t0 = Instant::now();
    let mut view = running_view(t0, true);
    view.successor_deadline = Some(ms(t0, 77));
    let (s, fx, _) = run(idle(), executed(view.clone(), false, Ok(None)), t0);
    assert!(fx.is_empty());
    assert_eq!(s.phase, Phase::Running(view));
}

#[test]
fn a_generation_that_ended_leaves_the_session_idle() {
    let t0 = Instant::now();
    let (s, _, _) = run(idle(), executed(running_view(t0, true), true, Ok(None)), t0);
    assert_eq!(s.phase, Phase::Idle);
}

#[test]
fn a_node_given_up_while_the_effects_ran_is_fenced() {
    let t0 = Instant::now();
    let fenced = Phase::Fenced {
        reason: "given up".into(),
    };
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, _, _) = run(
        s,
        executed(running_view(t0, true), false, Ok(Some(fenced.clone()))),
        t0,
    );
    assert_eq!(s.phase, fenced);
}

#[test]
fn a_generation_whose_lease_went_meanwhile_is_left() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, _, _) = run(s, executed(running_view(t0, true), false, Ok(None)), t0);
    assert_eq!(s.phase, Phase::Idle);
}

#[test]
fn an_effect_the_store_did_not_answer_rewatches_the_generation() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let (s, fx, _) = run(idle(), executed(view.clone(), false, Err(down())), t0);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(tries_of(&fx), entered_again(view));
}

#[test]
fn an_effect_refused_by_the_store_ends_the_session() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        idle(),
        executed(running_view(t0, true), false, Err(broken())),
        t0,
    );
    assert!(s.phase.is_left());
    assert_eq!(fx, vec![Effect::Emit(Event::Error("corrupt key".into()))]);
}

fn read_back(
    run: Running,
    ends: bool,
    input: generation::Input,
    rest: Vec<generation::Effect>,
) -> Input {
    Input::Executed {
        run: Box::new(run),
        ends,
        result: Ok(None),
        read: Some(Read { input, rest }),
    }
}

fn pending_scale_up(t0: Instant) -> Running {
    let mut view = running_view(t0, true);
    view.scale_up_requested("d", "ckpt-1".into(), t0, Duration::from_secs(30));
    view
}

#[test]
fn nobody_waiting_any_more_calls_the_scale_up_off_before_the_rest_goes_on() {
    let t0 = Instant::now();
    let read = read_back(
        pending_scale_up(t0),
        false,
        generation::Input::NobodyWaits,
        vec![generation::Effect::Ping],
    );
    let (s, fx, _) = run(idle(), read, ms(t0, 10));
    let Phase::Running(view) = &s.phase else {
        panic!("{:?}", s.phase)
    };
    assert_eq!(view.scale_up, None);
    assert_eq!(
        fx,
        vec![
            Effect::Note {
                generation: 3,
                line: "node d is no longer waiting to join: the scale-up is called off, no re-form"
                    .into()
            },
            Effect::Generation {
                effects: vec![generation::Effect::Ping],
                ends: false
            }
        ]
    );
}

#[test]
fn nobody_waiting_without_a_scale_up_pending_says_nothing() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let read = read_back(view.clone(), false, generation::Input::NobodyWaits, vec![]);
    let (s, fx, _) = run(idle(), read, t0);
    assert_eq!((s.phase, fx), (Phase::Running(view), vec![]));
}

#[test]
fn a_scale_up_save_written_holds_the_newcomer_until_its_deadline() {
    let t0 = Instant::now();
    let read = read_back(
        running_view(t0, true),
        false,
        generation::Input::ScaleUpSaveWritten {
            node: "d".into(),
            latest_before: "ckpt-1".into(),
            limit: Duration::from_secs(30),
        },
        vec![],
    );
    let (s, fx, _) = run(idle(), read, ms(t0, 500));
    let Phase::Running(view) = &s.phase else {
        panic!("{:?}", s.phase)
    };
    let pending = view.scale_up.as_ref().expect("pending");
    assert_eq!(
        (pending.node.as_str(), pending.latest_before.as_str()),
        ("d", "ckpt-1")
    );
    assert_eq!(pending.deadline, ms(t0, 30_500));
    assert!(
        matches!(&fx[..], [Effect::Note { generation: 3, line }] if line.contains("asking every rank for a checkpoint first")),
        "{fx:?}"
    );
}

#[test]
fn an_agent_heard_since_the_ping_keeps_the_node_and_the_rest_goes_on() {
    let t0 = Instant::now();
    let read = read_back(
        running_view(t0, true),
        false,
        generation::Input::AgentHeard,
        vec![generation::Effect::Close("newcomer".into())],
    );
    let (s, fx, _) = run(idle(), read, t0);
    assert!(s.phase.is_running());
    assert_eq!(
        fx.last(),
        Some(&Effect::Generation {
            effects: vec![generation::Effect::Close("newcomer".into())],
            ends: false
        })
    );
}

#[test]
fn a_decided_interval_sets_the_save_clock() {
    let t0 = Instant::now();
    let mut view = running_view(t0, true);
    view.save_clock = Some(crate::session::save_clock::SaveClock::start(t0));
    let read = read_back(
        view.clone(),
        false,
        generation::Input::IntervalDecided(Duration::from_secs(60)),
        vec![],
    );
    let (s, fx, _) = run(idle(), read, ms(t0, 5));
    let mut want = view;
    want.save_clock
        .as_mut()
        .expect("clock")
        .set(Duration::from_secs(60));
    // The clock counts now: without the read it would still be evaluating.
    assert_ne!(
        want.save_clock,
        Some(crate::session::save_clock::SaveClock::start(t0))
    );
    assert_eq!((s.phase, fx), (Phase::Running(want), vec![]));
}

#[test]
fn a_read_of_a_generation_that_ends_still_ends_it_after_the_rest() {
    let t0 = Instant::now();
    let read = read_back(
        running_view(t0, true),
        true,
        generation::Input::NobodyWaits,
        vec![],
    );
    let (s, fx, _) = run(idle(), read, t0);
    assert!(s.phase.is_running());
    assert_eq!(
        fx,
        vec![Effect::Generation {
            effects: vec![],
            ends: true
        }]
    );
}
