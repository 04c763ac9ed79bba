//! The round's decision while the node waits, and the round's lines.

use super::*;

#[test]
fn a_formed_plan_enters_its_generation_and_announces_it() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, _) = run(waiting(t0), Input::Decided(Decided::Plan(p.clone())), t0);
    assert_eq!(s.last_gen, 3);
    assert_eq!(s.phase, Phase::Idle, "the entry's outcome sets the phase");
    assert_eq!(tries_of(&fx), vec![(enter(p, true), 0)]);
}

#[test]
fn a_run_that_ended_while_waiting_releases_the_lease_and_reports_the_end() {
    let t0 = Instant::now();
    let (s, fx, _) = run(waiting(t0), Input::Decided(Decided::RunFinished), t0);
    assert_eq!(s.lease, None);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(fx, vec![Effect::Release(LEASE), Effect::ReportFinished]);
}

#[test]
fn a_run_that_ended_while_waiting_without_a_lease_releases_nothing() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..waiting(t0)
    };
    let (_, fx, _) = run(s, Input::Decided(Decided::RunFinished), t0);
    assert_eq!(fx, vec![Effect::ReportFinished]);
}

#[test]
fn a_store_error_while_waiting_joins_again_after_a_pause() {
    let t0 = Instant::now();
    let (s, fx, why) = run(
        waiting(t0),
        Input::Decided(Decided::StoreError("etcd down".into())),
        ms(t0, 40),
    );
    assert!(fx.is_empty(), "nothing at once");
    assert!(why.contains("etcd down"), "{why}");
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        s.retry,
        Some(Retry {
            what: Attempt::Join(join("a")),
            tries: 1,
            at: ms(t0, 40) + RETRY_PAUSE
        })
    );
    assert_eq!(s.wake_at(), Some(ms(t0, 540)));
    assert!(
        !s.reads_requests() && !s.reads_round(),
        "requests wait behind it"
    );
}

#[test]
fn a_store_error_while_waiting_without_a_lease_is_the_agents_error() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..waiting(t0)
    };
    let (s, fx, _) = run(s, Input::Decided(Decided::StoreError("down".into())), t0);
    assert_eq!(s.retry, None);
    assert_eq!(fx, vec![Effect::Emit(Event::Error("down".into()))]);
}

#[test]
fn a_failed_round_releases_the_lease_and_tells_the_agent() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        waiting(t0),
        Input::Decided(Decided::Failed("join timeout".into())),
        t0,
    );
    assert_eq!(s.lease, None);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        fx,
        vec![
            Effect::Release(LEASE),
            Effect::Emit(Event::Error("join timeout".into()))
        ]
    );
}

#[test]
fn a_decision_nobody_waits_for_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        running(t0),
        Input::Decided(Decided::Plan(plan(4, &["a"]))),
        t0,
    );
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
}

#[test]
fn a_line_of_the_round_reaches_the_agent_while_waiting() {
    let t0 = Instant::now();
    let line = "1/2 nodes joined (min 2), waiting for 1 more";
    let (s, fx, _) = run(waiting(t0), Input::Progress(line.into()), ms(t0, 300));
    assert_eq!(s, waiting(t0), "a line changes nothing");
    assert_eq!(fx, vec![Effect::Emit(Event::Waiting(line.into()))]);
}

#[test]
fn a_line_of_the_round_after_the_node_left_it_is_dropped() {
    let t0 = Instant::now();
    for s in [idle(), running(t0)] {
        let (after, fx, _) = run(s.clone(), Input::Progress("2/2 nodes joined".into()), t0);
        assert_eq!(after, s);
        assert!(fx.is_empty(), "{fx:?}");
    }
}
