//! The round's judgement on synthetic snapshots and instants: one test per rule, no store.

use std::time::Duration;

use super::*;
use crate::decisions::envcheck::{EnvCheck, Fingerprint};
use crate::store::records::Formation;

fn cand(id: &str) -> Candidate {
    Candidate::local(id, 1)
}

fn join(id: &str) -> Join {
    cand(id).into()
}

fn with_torch(id: &str, torch: &str) -> Join {
    let fingerprint: Fingerprint = [("torch".to_string(), torch.to_string())].into();
    Join {
        fingerprint,
        env_check: Some(EnvCheck::Strict),
        ..join(id)
    }
}

fn cfg(min: usize, max: usize) -> RoundConfig {
    RoundConfig {
        min_nodes: min,
        max_nodes: max,
        last_call: Duration::from_secs(30),
        join_timeout: Duration::from_secs(600),
        settle: Duration::from_secs(1),
    }
}

/// A first round with `joins` waiting (revisions after `gen/current`'s).
fn first(joins: Vec<Join>) -> RoundSnapshot {
    RoundSnapshot {
        waiting: joins.into_iter().zip(10..).collect(),
        ..Default::default()
    }
}

/// A round at generation 1 of `members`, `joins` waiting since it formed (revision 5).
fn after(members: &[&str], joins: Vec<Join>) -> RoundSnapshot {
    let admitted: Vec<Candidate> = members.iter().map(|m| cand(m)).collect();
    RoundSnapshot {
        generation: 1,
        revision: 5,
        current: Some(assign("r", 1, &admitted, 0, 0).unwrap()),
        live: members.iter().map(|m| m.to_string()).collect(),
        live_after: true,
        ..first(joins)
    }
}

fn ids(v: &[Candidate]) -> Vec<&str> {
    v.iter().map(|c| c.node_id.as_str()).collect()
}

#[test]
fn an_ended_run_forms_nothing() {
    let t0 = Instant::now();
    let snap = RoundSnapshot {
        finished: true,
        ..first(vec![join("a")])
    };
    let j = judge(&snap, &RoundTimes::new(t0), t0, &cfg(1, 1));
    assert_eq!(j.judgement, Judgement::Finished);
}

#[test]
fn max_nodes_form_at_once_in_arrival_order() {
    let t0 = Instant::now();
    let snap = first(vec![join("b"), join("a"), join("c")]);
    let j = judge(&snap, &RoundTimes::new(t0), t0, &cfg(1, 2));
    let Judgement::Form(order) = j.judgement else {
        panic!("{j:?}")
    };
    assert_eq!(ids(&order.admitted), ["b", "a"]);
    assert_eq!(ids(&order.standby), ["c"]);
    assert_eq!(order.env_table, None);
    assert!(!j.reason.is_empty());
}

#[test]
fn below_min_waits_and_fails_at_the_join_timeout_naming_everyone() {
    let t0 = Instant::now();
    let c = cfg(3, 4);
    let snap = first(vec![join("a"), join("b")]);
    let j = judge(&snap, &RoundTimes::new(t0), t0, &c);
    assert_eq!(
        j.judgement,
        Judgement::Wait {
            until: t0 + c.join_timeout
        }
    );
    assert!(!j.reason.is_empty());
    let late = t0 + c.join_timeout;
    let j = judge(&snap, &j.times, late, &c);
    assert_eq!(
        j.judgement,
        Judgement::Fail {
            cause: FailCause::JoinTimeout,
            nodes: vec!["a".into(), "b".into()]
        }
    );
}

#[test]
fn min_reached_forms_when_the_last_call_closes() {
    let t0 = Instant::now();
    let c = cfg(2, 4);
    let snap = first(vec![join("a"), join("b")]);
    let j = judge(&snap, &RoundTimes::new(t0), t0, &c);
    assert_eq!(j.times.min_reached_at, Some(t0));
    assert_eq!(
        j.judgement,
        Judgement::Wait {
            until: t0 + c.last_call
        }
    );
    let j = judge(&snap, &j.times, t0 + c.last_call, &c);
    assert!(matches!(j.judgement, Judgement::Form(_)), "{j:?}");
    // Below MIN again: the last call starts over.
    let j = judge(&first(vec![join("a")]), &j.times, t0 + c.last_call, &c);
    assert_eq!(j.times.min_reached_at, None);
}

#[test]
fn a_running_generation_stands_everyone_by_and_reopens_the_round() {
    let t0 = Instant::now();
    let later = t0 + Duration::from_secs(50);
    let snap = after(&["a", "b"], vec![join("c")]);
    let j = judge(&snap, &RoundTimes::new(t0), later, &cfg(1, 3));
    assert_eq!(
        j.judgement,
        Judgement::Wait {
            until: later + crate::decisions::core::PROGRESS_EVERY
        }
    );
    assert_eq!(j.times.opened_at, later);
    assert_eq!(j.times.batched, BTreeSet::from(["c".to_string()]));
    assert!(j.reason.contains("standing by"), "{}", j.reason);
}

