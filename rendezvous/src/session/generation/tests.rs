//! Unit tests of the pure generation core: synthetic instants, no store, no sleeping.

use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::{assign, Candidate};

fn cand(id: &str) -> Candidate {
    Candidate {
        master_port: 1,
        ..Candidate::local(id, 2)
    }
}

/// A generation `g` of the given nodes (node ranks follow the ids' order).
pub(in crate::session) fn plan(g: u64, nodes: &[&str]) -> Plan {
    let cands: Vec<Candidate> = nodes.iter().map(|n| cand(n)).collect();
    assign("run", g, &cands, 0, 0).expect("formable")
}

pub(in crate::session) fn rules() -> Rules {
    Rules {
        max_nodes: 4,
        scale_up_save: None,
        scale_up_window: Duration::ZERO,
        lease_ttl: Duration::from_secs(10),
        max_restarts: 2,
        ckpt_interval: Default::default(),
    }
}

fn with_save(limit: u64) -> Rules {
    Rules {
        scale_up_save: Some(Duration::from_secs(limit)),
        ..rules()
    }
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

/// Node `node` running generation 3 of a, b, c; the successor started.
fn running(node: &str, t0: Instant, rules: &Rules) -> Running {
    Running::enter(plan(3, &["a", "b", "c"]), node, None, true, t0, rules)
}

fn close_reason(s: &Step) -> Option<&str> {
    s.effects.iter().find_map(|e| match e {
        Effect::Close(r) | Effect::AdmitIfWaiting { reason: r, .. } => Some(r.as_str()),
        Effect::CheckSuccessorStarted { reason, .. } => Some(reason.as_str()),
        _ => None,
    })
}

// ---- entering a generation, the successor and its start deadline ----

#[test]
fn successor_is_the_next_node_in_rank_order_wrapping() {
    let p = plan(1, &["a", "b", "c"]);
    assert_eq!(successor(&p, "a").as_deref(), Some("b"));
    assert_eq!(successor(&p, "c").as_deref(), Some("a"));
    assert_eq!(successor(&plan(1, &["a"]), "a"), None);
    assert_eq!(successor(&p, "z"), None, "not a member");
}

#[test]
fn a_successor_not_started_gets_one_lease_ttl() {
    let t0 = Instant::now();
    let r = Running::enter(plan(3, &["a", "b"]), "a", None, false, t0, &rules());
    assert_eq!(r.successor_deadline, Some(ms(t0, 10_000)));
    assert_eq!(r.wake_at(), Some(ms(t0, 10_000)));
    let started = Running::enter(plan(3, &["a", "b"]), "a", None, true, t0, &rules());
    assert_eq!(started.successor_deadline, None);
    assert_eq!(started.wake_at(), None);
}

#[test]
fn a_single_node_group_has_no_successor_deadline() {
    let t0 = Instant::now();
    let r = Running::enter(plan(1, &["a"]), "a", None, false, t0, &rules());
    assert_eq!(r.successor, None);
    assert_eq!(r.successor_deadline, None);
}

#[test]
fn the_successor_starting_clears_its_deadline() {
    let t0 = Instant::now();
    let mut r = Running::enter(plan(3, &["a", "b", "c"]), "a", None, false, t0, &rules());
    let s = step(&mut r, Input::MemberUp("c".into()), ms(t0, 5), &rules());
    assert!(s.effects.is_empty());
    assert!(r.successor_deadline.is_some(), "c is not a's successor");
    let s = step(&mut r, Input::MemberUp("b".into()), ms(t0, 6), &rules());
    assert!(s.effects.is_empty() && !s.ends);
    assert_eq!(r.successor_deadline, None);
}

#[test]
fn a_tick_before_the_successor_deadline_does_nothing() {
    let t0 = Instant::now();
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, false, t0, &rules());
    let s = step(&mut r, Input::Tick, ms(t0, 9_999), &rules());
    assert!(s.effects.is_empty());
    assert_eq!(r.successor_deadline, Some(ms(t0, 10_000)));
}

