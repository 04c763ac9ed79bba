//! A worker failure: a lost member's doing or the workers' own, against the job-wide restart budget.

use super::*;

fn failed() -> Request {
    Request::Failed {
        generation: 3,
        description: "rank 1 exited 1".into(),
        cause: None,
    }
}

fn spending() -> Spending {
    Spending {
        generation: 3,
        description: "rank 1 exited 1".into(),
        cause: None,
    }
}

fn budget(stage: BudgetStage) -> Attempt {
    Attempt::Budget {
        spending: spending(),
        stage,
    }
}

fn attribution(t0: Instant, knocked: bool) -> Attribution {
    Attribution {
        generation: 3,
        description: "rank 1 exited 1".into(),
        cause: None,
        until: ms(t0, 2000),
        knocked,
    }
}

fn looked(a: Attribution, tries: u32, result: Result<LossLook, Failure>) -> Input {
    Input::Looked {
        attribution: a,
        tries,
        result,
    }
}

#[test]
fn a_worker_failure_looks_for_a_lost_member_within_the_attribution_window() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), request(failed()), t0);
    assert_eq!(s, running(t0));
    assert_eq!(
        tries_of(&fx),
        vec![(Attempt::Attribute(attribution(t0, false)), 0)]
    );
}

#[test]
fn a_failure_whose_member_is_lost_restarts_without_spending_the_budget() {
    let t0 = Instant::now();
    let restarts = crate::round::Restarts::default();
    let (s, fx, why) = run(
        running(t0),
        looked(
            attribution(t0, false),
            0,
            Ok(LossLook::Lost(restarts.clone())),
        ),
        ms(t0, 30),
    );
    assert_eq!(s.retry, None);
    assert!(why.contains("membership restart"), "{why}");
    assert_eq!(
        fx,
        vec![Effect::Emit(Event::FailureDecision {
            restart: true,
            restarts,
            cause: None
        })]
    );
}

#[test]
fn the_workers_own_failure_is_decided_against_the_budget_at_once() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        running(t0),
        looked(attribution(t0, false), 0, Ok(LossLook::NotALoss)),
        ms(t0, 5),
    );
    assert_eq!(s.retry, None);
    assert_eq!(tries_of(&fx), vec![(budget(BudgetStage::Read), 0)]);
}

#[test]
fn agents_that_do_not_all_answer_the_knock_are_looked_at_again_at_once() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        running(t0),
        looked(attribution(t0, false), 0, Ok(LossLook::Knocked)),
        ms(t0, 300),
    );
    assert_eq!(s.retry, None);
    assert_eq!(
        tries_of(&fx),
        vec![(Attempt::Attribute(attribution(t0, true)), 0)]
    );
}

#[test]
fn nothing_seen_yet_looks_again_a_poll_later_with_requests_held_behind() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        running(t0),
        looked(attribution(t0, true), 0, Ok(LossLook::Unseen)),
        ms(t0, 400),
    );
    assert!(fx.is_empty());
    assert_eq!(
        s.retry,
        Some(Retry {
            what: Attempt::Attribute(attribution(t0, true)),
            tries: 0,
            at: ms(t0, 400) + ATTRIBUTION_POLL
        })
    );
    assert!(!s.reads_requests(), "the answer to the failure comes first");
}

#[test]
fn nothing_seen_by_the_end_of_the_window_is_decided_against_the_budget() {
    let t0 = Instant::now();
    let (s, fx, why) = run(
        running(t0),
        looked(attribution(t0, true), 0, Ok(LossLook::Unseen)),
        ms(t0, 2000),
    );
    assert_eq!(s.retry, None);
    assert!(why.contains("attribution window"), "{why}");
    assert_eq!(tries_of(&fx), vec![(budget(BudgetStage::Read), 0)]);
}

#[test]
fn the_window_is_polled_about_twenty_times_then_decided() {
    let t0 = Instant::now();
    let (mut s, mut fx, _) = run(running(t0), request(failed()), t0);
    let mut now = t0;
    let mut looks = 0;
    loop {
        let [Effect::Try { what, tries }] = &fx[..] else {
            panic!("{fx:?}")
        };
        let Attempt::Attribute(a) = what.clone() else {
            assert_eq!(*what, budget(BudgetStage::Read));
            break;
        };
        looks += 1;
        let seen = if a.knocked {
            LossLook::Unseen
        } else {
            LossLook::Knocked
        };
        let (s2, f2, _) = run(s, looked(a, *tries, Ok(seen)), now);
        s = s2;
        fx = f2;
        if let Some(r) = &s.retry {
            now = r.at;
            let (s2, f2, _) = run(s, Input::Tick, now);
            s = s2;
            fx = f2;
        }
    }
    assert_eq!(now - t0, Duration::from_secs(2));
    assert_eq!(
        looks, 22,
        "the knock, then one look every 100 ms through the window"
    );
}

