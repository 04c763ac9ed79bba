//! The agent's requests: tried, duplicated, answered.

use super::*;

#[test]
fn a_join_while_idle_is_tried_once_at_once() {
    let t0 = Instant::now();
    let (s, fx, _) = run(idle(), request(Request::Join(join("a"), 2)), t0);
    assert_eq!(s, idle());
    assert_eq!(
        fx,
        vec![Effect::Try {
            what: Attempt::Request(Request::Join(join("a"), 2)),
            tries: 0
        }]
    );
}

#[test]
fn a_join_while_waiting_is_a_duplicate() {
    let t0 = Instant::now();
    let (s, fx, why) = run(waiting(t0), request(Request::Join(join("a"), 2)), ms(t0, 5));
    assert_eq!(s, waiting(t0));
    assert!(fx.is_empty());
    assert!(why.contains("duplicate"), "{why}");
}

#[test]
fn a_join_after_an_older_generation_than_the_running_one_is_a_duplicate() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), request(Request::Join(join("a"), 2)), t0);
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
}

#[test]
fn a_join_after_the_running_generation_is_tried() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), request(Request::Join(join("a"), 3)), t0);
    assert!(
        s.phase.is_running(),
        "the phase changes only with the try's outcome"
    );
    assert_eq!(tries_of(&fx).len(), 1);
}

#[test]
fn a_fenced_node_joins_again() {
    let t0 = Instant::now();
    let fenced = Session {
        lease: None,
        ..session(Phase::Fenced {
            reason: "lease expired".into(),
        })
    };
    let (_, fx, _) = run(fenced, request(Request::Join(join("a"), 3)), t0);
    assert_eq!(tries_of(&fx).len(), 1);
}

#[test]
fn a_keep_alive_while_idle_changes_nothing() {
    let t0 = Instant::now();
    let (s, fx, why) = run(idle(), request(Request::KeepAlive), t0);
    assert_eq!((s, fx, why), (idle(), vec![], String::new()));
}

#[test]
fn a_keep_alive_while_running_answers_a_pending_ping() {
    let t0 = Instant::now();
    let accused = generation::Input::Accused {
        accused: "a".into(),
        by: "b".into(),
        still: true,
    };
    let (s, fx, _) = run(running(t0), Input::Watch(accused), t0);
    assert_eq!(
        fx,
        vec![Effect::Generation {
            effects: vec![generation::Effect::Ping],
            ends: false
        }]
    );
    assert!(s.wake_at().is_some(), "the ping's wait is a deadline");
    let (s, fx, why) = run(s, request(Request::KeepAlive), ms(t0, 120));
    assert!(fx.is_empty());
    assert!(why.contains("answered after 120 ms"), "{why}");
    assert_eq!(s.wake_at(), None, "nothing left to wait for");
}

#[test]
fn a_stand_by_from_idle_looks_at_the_run_at_once() {
    let t0 = Instant::now();
    let (s, fx, _) = run(idle(), request(Request::StandBy(3)), t0);
    assert_eq!(s.phase, Phase::StandingBy { at: t0, told: None });
    assert!(fx.is_empty());
    assert_eq!(s.wake_at(), Some(t0));
}

#[test]
fn a_fenced_node_sent_away_stands_by() {
    let t0 = Instant::now();
    let fenced = session(Phase::Fenced {
        reason: "partitioned from its peers".into(),
    });
    let (s, _, _) = run(fenced, request(Request::StandBy(3)), t0);
    assert!(matches!(s.phase, Phase::StandingBy { at, .. } if at == t0));
}

#[test]
fn a_stale_stand_by_while_running_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), request(Request::StandBy(2)), t0);
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
}

#[test]
fn a_repeated_stand_by_keeps_the_next_look() {
    let t0 = Instant::now();
    let standing = session(Phase::StandingBy {
        at: ms(t0, 800),
        told: None,
    });
    let (s, fx, _) = run(standing.clone(), request(Request::StandBy(3)), t0);
    assert_eq!(s, standing);
    assert!(fx.is_empty());
}

#[test]
fn every_request_with_store_work_is_tried_as_it_comes() {
    let t0 = Instant::now();
    let requests = [
        Request::Succeeded(3),
        Request::Leave,
        Request::Preempt {
            generation: 3,
            reason: "SIGTERM".into(),
        },
        Request::Report {
            kind: ReportKind::Peers,
            json: "{}".into(),
        },
        Request::MarkBad {
            generation: 3,
            id: "m1".into(),
            reason: "digest".into(),
        },
    ];
    for r in requests {
        let (s, fx, _) = run(running(t0), request(r.clone()), t0);
        assert_eq!(s, running(t0), "{r:?}");
        assert_eq!(tries_of(&fx), vec![(Attempt::Request(r), 0)]);
    }
}