#[test]
fn the_successor_start_deadline_checks_it_once() {
    let t0 = Instant::now();
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, false, t0, &rules());
    let s = step(&mut r, Input::Tick, ms(t0, 10_000), &rules());
    assert_eq!(
        s.effects,
        vec![Effect::CheckSuccessorStarted {
            node: "b".into(),
            reason: "node b did not start within the lease TTL (10 s)".into(),
        }]
    );
    assert!(!s.ends);
    assert_eq!(r.successor_deadline, None);
    assert!(step(&mut r, Input::Tick, ms(t0, 20_000), &rules())
        .effects
        .is_empty());
}

#[test]
fn a_rewatch_keeps_the_pending_scale_up_of_the_same_generation_only() {
    let t0 = Instant::now();
    let rules = with_save(60);
    let mut r = running("a", t0, &rules);
    r.scale_up_requested("d", "L1".into(), t0, Duration::from_secs(60));
    let again = Running::enter(
        plan(3, &["a", "b", "c"]),
        "a",
        Some(r.clone()),
        true,
        ms(t0, 100),
        &rules,
    );
    assert_eq!(again.scale_up, r.scale_up);
    let next = Running::enter(plan(4, &["a", "b", "c"]), "a", Some(r), true, t0, &rules);
    assert_eq!(next.scale_up, None);
}

#[test]
fn only_node_rank_zero_of_a_group_below_max_watches_newcomers() {
    let p = plan(3, &["a", "b", "c"]);
    assert!(watches_newcomers(&p, "a", &rules()));
    assert!(!watches_newcomers(&p, "b", &rules()));
    let full = Rules {
        max_nodes: 3,
        ..rules()
    };
    assert!(!watches_newcomers(&p, "a", &full));
}

// ---- re-form, end, saves ----

#[test]
fn a_closed_generation_reforms_and_ends_the_session_phase() {
    let t0 = Instant::now();
    let mut r = running("b", t0, &rules());
    let s = step(&mut r, Input::Closed("node c left".into()), t0, &rules());
    assert!(s.ends);
    assert_eq!(
        s.effects,
        vec![Effect::Emit(Event::Reform {
            generation: 3,
            reason: "node c left".into()
        })]
    );
}

#[test]
fn a_reform_during_a_pending_scale_up_save_still_reforms() {
    let t0 = Instant::now();
    let rules = with_save(60);
    let mut r = running("a", t0, &rules);
    r.scale_up_requested("d", "L1".into(), t0, Duration::from_secs(60));
    let s = step(
        &mut r,
        Input::Closed("worker failure: rank 2".into()),
        ms(t0, 5),
        &rules,
    );
    assert!(s.ends);
    assert!(matches!(
        &s.effects[..],
        [Effect::Emit(Event::Reform { generation: 3, .. })]
    ));
}

#[test]
fn the_run_end_is_reported_and_ends_the_phase() {
    let t0 = Instant::now();
    let mut r = running("c", t0, &rules());
    let end = RunEnd {
        success: true,
        reason: "all 6 workers of generation 3 succeeded".into(),
        at_ms: 7,
        root_cause: None,
        retryable: false,
        unfit: false,
    };
    let s = step(&mut r, Input::Finished(end.clone()), t0, &rules());
    assert!(s.ends);
    assert_eq!(s.effects, vec![Effect::Emit(Event::Finished(end))]);
}

#[test]
fn a_save_request_is_reported_and_the_generation_goes_on() {
    let t0 = Instant::now();
    let mut r = running("b", t0, &rules());
    let s = step(&mut r, Input::SaveRequest(b"{}".to_vec()), t0, &rules());
    assert!(!s.ends);
    assert_eq!(s.effects, vec![Effect::ReportSaveRequest(b"{}".to_vec())]);
}

#[test]
fn a_seal_without_a_pending_scale_up_is_only_reported() {
    let t0 = Instant::now();
    let mut r = running("a", t0, &rules());
    let s = step(&mut r, Input::Sealed("100-3".into()), t0, &rules());
    assert_eq!(s.effects, vec![Effect::Emit(Event::Sealed("100-3".into()))]);
}

// ---- scale-up admission ----

#[test]
fn a_newcomer_below_max_reforms_at_once_without_a_save() {
    let t0 = Instant::now();
    let mut r = running("a", t0, &rules());
    let s = step(&mut r, Input::Waiting("d".into(), None), t0, &rules());
    assert!(!s.ends);
    assert_eq!(
        s.effects,
        vec![Effect::Close("node d is waiting to join (scale-up)".into())]
    );
}