#[test]
fn a_look_the_store_did_not_answer_is_tried_again_after_a_pause() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        running(t0),
        looked(attribution(t0, false), 3, Err(down())),
        t0,
    );
    assert!(fx.is_empty());
    assert_eq!(
        s.retry,
        Some(Retry {
            what: Attempt::Attribute(attribution(t0, false)),
            tries: 4,
            at: t0 + RETRY_PAUSE
        })
    );
}

#[test]
fn a_look_refused_by_the_store_ends_the_session() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        running(t0),
        tried(Attempt::Attribute(attribution(t0, false)), 0, Err(broken())),
        t0,
    );
    assert!(s.phase.is_left());
    assert_eq!(fx, vec![Effect::Emit(Event::Error("corrupt key".into()))]);
}

#[test]
fn a_lease_lost_while_looking_for_a_loss_fences_and_stops_looking() {
    let t0 = Instant::now();
    let s = Session {
        retry: Some(Retry {
            what: Attempt::Attribute(attribution(t0, true)),
            tries: 0,
            at: ms(t0, 100),
        }),
        ..running(t0)
    };
    let (s, _, _) = run(s, Input::LeaseLost((LEASE, "gone".into())), ms(t0, 50));
    assert_eq!(s.retry, None);
    assert!(matches!(s.phase, Phase::Fenced { .. }));
}

fn budgeted(tries: u32, result: Result<BudgetSeen, Failure>) -> Input {
    Input::Budgeted {
        spending: spending(),
        tries,
        result,
    }
}

fn counters(failures: u32) -> crate::round::Restarts {
    crate::round::Restarts {
        failures,
        ..Default::default()
    }
}

fn read(failures: u32, current: u64, closed: Option<&str>) -> BudgetSeen {
    BudgetSeen::Read {
        restarts: (counters(failures), 40),
        current: (current, 41),
        closed: closed.map(String::from),
        at_ms: 1_000,
    }
}

fn decision(fx: &[Effect]) -> Option<(bool, u32)> {
    fx.iter().find_map(|e| match e {
        Effect::Emit(Event::FailureDecision {
            restart, restarts, ..
        }) => Some((*restart, restarts.failures)),
        _ => None,
    })
}

#[test]
fn a_failure_with_budget_left_spends_one_restart_guarded_on_what_was_read() {
    let t0 = Instant::now();
    let (s, fx, why) = run(running(t0), budgeted(0, Ok(read(0, 3, None))), t0);
    assert_eq!(s, running(t0));
    let [(Attempt::Budget { stage, .. }, 0)] = &tries_of(&fx)[..] else {
        panic!("{fx:?}")
    };
    let BudgetStage::Spend {
        gen_rev,
        restarts_rev,
        next,
        closed,
    } = stage
    else {
        panic!("{stage:?}")
    };
    assert_eq!((*gen_rev, *restarts_rev, next.failures), (41, 40, 1));
    assert_eq!(
        next.history,
        vec!["generation 3: rank 1 exited 1".to_string()]
    );
    assert_eq!(closed, "worker failure: rank 1 exited 1");
    assert!(why.contains("spending one restart"), "{why}");
    assert_eq!(decision(&fx), None, "the agent hears it once spent");
}

#[test]
fn a_spend_that_won_restarts_the_workers_and_counts_the_reform() {
    let t0 = Instant::now();
    let seen = BudgetSeen::Spent {
        won: true,
        next: counters(1),
        closed: "worker failure: rank 1 exited 1".into(),
    };
    let (s, fx, _) = run(running(t0), budgeted(0, Ok(seen)), t0);
    assert_eq!(s, running(t0));
    assert_eq!(
        fx,
        vec![
            Effect::Reformed {
                generation: 3,
                reason: "worker failure: rank 1 exited 1".into()
            },
            Effect::Emit(Event::FailureDecision {
                restart: true,
                restarts: counters(1),
                cause: None
            })
        ]
    );
}

#[test]
fn a_spend_that_lost_its_race_reads_the_budget_again_at_once() {
    let t0 = Instant::now();
    let seen = BudgetSeen::Spent {
        won: false,
        next: counters(1),
        closed: "x".into(),
    };
    let (s, fx, _) = run(running(t0), budgeted(2, Ok(seen)), t0);
    assert_eq!(s.retry, None);
    assert_eq!(tries_of(&fx), vec![(budget(BudgetStage::Read), 2)]);
    assert_eq!(decision(&fx), None);
}

