//! An agent whose stream ended without a leave (server-side sessions).

use super::*;

fn server() -> Params {
    Params {
        renews_itself: false,
        ..params()
    }
}

fn on_server(s: Session, input: Input, now: Instant) -> (Session, Vec<Effect>, String) {
    step(s, input, now, &server())
}

fn abandoned(at: Option<Instant>, gone: bool, held: bool) -> Session {
    Session {
        last_gen: 3,
        ..session(Phase::Abandoned(Abandoned {
            lease: LEASE,
            at,
            gone,
            held,
        }))
    }
}

fn speaks(speaks: bool, run_silent_ms: u64) -> Input {
    Input::Speaks(Ok((speaks, Some(Duration::from_millis(run_silent_ms)))))
}

#[test]
fn an_agent_side_session_ends_with_its_agents_stream() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), Input::RequestsClosed, t0);
    assert!(s.phase.is_left());
    assert!(fx.is_empty());
    assert!(!s.reads_requests());
}

#[test]
fn an_abandoned_agents_probe_port_is_knocked_on_within_the_reconnect_grace() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(running(t0), Input::RequestsClosed, t0);
    assert_eq!(s, abandoned(Some(ms(t0, 1000)), false, false));
    assert_eq!(fx, vec![Effect::Knock]);
    assert!(!s.reads_requests(), "the stream is over");
    assert_eq!(s.wake_at(), Some(ms(t0, 1000)));
}

#[test]
fn a_server_session_without_a_lease_ends_with_its_agents_stream() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, fx, _) = on_server(s, Input::RequestsClosed, t0);
    assert!(s.phase.is_left());
    assert!(fx.is_empty());
}

#[test]
fn a_closed_probe_port_cuts_the_grace_short() {
    let t0 = Instant::now();
    let s = abandoned(Some(ms(t0, 1000)), false, false);
    let (s, fx, _) = on_server(s, Input::Knocked(Knock::Gone), ms(t0, 20));
    assert_eq!(s, abandoned(None, true, false));
    assert_eq!(fx, vec![Effect::CheckSpeaks { lease: LEASE }]);
}

#[test]
fn no_answer_to_the_knock_waits_out_the_grace() {
    let t0 = Instant::now();
    let s = abandoned(Some(ms(t0, 1000)), false, false);
    let (s, fx, _) = on_server(s, Input::Knocked(Knock::NoAnswer), ms(t0, 1000));
    assert!(fx.is_empty());
    let (s2, fx, _) = on_server(s.clone(), Input::Tick, ms(t0, 999));
    assert_eq!((s2, fx), (s.clone(), vec![]));
    let (s, fx, _) = on_server(s, Input::Tick, ms(t0, 1000));
    assert_eq!(fx, vec![Effect::CheckSpeaks { lease: LEASE }]);
    assert_eq!(s.wake_at(), None, "one look at a time");
}

#[test]
fn an_agent_that_came_back_elsewhere_keeps_its_lease() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, true, false), speaks(false, 0), t0);
    assert!(s.phase.is_left());
    assert_eq!(s.lease, Some(LEASE), "not revoked");
    assert!(fx.is_empty());
}

#[test]
fn a_gone_agents_lease_is_revoked_at_once() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, true, false), speaks(true, 0), t0);
    assert!(s.phase.is_left());
    assert_eq!(s.lease, None);
    assert!(matches!(
        &fx[..],
        [Effect::RevokeAbandoned { lease: LEASE, why }] if why.contains("process is gone")
    ));
}

#[test]
fn an_agent_that_did_not_come_back_while_its_run_talks_loses_its_lease() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, false, false), speaks(true, 200), t0);
    assert!(s.phase.is_left());
    assert!(matches!(
        &fx[..],
        [Effect::RevokeAbandoned { lease: LEASE, why }] if why.contains("did not come back within 1 s")
    ));
}

#[test]
fn a_server_that_hears_nobody_of_the_run_holds_the_lease_and_says_so_once() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, false, false), speaks(true, 6000), t0);
    assert_eq!(s, abandoned(Some(ms(t0, 1000)), false, true));
    assert!(matches!(&fx[..], [Effect::Warn(line)] if line.contains("holding its lease")));
    let (s, fx, _) = on_server(s, Input::Tick, ms(t0, 1000));
    assert_eq!(fx, vec![Effect::CheckSpeaks { lease: LEASE }]);
    let (s, fx, _) = on_server(s, speaks(true, 7000), ms(t0, 1000));
    assert!(fx.is_empty(), "said once");
    assert_eq!(s, abandoned(Some(ms(t0, 2000)), false, true));
}

#[test]
fn a_held_lease_gets_a_grace_to_come_back_once_the_run_is_heard_again() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, false, true), speaks(true, 100), t0);
    assert!(fx.is_empty());
    assert_eq!(s, abandoned(Some(ms(t0, 5000)), false, false));
    let (s, _, _) = on_server(s, Input::Tick, ms(t0, 5000));
    let (s, fx, _) = on_server(s, speaks(true, 100), ms(t0, 5000));
    assert!(s.phase.is_left());
    assert!(matches!(&fx[..], [Effect::RevokeAbandoned { .. }]));
}

#[test]
fn a_look_the_store_refused_ends_the_abandoned_session() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(
        abandoned(None, false, false),
        Input::Speaks(Err(down())),
        t0,
    );
    assert!(s.phase.is_left());
    assert_eq!(
        fx,
        vec![Effect::Emit(Event::Error("store unavailable".into()))]
    );
}

#[test]
fn a_lease_lost_while_abandoned_ends_the_session_quietly() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(
        abandoned(Some(ms(t0, 1000)), false, false),
        Input::LeaseLost((LEASE, "expired".into())),
        t0,
    );
    assert!(s.phase.is_left());
    assert_eq!(s.lease, None);
    assert_eq!(fx, vec![Effect::StopKeeper]);
}

#[test]
fn a_knock_or_a_look_after_the_session_moved_on_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(running(t0), Input::Knocked(Knock::Gone), t0);
    assert_eq!((s, fx), (running(t0), vec![]));
    let (s, fx, _) = on_server(running(t0), speaks(true, 0), t0);
    assert_eq!((s, fx), (running(t0), vec![]));
}