/// `id`'s join with script hash `script` (the other keys as every member has them).
fn join_with_script(id: &str, script: &str) -> Join {
    let mut j: Join = cand(id).into();
    j.fingerprint = [("config.script-sha256", script), ("torch", "2.4.0")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    j.env_check = Some(crate::decisions::envcheck::EnvCheck::Warn);
    j
}

#[test]
fn a_newcomer_with_another_script_is_turned_away_at_the_door_without_a_re_form() {
    let t0 = Instant::now();
    let mut r = running("a", t0, &with_save(60));
    let members: Vec<Join> = ["a", "b", "c"]
        .iter()
        .map(|n| join_with_script(n, "aaa"))
        .collect();
    let reports: Vec<Report<'_>> = members.iter().map(Report::of).collect();
    r.door = crate::decisions::door::door(&reports);
    let other = join_with_script("d", "ddd");
    let s = step(
        &mut r,
        Input::Waiting("d".into(), Some(Box::new(other))),
        t0,
        &with_save(60),
    );
    let [Effect::TurnAway { node, message }] = s.effects.as_slice() else {
        panic!("{:?}", s.effects);
    };
    assert_eq!(node, "d");
    assert!(crate::decisions::envcheck::is_refusal(message), "{message}");
    assert!(
        message.contains("config.script-sha256 (aaa on the nodes of generation 3; ddd on d)"),
        "{message}"
    );
    assert!(r.scale_up.is_none(), "no checkpoint asked for it");
    // The same script is a scale-up as before (here: a save first).
    let same = join_with_script("e", "aaa");
    let s = step(
        &mut r,
        Input::Waiting("e".into(), Some(Box::new(same))),
        t0,
        &with_save(60),
    );
    assert!(
        matches!(s.effects.as_slice(), [Effect::RequestScaleUpSave { node, .. }] if node == "e"),
        "{:?}",
        s.effects
    );
}

#[test]
fn a_members_own_join_is_not_a_newcomer() {
    let t0 = Instant::now();
    let mut r = running("a", t0, &with_save(60));
    let s = step(&mut r, Input::Waiting("b".into(), None), t0, &with_save(60));
    assert!(s.effects.is_empty());
}

#[test]
fn a_standby_at_max_waits_while_the_generation_runs() {
    let t0 = Instant::now();
    let full = Rules {
        max_nodes: 3,
        ..rules()
    };
    let mut r = running("a", t0, &full);
    let s = step(&mut r, Input::Waiting("d".into(), None), t0, &full);
    assert!(s.effects.is_empty() && !s.ends);
    assert!(s.reason.contains("stands by"), "{}", s.reason);
}

#[test]
fn a_standby_is_promoted_when_the_generation_reforms() {
    // The running generation never admits it; its close sends every member back to the round,
    // where the standby is a candidate like the others (see `core::decide`).
    let t0 = Instant::now();
    let full = Rules {
        max_nodes: 3,
        ..rules()
    };
    let mut r = running("a", t0, &full);
    assert!(step(&mut r, Input::Waiting("d".into(), None), t0, &full)
        .effects
        .is_empty());
    let s = step(
        &mut r,
        Input::Closed("node b left".into()),
        ms(t0, 1),
        &full,
    );
    assert!(s.ends);
}

#[test]
fn a_newcomer_with_on_scale_up_checkpoint_asks_for_a_save_first() {
    let t0 = Instant::now();
    let rules = with_save(60);
    let mut r = running("a", t0, &rules);
    let s = step(&mut r, Input::Waiting("d".into(), None), t0, &rules);
    assert_eq!(
        s.effects,
        vec![Effect::RequestScaleUpSave {
            node: "d".into(),
            limit: Duration::from_secs(60)
        }]
    );
    r.scale_up_requested("d", "L1".into(), t0, Duration::from_secs(60));
    assert_eq!(r.wake_at(), Some(ms(t0, 60_000)));
    // A second newcomer during the save asks for nothing more.
    assert!(
        step(&mut r, Input::Waiting("e".into(), None), ms(t0, 1), &rules)
            .effects
            .is_empty()
    );
}

#[test]
fn the_newcomer_is_admitted_after_the_seal() {
    let t0 = Instant::now();
    let rules = with_save(60);
    let mut r = running("a", t0, &rules);
    r.scale_up_requested(
        "d",
        "00000000000000000100-0003".into(),
        t0,
        Duration::from_secs(60),
    );
    let s = step(
        &mut r,
        Input::Sealed("00000000000000000101-0003".into()),
        ms(t0, 900),
        &rules,
    );
    assert!(matches!(&s.effects[0], Effect::Emit(Event::Sealed(_))));
    let reason = close_reason(&s).expect("admits");
    assert!(
        reason.starts_with("node d is waiting to join (scale-up), admitted after"),
        "{reason}"
    );
    assert!(matches!(
        &s.effects[1],
        Effect::AdmitIfWaiting {
            gone_note: Some(_),
            ..
        }
    ));
    assert_eq!(r.scale_up, None);
    assert_eq!(r.wake_at(), None);
}

#[test]
fn an_older_seal_does_not_admit_the_newcomer() {
    let t0 = Instant::now();
    let rules = with_save(60);
    let mut r = running("a", t0, &rules);
    r.scale_up_requested(
        "d",
        "00000000000000000100-0003".into(),
        t0,
        Duration::from_secs(60),
    );
    let s = step(
        &mut r,
        Input::Sealed("00000000000000000100-0003".into()),
        ms(t0, 1),
        &rules,
    );
    assert_eq!(s.effects.len(), 1, "only reported");
    assert!(r.scale_up.is_some());
}

#[test]
fn the_newcomer_is_admitted_without_a_checkpoint_after_the_timeout() {
    let t0 = Instant::now();
    let rules = with_save(60);
    let mut r = running("a", t0, &rules);
    r.scale_up_requested("d", "L1".into(), t0, Duration::from_secs(60));
    assert!(step(&mut r, Input::Tick, ms(t0, 59_999), &rules)
        .effects
        .is_empty());
    let s = step(&mut r, Input::Tick, ms(t0, 60_000), &rules);
    assert_eq!(
        s.effects,
        vec![Effect::AdmitIfWaiting {
            reason: "node d is waiting to join (scale-up); no checkpoint was sealed within 60 s, re-forming without one".into(),
            gone_note: None,
        }]
    );
    assert_eq!(r.scale_up, None, "fires once");
}

#[test]
fn a_newcomer_that_stops_waiting_calls_the_scale_up_off() {
    let t0 = Instant::now();
    let rules = with_save(60);
    let mut r = running("a", t0, &rules);
    assert!(step(&mut r, Input::WaitingGone, t0, &rules)
        .effects
        .is_empty());
    r.scale_up_requested("d", "L1".into(), t0, Duration::from_secs(60));
    let s = step(&mut r, Input::WaitingGone, ms(t0, 3), &rules);
    assert_eq!(s.effects, vec![Effect::CallOffIfNobodyWaits]);
    assert_eq!(r.call_off_scale_up().as_deref(), Some("d"));
    assert_eq!(r.wake_at(), None);
}

#[test]
fn both_deadlines_due_in_one_tick_act_on_both() {
    let t0 = Instant::now();
    let rules = with_save(5);
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, false, t0, &rules);
    r.scale_up_requested("d", "L1".into(), t0, Duration::from_secs(5));
    assert_eq!(r.wake_at(), Some(ms(t0, 5_000)));
    let s = step(&mut r, Input::Tick, ms(t0, 10_000), &rules);
    assert_eq!(s.effects.len(), 2);
    assert!(matches!(s.effects[0], Effect::CheckSuccessorStarted { .. }));
    assert!(matches!(s.effects[1], Effect::AdmitIfWaiting { .. }));
}

