//! The lease: lost, stale, released, and as opening and store work left it.

use super::*;

#[test]
fn the_current_lease_lost_fences_a_running_node() {
    let t0 = Instant::now();
    let (s, fx, why) = run(running(t0), Input::LeaseLost((LEASE, "expired".into())), t0);
    assert_eq!(
        s.phase,
        Phase::Fenced {
            reason: "expired".into()
        }
    );
    assert_eq!(s.lease, None);
    assert_eq!(s.last_gen, 3, "the next world must be newer");
    assert_eq!(
        fx,
        vec![
            Effect::StopKeeper,
            Effect::Emit(Event::Fenced("expired".into()))
        ]
    );
    assert_eq!(why, "expired");
}

#[test]
fn a_stale_keepers_report_changes_nothing() {
    let t0 = Instant::now();
    let (s, fx, why) = run(running(t0), Input::LeaseLost((0x99, "old".into())), t0);
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
    assert!(why.contains("earlier join"), "{why}");
}

#[test]
fn a_lease_lost_during_a_retry_fences_at_once_and_drops_the_retry() {
    let t0 = Instant::now();
    let s = Session {
        retry: Some(Retry {
            what: Attempt::Request(Request::Succeeded(3)),
            tries: 4,
            at: ms(t0, 500),
        }),
        ..running(t0)
    };
    let (s, _, _) = run(s, Input::LeaseLost((LEASE, "gone".into())), ms(t0, 100));
    assert_eq!(s.retry, None);
    assert!(matches!(s.phase, Phase::Fenced { .. }));
    assert!(s.reads_requests());
}

#[test]
fn a_lease_lost_while_waiting_fences() {
    let t0 = Instant::now();
    let (s, _, _) = run(waiting(t0), Input::LeaseLost((LEASE, "gone".into())), t0);
    assert!(matches!(s.phase, Phase::Fenced { .. }));
}

#[test]
fn a_lost_lease_after_a_release_fences_nobody() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s2, fx, _) = run(s.clone(), Input::LeaseLost((LEASE, "gone".into())), t0);
    assert_eq!((s2, fx), (s, vec![]));
}

fn opened(phase: Option<Phase>, last_gen: u64) -> Input {
    Input::Opened(Opened { phase, last_gen })
}

#[test]
fn a_session_opens_in_the_phase_its_opening_found() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let (s, fx, why) = run(
        Session::default(),
        opened(Some(Phase::Running(view.clone())), 3),
        t0,
    );
    assert_eq!((s.phase, s.last_gen, fx), (Phase::Running(view), 3, vec![]));
    assert!(why.contains("opens in generation 3"), "{why}");
}

#[test]
fn a_session_opened_after_the_run_ended_is_over() {
    let t0 = Instant::now();
    let (s, fx, _) = run(Session::default(), opened(None, 0), t0);
    assert_eq!((s.phase, fx), (Phase::Left, vec![]));
}

#[test]
fn a_session_that_opens_fenced_keeps_the_newer_last_generation_and_says_nothing_twice() {
    let t0 = Instant::now();
    let fenced = Phase::Fenced {
        reason: "lease 0x51 expired while reconnecting".into(),
    };
    let s = Session {
        lease: None,
        ..session(Phase::Idle)
    };
    // Opening told the agent already: no second Fenced event.
    let (s, fx, why) = run(s, opened(Some(fenced.clone()), 7), t0);
    assert_eq!((s.phase, s.last_gen, fx), (fenced, 7, vec![]));
    assert!(why.contains("opens fenced"), "{why}");
}

#[test]
fn an_opening_never_lowers_the_last_generation() {
    let t0 = Instant::now();
    let s = Session {
        last_gen: 5,
        ..Session::default()
    };
    let (s, _, _) = run(s, opened(Some(Phase::Idle), 2), t0);
    assert_eq!((s.phase, s.last_gen), (Phase::Idle, 5));
}

#[test]
fn a_lease_granted_by_store_work_is_held_and_the_phase_waits_for_the_outcome() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..session(Phase::Fenced {
            reason: "gone".into(),
        })
    };
    let (s, fx, why) = run(s, Input::Leased(LeaseChange::Granted(0x77)), t0);
    assert_eq!(s.lease, Some(0x77));
    assert!(matches!(s.phase, Phase::Fenced { .. }), "{:?}", s.phase);
    assert!(fx.is_empty());
    assert!(why.contains("0x77"), "{why}");
}

#[test]
fn a_lease_released_by_store_work_is_held_no_more() {
    let t0 = Instant::now();
    let (s, fx, _) = run(waiting(t0), Input::Leased(LeaseChange::Released), t0);
    assert_eq!((s.lease, fx), (None, vec![]));
    assert!(s.phase.is_waiting());
}

#[test]
fn a_lease_regranted_mid_join_replaces_the_old_one() {
    let t0 = Instant::now();
    let (s, _, _) = run(idle(), Input::Leased(LeaseChange::Granted(0x99)), t0);
    assert_eq!(s.lease, Some(0x99));
}

#[test]
fn a_lease_lost_right_after_its_grant_fences_with_the_new_lease() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, _, _) = run(s, Input::Leased(LeaseChange::Granted(0x99)), t0);
    let (s, fx, _) = run(s, Input::LeaseLost((0x99, "lease expired".into())), t0);
    assert_eq!(s.lease, None);
    assert!(matches!(s.phase, Phase::Fenced { .. }), "{:?}", s.phase);
    assert!(fx.contains(&Effect::StopKeeper), "{fx:?}");
}

#[test]
fn a_fence_found_by_a_request_tells_the_agent_and_drops_the_lease() {
    let t0 = Instant::now();
    let reason = "partitioned from its peers: node 1 hears nobody".to_string();
    let fenced = Phase::Fenced {
        reason: reason.clone(),
    };
    let what = Attempt::Request(Request::Report {
        kind: ReportKind::Peers,
        json: "{}".into(),
    });
    let (s, fx, why) = run(running(t0), tried(what, 0, Ok(Some(fenced.clone()))), t0);
    assert_eq!((s.phase, s.lease), (fenced, None));
    assert_eq!(
        fx,
        vec![Effect::StopKeeper, Effect::Emit(Event::Fenced(reason))]
    );
    assert!(why.starts_with("fenced: partitioned"), "{why}");
}

#[test]
fn a_fence_found_entering_a_generation_tells_the_agent() {
    let t0 = Instant::now();
    let reason = "lease lost before joining generation 3".to_string();
    let what = Attempt::Enter {
        plan: plan(3, &["a", "b"]),
        before: None,
        announce: true,
    };
    let (s, fx, _) = run(
        idle(),
        tried(
            what,
            0,
            Ok(Some(Phase::Fenced {
                reason: reason.clone(),
            })),
        ),
        t0,
    );
    assert!(matches!(s.phase, Phase::Fenced { .. }));
    assert!(fx.contains(&Effect::Emit(Event::Fenced(reason))), "{fx:?}");
}

#[test]
fn a_node_given_up_while_the_effects_ran_hears_it_once() {
    let t0 = Instant::now();
    let reason = "given up: its agent did not answer".to_string();
    let fenced = Phase::Fenced {
        reason: reason.clone(),
    };
    let (s, fx, _) = run(
        idle(),
        executed(running_view(t0, true), false, Ok(Some(fenced.clone()))),
        t0,
    );
    assert_eq!((s.phase, s.lease), (fenced, None));
    let told = fx
        .iter()
        .filter(|e| matches!(e, Effect::Emit(Event::Fenced(_))))
        .count();
    assert_eq!(told, 1, "{fx:?}");
}
