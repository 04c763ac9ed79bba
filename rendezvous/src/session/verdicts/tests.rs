//! Unit tests of the job-wide verdicts: failure budget, exit barrier, fence, joins.

use super::*;
use crate::round::Restarts;
use crate::session::generation::tests::{plan, rules};

// ---- failure budget ----

#[test]
fn a_worker_failure_with_budget_left_spends_one_restart() {
    let r = Restarts::default();
    let v = failure_verdict(3, "rank 1 exited 1", &r, 3, None, &rules(), 5);
    let FailureVerdict::Spend { next, closed } = v else {
        panic!("{v:?}")
    };
    assert_eq!(next.failures, 1);
    assert_eq!(
        next.history,
        vec!["generation 3: rank 1 exited 1".to_string()]
    );
    assert_eq!(closed, "worker failure: rank 1 exited 1");
}

#[test]
fn a_worker_failure_with_the_budget_spent_ends_the_run() {
    let r = Restarts {
        failures: 2,
        membership: 1,
        history: vec!["generation 1: x".into(), "generation 2: y".into()],
    };
    let v = failure_verdict(3, "rank 0 killed by SIGSEGV", &r, 3, None, &rules(), 42);
    let FailureVerdict::End { end, last } = v else {
        panic!("{v:?}")
    };
    assert!(!end.success);
    assert_eq!(end.at_ms, 42);
    assert_eq!(
        end.reason,
        "rank 0 killed by SIGSEGV; restart budget spent (2 of 2 used)"
    );
    assert_eq!(last.failures, 2, "nothing more spent");
    assert_eq!(last.history.len(), 3);
}

#[test]
fn a_zero_budget_ends_the_run_at_the_first_failure() {
    let zero = Rules {
        max_restarts: 0,
        ..rules()
    };
    let v = failure_verdict(
        1,
        "rank 0 exited 1",
        &Restarts::default(),
        1,
        None,
        &zero,
        0,
    );
    assert!(matches!(v, FailureVerdict::End { .. }));
}

#[test]
fn a_failure_during_a_reform_spends_nothing() {
    let r = Restarts::default();
    let v = failure_verdict(
        3,
        "rank 1 exited 1",
        &r,
        3,
        Some("node b left"),
        &rules(),
        0,
    );
    assert!(matches!(v, FailureVerdict::Joins { ref restarts, .. } if restarts == &r));
    let spent = Restarts {
        failures: 2,
        ..Restarts::default()
    };
    let v = failure_verdict(3, "x", &spent, 3, Some("worker failure: y"), &rules(), 0);
    assert!(
        matches!(v, FailureVerdict::Joins { .. }),
        "even with the budget spent"
    );
}

#[test]
fn a_failure_of_an_older_generation_spends_nothing() {
    let v = failure_verdict(3, "x", &Restarts::default(), 4, None, &rules(), 0);
    assert!(matches!(v, FailureVerdict::Joins { ref reason, .. } if reason.contains("over")));
}

// ---- exit barrier ----

#[test]
fn the_exit_barrier_waits_for_the_late_node() {
    let p = plan(3, &["a", "b", "c"]);
    assert_eq!(exit_barrier(&p, &["a".into(), "c".into()], 1), None);
    assert_eq!(exit_barrier(&p, &[], 1), None);
}

#[test]
fn the_exit_barrier_ends_the_run_when_every_node_finished() {
    let p = plan(3, &["a", "b", "c"]);
    let done = vec!["c".to_string(), "a".into(), "b".into(), "stranger".into()];
    let end = exit_barrier(&p, &done, 9).expect("finished");
    assert!(end.success);
    assert_eq!(end.at_ms, 9);
    assert_eq!(end.reason, "all 6 workers of generation 3 succeeded");
}

// ---- fence, lease lost, duplicate joins ----

#[test]
fn a_lost_lease_fences_only_when_it_is_the_held_one() {
    assert!(fences(Some(7), 7));
    assert!(!fences(Some(8), 7), "a lease already replaced");
    assert!(!fences(None, 7), "already fenced");
}

#[test]
fn duplicate_joins_are_ignored() {
    assert!(join_is_duplicate(true, None, 0), "already waiting");
    assert!(
        join_is_duplicate(false, Some(4), 3),
        "runs a newer generation"
    );
    assert!(
        !join_is_duplicate(false, Some(3), 3),
        "re-joins after its generation"
    );
    assert!(!join_is_duplicate(false, None, 3), "idle");
}