// ---- node loss ----

#[test]
fn only_the_successors_loss_is_acted_on() {
    let t0 = Instant::now();
    let mut r = running("a", t0, &rules());
    assert!(step(&mut r, Input::MemberGone("c".into()), t0, &rules())
        .effects
        .is_empty());
    let s = step(&mut r, Input::MemberGone("b".into()), t0, &rules());
    assert_eq!(s.effects, vec![Effect::SuccessorLost("b".into())]);
    assert!(!s.ends, "the close comes back through the watch");
}

#[test]
fn a_lost_successor_reforms_unless_a_preemption_save_is_sealed() {
    let p = plan(3, &["a", "b", "c"]);
    let why = crate::decisions::loss::LEASE_EXPIRED;
    let reason = successor_lost(&p, "b", why, false).expect("re-forms");
    assert!(reason.contains('b'), "{reason}");
    assert_eq!(successor_lost(&p, "b", why, true), None);
}

// ---- the checkpoint interval (--ckpt-interval) ----

#[test]
fn node_rank_0_asks_for_a_save_each_interval_after_the_last_seal() {
    let t0 = Instant::now();
    let on = Rules {
        ckpt_interval: crate::decisions::ckpt_interval::IntervalConfig {
            mode: crate::decisions::ckpt_interval::IntervalMode::Auto,
            ..Default::default()
        },
        ..rules()
    };
    assert!(running("b", t0, &on).save_clock.is_none(), "rank 0 only");
    assert!(running("a", t0, &rules()).save_clock.is_none(), "off");
    let mut r = running("a", t0, &on);
    r.save_clock.as_mut().unwrap().set(Duration::from_secs(4));
    assert_eq!(r.wake_at(), Some(ms(t0, 4_000)));
    assert!(step(&mut r, Input::Tick, ms(t0, 3_999), &on)
        .effects
        .is_empty());
    let s = step(&mut r, Input::Tick, ms(t0, 4_000), &on);
    assert_eq!(
        s.effects,
        vec![Effect::RequestIntervalSave(Duration::from_secs(4))]
    );
    assert!(step(&mut r, Input::Tick, ms(t0, 9_000), &on)
        .effects
        .is_empty());
    let s = step(&mut r, Input::Sealed("L2".into()), ms(t0, 5_000), &on);
    assert_eq!(
        s.effects[1..],
        [Effect::EvaluateInterval { entered: false }]
    );
    r.save_clock.as_mut().unwrap().set(Duration::from_secs(3));
    assert_eq!(r.wake_at(), Some(ms(t0, 8_000)), "counted from the seal");
}

