//! Retries and the clock, and what the store work's outcomes do to the phase.

use super::*;

#[test]
fn a_retry_is_not_tried_before_its_deadline() {
    let t0 = Instant::now();
    let s = Session {
        retry: Some(Retry {
            what: Attempt::Join(join("a")),
            tries: 1,
            at: ms(t0, 500),
        }),
        ..idle()
    };
    let (s2, fx, _) = run(s.clone(), Input::Tick, ms(t0, 499));
    assert_eq!((s2, fx), (s, vec![]));
}

#[test]
fn a_due_retry_is_tried_with_its_count() {
    let t0 = Instant::now();
    let s = Session {
        retry: Some(Retry {
            what: Attempt::Join(join("a")),
            tries: 1,
            at: ms(t0, 500),
        }),
        ..idle()
    };
    let (s, fx, _) = run(s, Input::Tick, ms(t0, 500));
    assert_eq!(s.retry, None);
    assert_eq!(tries_of(&fx), vec![(Attempt::Join(join("a")), 1)]);
}

#[test]
fn a_due_look_of_a_standing_by_node_reads_the_run() {
    let t0 = Instant::now();
    let s = session(Phase::StandingBy { at: t0, told: None });
    let (s2, fx, _) = run(s.clone(), Input::Tick, t0);
    assert_eq!((s2, fx), (s, vec![Effect::Look]));
}

#[test]
fn a_standing_by_node_does_not_look_before_its_time() {
    let t0 = Instant::now();
    let s = session(Phase::StandingBy {
        at: ms(t0, 1000),
        told: None,
    });
    let (_, fx, _) = run(s, Input::Tick, ms(t0, 999));
    assert!(fx.is_empty());
}

#[test]
fn a_tick_while_idle_or_waiting_does_nothing() {
    let t0 = Instant::now();
    for s in [idle(), waiting(t0)] {
        let (s2, fx, _) = run(s.clone(), Input::Tick, ms(t0, 60_000));
        assert_eq!((s2, fx), (s, vec![]));
    }
}

#[test]
fn a_request_the_store_did_not_answer_is_tried_again_after_a_pause() {
    let t0 = Instant::now();
    let what = Attempt::Request(Request::Succeeded(3));
    let (s, fx, why) = run(running(t0), tried(what.clone(), 0, Err(down())), t0);
    assert!(fx.is_empty());
    assert!(why.contains("retrying the request"), "{why}");
    assert!(s.phase.is_running(), "the phase stays");
    assert_eq!(
        s.retry,
        Some(Retry {
            what,
            tries: 1,
            at: t0 + RETRY_PAUSE
        })
    );
    assert!(
        !s.reads_requests(),
        "the next request waits behind this one"
    );
}

#[test]
fn a_request_is_given_up_after_twenty_tries_about_ten_seconds() {
    let t0 = Instant::now();
    let what = Attempt::Request(Request::Succeeded(3));
    let mut s = running(t0);
    let mut now = t0;
    let mut tries = 0;
    let mut fx = tries_of(&[Effect::Try {
        what: what.clone(),
        tries: 0,
    }]);
    while let Some((w, n)) = fx.pop() {
        tries += 1;
        let (s2, effects, _) = run(s, tried(w, n, Err(down())), now);
        s = s2;
        if let Some(r) = &s.retry {
            now = r.at;
            let (s2, effects, _) = run(s, Input::Tick, now);
            s = s2;
            fx = tries_of(&effects);
        } else {
            assert_eq!(
                effects,
                vec![Effect::Emit(Event::Error("store unavailable".into()))]
            );
        }
    }
    assert_eq!(tries, REQUEST_TRIES);
    assert_eq!(now - t0, RETRY_PAUSE * (REQUEST_TRIES - 1));
    assert!(s.phase.is_left(), "the session ends with the error");
}

#[test]
fn a_request_refused_by_the_store_ends_the_session() {
    let t0 = Instant::now();
    let what = Attempt::Request(Request::Succeeded(3));
    let (s, fx, _) = run(running(t0), tried(what, 0, Err(broken())), t0);
    assert!(s.phase.is_left());
    assert_eq!(fx, vec![Effect::Emit(Event::Error("corrupt key".into()))]);
}