#[test]
fn a_failure_during_a_reform_under_way_joins_it_and_spends_nothing() {
    let t0 = Instant::now();
    let (_, fx, why) = run(
        running(t0),
        budgeted(0, Ok(read(1, 3, Some("node b lost")))),
        t0,
    );
    assert_eq!(tries_of(&fx), vec![]);
    assert_eq!(decision(&fx), Some((true, 1)));
    assert!(why.contains("joins an ongoing re-form"), "{why}");
    assert!(
        matches!(&fx[0], Effect::Note { generation: 3, line } if line.contains("node b lost")),
        "{fx:?}"
    );
}

#[test]
fn a_failure_of_a_generation_that_is_over_spends_nothing_and_says_it_quietly() {
    let t0 = Instant::now();
    let (_, fx, why) = run(running(t0), budgeted(0, Ok(read(0, 4, None))), t0);
    assert_eq!(decision(&fx), Some((true, 0)));
    assert!(why.contains("is over"), "{why}");
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Note { .. })),
        "{fx:?}"
    );
}

#[test]
fn a_spent_budget_ends_the_run_naming_the_failure_as_its_root_cause() {
    let t0 = Instant::now();
    let cause = crate::decisions::root_cause::RootCause::default();
    let with_cause = Input::Budgeted {
        spending: Spending {
            cause: Some(cause.clone()),
            ..spending()
        },
        tries: 0,
        result: Ok(read(2, 3, None)),
    };
    let (_, fx, why) = run(running(t0), with_cause, t0);
    let [(Attempt::Budget { stage, .. }, 0)] = &tries_of(&fx)[..] else {
        panic!("{fx:?}")
    };
    let BudgetStage::End { end, last } = stage else {
        panic!("{stage:?}")
    };
    assert!(!end.success);
    assert_eq!(end.root_cause, Some(cause));
    assert_eq!(last.history.len(), 1);
    assert!(why.contains("budget is spent"), "{why}");
    assert_eq!(decision(&fx), None);
}

#[test]
fn an_ended_run_tells_the_agent_not_to_restart_with_the_recorded_cause() {
    let t0 = Instant::now();
    let seen = BudgetSeen::Ended {
        last: counters(2),
        cause: None,
    };
    let (_, fx, _) = run(running(t0), budgeted(0, Ok(seen)), t0);
    assert_eq!(
        fx,
        vec![Effect::Emit(Event::FailureDecision {
            restart: false,
            restarts: counters(2),
            cause: None
        })]
    );
}

#[test]
fn a_budget_the_store_does_not_answer_starts_over_from_the_read_after_a_pause() {
    let t0 = Instant::now();
    let (s, fx, why) = run(running(t0), budgeted(3, Err(down())), t0);
    assert_eq!(fx, vec![]);
    assert_eq!(
        s.retry,
        Some(Retry {
            what: budget(BudgetStage::Read),
            tries: 4,
            at: t0 + RETRY_PAUSE
        })
    );
    assert!(
        why.contains("deciding the failure of generation 3 again"),
        "{why}"
    );
    // Due: tried again, from the read.
    let (s, fx, _) = run(s, Input::Tick, t0 + RETRY_PAUSE);
    assert_eq!(s.retry, None);
    assert_eq!(tries_of(&fx), vec![(budget(BudgetStage::Read), 4)]);
}

#[test]
fn a_budget_the_store_never_answers_ends_the_session_after_the_last_try() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), budgeted(REQUEST_TRIES - 1, Err(down())), t0);
    assert_eq!(s.phase, Phase::Left);
    assert_eq!(
        fx,
        vec![Effect::Emit(Event::Error("store unavailable".into()))]
    );
}

#[test]
fn a_budget_stage_that_fails_for_good_ends_the_session() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), budgeted(0, Err(broken())), t0);
    assert_eq!(s.phase, Phase::Left);
    assert_eq!(fx, vec![Effect::Emit(Event::Error("corrupt key".into()))]);
}

#[test]
fn a_spend_the_store_did_not_answer_comes_back_through_tried_and_is_retried_from_the_read() {
    let t0 = Instant::now();
    let what = budget(BudgetStage::Spend {
        gen_rev: 1,
        restarts_rev: 1,
        next: counters(1),
        closed: "x".into(),
    });
    let (s, _, _) = run(running(t0), tried(what, 0, Err(down())), t0);
    assert_eq!(
        s.retry.map(|r| (r.what, r.tries)),
        Some((budget(BudgetStage::Read), 1))
    );
}