#[test]
fn a_members_join_that_got_it_in_is_no_candidate_and_keeps_it_running() {
    let t0 = Instant::now();
    // Every membership key gone, but a's join (revision 3, before `gen/current`'s 5) is the
    // one that got it into generation 1: a is starting, generation 1 runs.
    let mut snap = after(&["a"], vec![]);
    snap.live_after = false;
    snap.waiting = vec![(join("a"), 3)];
    assert_eq!(candidates(&snap).0.len(), 0);
    let j = judge(&snap, &RoundTimes::new(t0), t0, &cfg(1, 1));
    assert!(matches!(j.judgement, Judgement::Wait { .. }), "{j:?}");
    assert_eq!(j.reason, "", "nobody stands by");
    // Written after it formed: a new join, and generation 1 (no live member) has ended.
    snap.waiting = vec![(join("a"), 6)];
    let j = judge(&snap, &RoundTimes::new(t0), t0, &cfg(1, 1));
    assert!(matches!(j.judgement, Judgement::Form(_)), "{j:?}");
}

#[test]
fn a_closed_generation_re_forms_once_its_live_members_are_back() {
    let t0 = Instant::now();
    let mut snap = after(&["a", "b"], vec![join("a")]);
    snap.closed = true;
    let c = cfg(1, 2);
    let j = judge(&snap, &RoundTimes::new(t0), t0, &c);
    assert!(
        matches!(j.judgement, Judgement::Wait { .. }),
        "b is live and not back: {j:?}"
    );
    snap.waiting.push((join("b"), 11));
    let j = judge(&snap, &j.times, t0, &c);
    let Judgement::Form(order) = j.judgement else {
        panic!("{j:?}")
    };
    assert_eq!(ids(&order.admitted), ["a", "b"]);
}

#[test]
fn disagreeing_environments_fail_a_first_formation() {
    let t0 = Instant::now();
    let snap = first(vec![with_torch("a", "2.4.0"), with_torch("b", "2.3.1")]);
    let j = judge(&snap, &RoundTimes::new(t0), t0, &cfg(2, 2));
    assert_eq!(
        j.judgement,
        Judgement::Fail {
            cause: FailCause::Unformable,
            nodes: vec!["a".into(), "b".into()]
        }
    );
    assert!(j.reason.contains("torch"), "{}", j.reason);
}

#[test]
fn a_re_form_turns_away_the_newcomer_the_members_disagree_with() {
    let t0 = Instant::now();
    let mut snap = after(
        &["a", "b"],
        vec![
            with_torch("a", "2.4.0"),
            with_torch("b", "2.4.0"),
            with_torch("c", "2.3.1"),
        ],
    );
    snap.closed = true;
    let j = judge(&snap, &RoundTimes::new(t0), t0, &cfg(2, 3));
    assert_eq!(
        j.judgement,
        Judgement::TurnAway {
            who: vec!["c".into()]
        }
    );
    assert!(j.reason.contains("2.3.1 on c"), "{}", j.reason);
}

#[test]
fn a_warning_forms_with_its_table() {
    let t0 = Instant::now();
    let warn = |id: &str, torch: &str| Join {
        env_check: Some(EnvCheck::Warn),
        ..with_torch(id, torch)
    };
    let snap = first(vec![warn("a", "2.4.0"), warn("b", "2.3.1")]);
    let j = judge(&snap, &RoundTimes::new(t0), t0, &cfg(2, 2));
    let Judgement::Form(order) = j.judgement else {
        panic!("{j:?}")
    };
    assert!(order.env_table.is_some_and(|t| t.contains("torch")));
}

#[test]
fn newcomers_batched_beside_the_running_generation_are_not_settled_for_again() {
    let plan = assign("job", 1, &[cand("a"), cand("b")], 0, 0).unwrap();
    let mut batched = BTreeSet::new();
    // c and d wait while generation 1 runs (its last call gathers them): nothing to settle.
    let waiting = [cand("c"), cand("d")];
    assert_eq!(
        fresh_newcomers(Some(&plan), &waiting, true, &mut batched),
        0
    );
    // Generation 1 closed to admit them; the members are back: no fresh arrival, form at once.
    let all = [cand("a"), cand("b"), cand("c"), cand("d")];
    assert_eq!(fresh_newcomers(Some(&plan), &all, false, &mut batched), 0);
    // One more node arrives during the re-form: it is worth the settle window.
    let more = [cand("a"), cand("b"), cand("c"), cand("d"), cand("e")];
    assert_eq!(fresh_newcomers(Some(&plan), &more, false, &mut batched), 1);
}