#[test]
fn a_request_that_went_through_keeps_or_replaces_the_phase() {
    let t0 = Instant::now();
    let what = Attempt::Request(Request::Succeeded(3));
    let (s, fx, _) = run(running(t0), tried(what, 0, Ok(None)), t0);
    assert_eq!((s, fx), (running(t0), vec![]));
    let what = Attempt::Request(Request::Join(join("a"), 3));
    let next = Phase::Waiting {
        join: join("a"),
        since: t0,
    };
    let (s, _, _) = run(idle(), tried(what, 0, Ok(Some(next.clone()))), t0);
    assert_eq!(s.phase, next);
}

#[test]
fn a_leave_that_went_through_ends_the_session() {
    let t0 = Instant::now();
    let (s, _, _) = run(
        running(t0),
        tried(Attempt::Request(Request::Leave), 0, Ok(Some(Phase::Left))),
        t0,
    );
    assert!(s.phase.is_left());
    assert!(!s.reads_requests());
}

/// The store failed before the agent heard the plan (an etcd leader killed while the members
/// of a re-form wrote their membership keys): the next try still tells it. It used to retry
/// without telling, and the agent waited for a plan it was never sent (chaos seed 1).
#[test]
fn a_first_entry_the_store_did_not_answer_before_the_agent_heard_the_plan_still_tells_it() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, why) = run(idle(), tried(enter(p.clone(), true), 0, Err(down())), t0);
    assert!(fx.is_empty(), "after a pause: {fx:?}");
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        s.retry,
        Some(Retry {
            what: enter(p, true),
            tries: 1,
            at: t0 + RETRY_PAUSE
        })
    );
    assert!(why.contains("entering generation 3"), "{why}");
}

/// A try that told the agent before the store failed comes back as an entry without the
/// announcement (the driver's part): the next try only watches, the agent hears it once.
#[test]
fn a_first_entry_that_failed_after_the_agent_heard_the_plan_only_watches_again() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, _) = run(idle(), tried(enter(p.clone(), false), 0, Err(down())), t0);
    assert!(fx.is_empty());
    assert_eq!(s.retry.map(|r| r.what), Some(enter(p, false)));
}

#[test]
fn a_first_entry_the_store_did_not_answer_without_a_lease_goes_idle() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, fx, _) = run(s, tried(enter(plan(3, &["a"]), true), 0, Err(down())), t0);
    assert_eq!((s.phase, s.retry), (Phase::Idle, None));
    assert!(fx.is_empty(), "{fx:?}");
}

#[test]
fn a_first_entry_refused_by_the_store_ends_the_session() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, _, _) = run(idle(), tried(enter(p, true), 0, Err(broken())), t0);
    assert!(s.phase.is_left());
}

#[test]
fn a_rewatch_is_tried_again_for_as_long_as_the_lease_lasts() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, _) = run(idle(), tried(enter(p.clone(), false), 57, Err(down())), t0);
    assert!(fx.is_empty());
    assert_eq!(
        s.retry,
        Some(Retry {
            what: enter(p, false),
            tries: 58,
            at: t0 + RETRY_PAUSE
        })
    );
}

#[test]
fn a_rewatch_without_a_lease_is_the_agents_error() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, fx, _) = run(s, tried(enter(p, false), 0, Err(down())), t0);
    assert_eq!(s.retry, None);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        fx,
        vec![Effect::Emit(Event::Error("store unavailable".into()))]
    );
}

#[test]
fn a_rewatch_refused_by_the_store_leaves_the_session_idle() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, _) = run(idle(), tried(enter(p, false), 0, Err(broken())), t0);
    assert_eq!(s.phase, Phase::Idle, "not the end of the session");
    assert_eq!(fx, vec![Effect::Emit(Event::Error("corrupt key".into()))]);
}

#[test]
fn an_entry_that_went_through_runs_the_generation() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let p = view.plan.clone();
    let (s, _, _) = run(
        idle(),
        tried(enter(p, true), 0, Ok(Some(Phase::Running(view)))),
        t0,
    );
    assert_eq!(s.phase.running_generation(), Some(3));
}

#[test]
fn a_join_again_that_fails_leaves_the_session_idle_without_a_word() {
    let t0 = Instant::now();
    let (s, fx, why) = run(idle(), tried(Attempt::Join(join("a")), 1, Err(down())), t0);
    assert_eq!((s, fx), (idle(), vec![]));
    assert!(why.contains("joining again failed"), "{why}");
}