// ---- arrivals batched in the scale-up window ----

fn windowed(max: usize, window_s: u64, save: Option<u64>) -> Rules {
    Rules {
        max_nodes: max,
        scale_up_window: Duration::from_secs(window_s),
        scale_up_save: save.map(Duration::from_secs),
        ..rules()
    }
}

fn arrive(r: &mut Running, node: &str, at: Instant, rules: &Rules) -> Step {
    step(r, Input::Waiting(node.into(), None), at, rules)
}

#[test]
fn newcomers_within_the_last_call_of_the_first_are_admitted_in_one_reform() {
    let t0 = Instant::now();
    let rules = windowed(6, 10, None);
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, true, t0, &rules);
    let s = arrive(&mut r, "d", t0, &rules);
    assert!(s.effects.is_empty(), "held: {s:?}");
    assert!(s.reason.contains("admitted in 10 s"), "{}", s.reason);
    assert_eq!(r.wake_at(), Some(ms(t0, 10_000)));
    assert!(arrive(&mut r, "c", ms(t0, 3_000), &rules)
        .effects
        .is_empty());
    assert_eq!(
        r.wake_at(),
        Some(ms(t0, 10_000)),
        "the first arrival's window"
    );
    assert!(step(&mut r, Input::Tick, ms(t0, 9_999), &rules)
        .effects
        .is_empty());
    let s = step(&mut r, Input::Tick, ms(t0, 10_000), &rules);
    assert_eq!(
        s.effects,
        vec![Effect::AdmitIfWaiting {
            reason: "nodes c, d are waiting to join (scale-up), admitted together at the end of the last call (10 s)".into(),
            gone_note: Some("nodes c, d are no longer waiting: no re-form".into()),
        }]
    );
    assert_eq!(r.arrivals, None, "once");
    assert_eq!(r.wake_at(), None);
    // The next arrival opens a window of its own.
    assert!(arrive(&mut r, "e", ms(t0, 12_000), &rules)
        .effects
        .is_empty());
    assert_eq!(r.wake_at(), Some(ms(t0, 22_000)));
}