#[test]
fn newcomers_of_a_re_form_not_seen_beside_a_running_generation_are_fresh() {
    // After a loss (the generation closed before anyone waited beside it), a newcomer that
    // arrives during the re-form is settled for; the members never are; a first formation has
    // no newcomers.
    let plan = assign("job", 1, &[cand("a"), cand("b"), cand("c")], 0, 0).unwrap();
    let mut batched = BTreeSet::new();
    let waiting = [cand("a"), cand("b"), cand("x")];
    assert_eq!(
        fresh_newcomers(Some(&plan), &waiting, false, &mut batched),
        1
    );
    assert_eq!(fresh_newcomers(None, &waiting, false, &mut batched), 0);
}

fn manifest(run: &str, step: u64, g: u64, sealed_at_ms: u64) -> Manifest {
    Manifest::bare(run, step, g, sealed_at_ms)
}

fn order(ids: &[&str]) -> FormOrder {
    FormOrder {
        admitted: ids.iter().map(|i| cand(i)).collect(),
        standby: vec![],
        env_table: Some("table".into()),
    }
}

#[test]
fn a_formation_carries_the_counters_the_reason_and_its_record() {
    let t0 = Instant::now();
    let now = t0 + Duration::from_millis(1_500);
    let snap = after(&["a"], vec![join("a")]);
    let inputs = FormationInputs {
        restarts: Restarts {
            failures: 2,
            membership: 1,
            history: vec![],
        },
        restarts_revision: 9,
        closed: true,
        previous: Some(Formation {
            round_opened_at_ms: 0,
            formed_at_ms: 1_000,
            lost_work: None,
            door: None,
        }),
        latest_revision: 4,
        ..Default::default()
    };
    let f = formation("r", &snap, &order(&["a"]), "why", &inputs, t0, now, 10_000).unwrap();
    assert_eq!(f.plan.generation, 2);
    assert_eq!(
        (f.plan.restarts_failures, f.plan.restarts_membership),
        (2, 1)
    );
    assert_eq!(f.plan.formed_because, "why");
    assert_eq!(f.plan.notes.last().map(String::as_str), Some("table"));
    assert_eq!(f.formation.round_opened_at_ms, 8_500);
    assert_eq!(f.formation.formed_at_ms, 10_000);
    assert_eq!(f.formation.lost_work.map(|l| l.ms), Some(7_500));
    assert_eq!((f.latest_revision, f.unclosed, f.import), (4, None, None));
}

#[test]
fn a_generation_nobody_closed_counts_one_membership_restart_in_the_formation() {
    let t0 = Instant::now();
    let snap = after(&["a"], vec![join("a")]);
    let inputs = FormationInputs {
        restarts_revision: 9,
        closed: false,
        ..Default::default()
    };
    let f = formation("r", &snap, &order(&["a"]), "", &inputs, t0, t0, 0).unwrap();
    assert_eq!(f.plan.restarts_membership, 1);
    let (restarts, rev) = f.unclosed.expect("unclosed");
    assert_eq!((restarts.membership, rev), (1, 9));
    // A first formation has nothing to close.
    let f = formation(
        "r",
        &first(vec![join("a")]),
        &order(&["a"]),
        "",
        &inputs,
        t0,
        t0,
        0,
    )
    .unwrap();
    assert_eq!((f.plan.generation, f.unclosed), (1, None));
}

#[test]
fn a_formation_resumes_from_the_newest_good_checkpoint_or_imports_a_newer_hint() {
    let t0 = Instant::now();
    let mut hinted = join("a");
    hinted.resume_hint = Some(Box::new(manifest("r", 30, 1, 0)));
    let inputs = FormationInputs {
        manifests: vec![manifest("r", 10, 1, 0), manifest("r", 20, 1, 0)],
        bad: [(manifest("r", 20, 1, 0).id(), "torn".to_string())].into(),
        closed: true,
        ..Default::default()
    };
    let plain = first(vec![join("a")]);
    let f = formation("r", &plain, &order(&["a"]), "", &inputs, t0, t0, 0).unwrap();
    assert_eq!(f.plan.resume, Some(manifest("r", 10, 1, 0)));
    assert_eq!(f.import, None);
    let f = formation(
        "r",
        &first(vec![hinted.clone()]),
        &order(&["a"]),
        "",
        &inputs,
        t0,
        t0,
        0,
    )
    .unwrap();
    assert_eq!(f.import, Some(manifest("r", 30, 1, 0)));
    assert_eq!(f.plan.resume, f.import);
    // Another run's checkpoint only starts a run: a re-form does not adopt it.
    let mut adopted = manifest("r", 40, 1, 0);
    adopted.adopted_from = Some("other".into());
    hinted.resume_hint = Some(Box::new(adopted));
    let f = formation(
        "r",
        &after(&["a"], vec![hinted]),
        &order(&["a"]),
        "",
        &inputs,
        t0,
        t0,
        0,
    )
    .unwrap();
    assert_eq!(
        (f.plan.resume, f.import),
        (Some(manifest("r", 10, 1, 0)), None)
    );
}
