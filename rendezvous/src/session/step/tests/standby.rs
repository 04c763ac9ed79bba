//! A node standing by.

use super::*;

fn standing(t0: Instant, told: Option<Look>) -> Session {
    session(Phase::StandingBy { at: t0, told })
}

fn seen_waiting(ids: &[&str]) -> Seen {
    Seen {
        waiting: ids.iter().map(|id| cand(id, 7)).collect(),
        ..Seen::default()
    }
}

fn reach(id: &str) -> Reach {
    Reach {
        node_id: id.into(),
        advertise_addr: "127.0.0.1".into(),
        probe_port: 7,
    }
}

#[test]
fn a_standing_by_node_is_told_whom_to_reach_and_looks_again_in_a_second() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        standing(t0, None),
        Input::Seen(Ok(seen_waiting(&["b"]))),
        t0,
    );
    assert_eq!(fx, vec![Effect::Emit(Event::StandBy(vec![reach("b")]))]);
    assert_eq!(
        s.phase,
        Phase::StandingBy {
            at: ms(t0, 1000),
            told: Some(Look::Reach(vec![reach("b")]))
        }
    );
}

#[test]
fn a_standing_by_node_is_not_told_the_same_twice() {
    let t0 = Instant::now();
    let told = Some(Look::Reach(vec![reach("b")]));
    let (s, fx, _) = run(
        standing(t0, told.clone()),
        Input::Seen(Ok(seen_waiting(&["a", "b"]))),
        t0,
    );
    assert!(fx.is_empty(), "itself is nobody to reach");
    assert_eq!(
        s.phase,
        Phase::StandingBy {
            at: ms(t0, 1000),
            told
        }
    );
}

#[test]
fn a_standing_by_node_is_told_when_whom_to_reach_changes() {
    let t0 = Instant::now();
    let told = Some(Look::Reach(vec![reach("b")]));
    let (_, fx, _) = run(standing(t0, told), Input::Seen(Ok(seen_waiting(&[]))), t0);
    assert_eq!(fx, vec![Effect::Emit(Event::StandBy(vec![]))], "join now");
}

#[test]
fn a_standing_by_node_of_a_run_that_ended_is_told_and_stops_looking() {
    let t0 = Instant::now();
    let seen = Seen {
        finished: Some(end("done")),
        ..Seen::default()
    };
    let (s, fx, _) = run(standing(t0, None), Input::Seen(Ok(seen)), t0);
    assert_eq!(fx, vec![Effect::Emit(Event::Finished(end("done")))]);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(s.wake_at(), None);
}

#[test]
fn a_look_the_store_did_not_answer_is_asked_again_at_the_next_look() {
    let t0 = Instant::now();
    let told = Some(Look::Reach(vec![]));
    let (s, fx, why) = run(
        standing(t0, told.clone()),
        Input::Seen(Err(Failure {
            transient: true,
            message: "down".into(),
        })),
        ms(t0, 3),
    );
    assert!(fx.is_empty());
    assert!(why.contains("down"));
    assert_eq!(
        s.phase,
        Phase::StandingBy {
            at: ms(t0, 1003),
            told
        }
    );
}

#[test]
fn a_look_after_the_node_joined_again_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = run(waiting(t0), Input::Seen(Ok(seen_waiting(&["b"]))), t0);
    assert_eq!((s, fx), (waiting(t0), vec![]));
}