#[test]
fn newcomers_that_bring_the_group_to_max_are_admitted_at_once() {
    let t0 = Instant::now();
    let rules = windowed(4, 10, None);
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, true, t0, &rules);
    assert!(arrive(&mut r, "d", t0, &rules).effects.is_empty());
    let s = arrive(&mut r, "c", ms(t0, 1_000), &rules);
    assert_eq!(
        close_reason(&s),
        Some("nodes c, d are waiting to join (scale-up): with them the group reaches its maximum of 4 nodes")
    );
    assert_eq!(r.wake_at(), None);
}

#[test]
fn with_on_scale_up_checkpoint_the_batch_asks_for_one_save_after_the_window() {
    let t0 = Instant::now();
    let rules = windowed(6, 5, Some(60));
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, true, t0, &rules);
    assert!(arrive(&mut r, "c", t0, &rules).effects.is_empty());
    assert!(arrive(&mut r, "d", ms(t0, 2_000), &rules)
        .effects
        .is_empty());
    let s = step(&mut r, Input::Tick, ms(t0, 5_000), &rules);
    assert_eq!(
        s.effects,
        vec![Effect::RequestScaleUpSave {
            node: "c, d".into(),
            limit: Duration::from_secs(60),
        }]
    );
}

#[test]
fn a_loss_while_newcomers_are_held_reforms_at_once() {
    let t0 = Instant::now();
    let rules = windowed(6, 30, None);
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, true, t0, &rules);
    assert!(arrive(&mut r, "c", t0, &rules).effects.is_empty());
    let s = step(&mut r, Input::MemberGone("b".into()), ms(t0, 1_000), &rules);
    assert_eq!(s.effects, vec![Effect::SuccessorLost("b".into())]);
}

#[test]
fn without_a_last_call_each_newcomer_reforms_at_once() {
    let t0 = Instant::now();
    let rules = windowed(6, 0, None);
    let mut r = Running::enter(plan(3, &["a", "b"]), "a", None, true, t0, &rules);
    let s = arrive(&mut r, "c", t0, &rules);
    assert_eq!(
        close_reason(&s),
        Some("node c is waiting to join (scale-up)")
    );
    assert_eq!(r.arrivals, None);
}

// ---- what the core's own effects read, judged here ----

#[test]
fn a_decided_interval_without_a_save_clock_changes_nothing() {
    let t0 = Instant::now();
    let mut r = running("a", t0, &rules());
    let before = r.clone();
    let s = step(
        &mut r,
        Input::IntervalDecided(Duration::from_secs(60)),
        t0,
        &rules(),
    );
    assert_eq!((r, s), (before, Step::nothing("")));
}

#[test]
fn a_written_scale_up_save_holds_the_newcomer_and_its_deadline_wakes_the_session() {
    let t0 = Instant::now();
    let r0 = with_save(30);
    let mut r = running("a", t0, &r0);
    let s = step(
        &mut r,
        Input::ScaleUpSaveWritten {
            node: "d".into(),
            latest_before: "ckpt-1".into(),
            limit: Duration::from_secs(30),
        },
        ms(t0, 200),
        &r0,
    );
    assert!(s.effects.is_empty() && !s.ends);
    assert!(s.reason.contains("up to 30 s"), "{}", s.reason);
    assert_eq!(
        r.scale_up,
        Some(PendingScaleUp {
            node: "d".into(),
            latest_before: "ckpt-1".into(),
            deadline: ms(t0, 30_200),
        })
    );
    assert_eq!(r.wake_at(), Some(ms(t0, 30_200)));
}

#[test]
fn nobody_waiting_calls_off_a_pending_scale_up_once() {
    let t0 = Instant::now();
    let mut r = running("a", t0, &with_save(30));
    r.scale_up_requested("d", "ckpt-1".into(), t0, Duration::from_secs(30));
    let first = step(&mut r, Input::NobodyWaits, ms(t0, 1), &rules());
    assert!(first.reason.contains("called off"), "{}", first.reason);
    assert_eq!(r.scale_up, None);
    let again = step(&mut r, Input::NobodyWaits, ms(t0, 2), &rules());
    assert_eq!(again, Step::nothing(""));
}
