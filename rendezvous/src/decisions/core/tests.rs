//! Tests of the round decision on synthetic instants.

use super::*;

fn cand(id: &str) -> Candidate {
    Candidate::local(id, 2)
}

fn cfg(min: usize, max: usize) -> RoundConfig {
    RoundConfig {
        min_nodes: min,
        max_nodes: max,
        last_call: Duration::from_secs(30),
        join_timeout: Duration::from_secs(600),
        settle: DEFAULT_SETTLE,
    }
}

fn reform(t0: Instant, nodes: &[&str], outstanding: &[&str]) -> RoundView {
    RoundView {
        opened_at: t0,
        min_reached_at: Some(t0),
        candidates: nodes.iter().map(|n| cand(n)).collect(),
        outstanding: Some(outstanding.iter().map(|s| s.to_string()).collect()),
        newcomers: 0,
        running: None,
    }
}

#[test]
fn a_reform_with_every_survivor_back_and_nobody_new_forms_at_once() {
    let t0 = Instant::now();
    let view = reform(t0, &["a", "b"], &[]);
    match decide(&view, t0, &cfg(2, 3)) {
        Decision::Form {
            admitted, reason, ..
        } => {
            assert_eq!(admitted.len(), 2);
            assert!(
                reason.starts_with("every surviving member rejoined with 2 nodes"),
                "{reason}"
            );
        }
        d => panic!("no idle window when nobody else is expected: {d:?}"),
    }
}

#[test]
fn a_reform_with_newcomers_waits_the_settle_window_to_batch_more_arrivals() {
    let t0 = Instant::now();
    let mut view = reform(t0, &["a", "b", "new"], &[]);
    view.newcomers = 1;
    match decide(&view, t0 + Duration::from_millis(300), &cfg(2, 4)) {
        Decision::Wait { reason, wake_at } => {
            assert_eq!(wake_at, t0 + DEFAULT_SETTLE, "not the 30 s last call");
            assert!(
                reason
                    .contains("every surviving member is back with 1 newcomer(s), forming in 1 s"),
                "{reason}"
            );
        }
        d => panic!("{d:?}"),
    }
    match decide(&view, t0 + DEFAULT_SETTLE, &cfg(2, 4)) {
        Decision::Form {
            admitted, reason, ..
        } => {
            assert_eq!(admitted.len(), 3);
            assert!(
                reason.starts_with("every surviving member rejoined (and 1 newcomer) with 3 nodes"),
                "{reason}"
            );
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn a_reform_waits_for_live_members_up_to_the_last_call() {
    let t0 = Instant::now();
    let view = reform(t0, &["a", "b"], &["c"]);
    match decide(&view, t0 + Duration::from_secs(5), &cfg(2, 3)) {
        Decision::Wait { reason, wake_at } => {
            assert_eq!(wake_at, t0 + Duration::from_secs(30));
            assert!(
                reason.contains("waiting for 1 member(s) of the last generation to rejoin [c]"),
                "{reason}"
            );
        }
        d => panic!("{d:?}"),
    }
    assert!(matches!(
        decide(&view, t0 + Duration::from_secs(30), &cfg(2, 3)),
        Decision::Form { .. }
    ));
}

#[test]
fn the_first_formation_still_waits_out_the_last_call() {
    let t0 = Instant::now();
    let mut view = reform(t0, &["a", "b"], &[]);
    view.outstanding = None;
    assert!(matches!(
        decide(&view, t0 + DEFAULT_SETTLE, &cfg(2, 3)),
        Decision::Wait { .. }
    ));
    // A settle window longer than the last call never delays a formation.
    let mut c = cfg(2, 3);
    c.last_call = Duration::from_millis(100);
    let mut view = reform(t0, &["a", "b", "new"], &[]);
    view.newcomers = 1;
    assert!(matches!(
        decide(&view, t0 + Duration::from_millis(100), &c),
        Decision::Form { .. }
    ));
}

#[test]
fn single_node_forms_immediately() {
    let t0 = Instant::now();
    let view = RoundView {
        opened_at: t0,
        min_reached_at: Some(t0),
        candidates: vec![cand("a")],
        outstanding: None,
        newcomers: 0,
        running: None,
    };
    assert!(matches!(
        decide(&view, t0, &RoundConfig::single_node()),
        Decision::Form { .. }
    ));
}

#[test]
fn waits_for_min_then_last_call_then_forms() {
    let t0 = Instant::now();
    let c = cfg(2, 3);
    let mut view = RoundView {
        opened_at: t0,
        min_reached_at: None,
        candidates: vec![cand("a")],
        outstanding: None,
        newcomers: 0,
        running: None,
    };
    match decide(&view, t0 + Duration::from_secs(5), &c) {
        Decision::Wait { reason, wake_at } => {
            assert!(reason.contains("waiting for 1 more node (1/2)"), "{reason}");
            assert_eq!(wake_at, t0 + Duration::from_secs(600));
        }
        d => panic!("{d:?}"),
    }
    view.candidates.push(cand("b"));
    view.min_reached_at = Some(t0 + Duration::from_secs(10));
    match decide(&view, t0 + Duration::from_secs(28), &c) {
        Decision::Wait { reason, .. } => {
            assert!(reason.contains("last call in 12 s"), "{reason}")
        }
        d => panic!("{d:?}"),
    }
    match decide(&view, t0 + Duration::from_secs(40), &c) {
        Decision::Form {
            admitted, standby, ..
        } => {
            assert_eq!(admitted.len(), 2);
            assert!(standby.is_empty());
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn max_forms_at_once_and_extra_become_standbys() {
    let t0 = Instant::now();
    let view = RoundView {
        opened_at: t0,
        min_reached_at: Some(t0),
        candidates: vec![cand("a"), cand("b"), cand("c")],
        outstanding: None,
        newcomers: 0,
        running: None,
    };
    match decide(&view, t0, &cfg(1, 2)) {
        Decision::Form {
            admitted, standby, ..
        } => {
            assert_eq!(
                admitted
                    .iter()
                    .map(|c| c.node_id.as_str())
                    .collect::<Vec<_>>(),
                ["a", "b"]
            );
            assert_eq!(standby[0].node_id, "c");
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn join_timeout_fails_with_who_came() {
    let t0 = Instant::now();
    let view = RoundView {
        opened_at: t0,
        min_reached_at: None,
        candidates: vec![cand("a")],
        outstanding: None,
        newcomers: 0,
        running: None,
    };
    match decide(&view, t0 + Duration::from_secs(600), &cfg(3, 3)) {
        Decision::Fail { reason, cause } => {
            assert_eq!(cause, FailCause::JoinTimeout);
            assert!(reason.contains("only 1 of min 3"), "{reason}");
            assert!(reason.contains("[a]"), "{reason}");
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn a_set_due_to_form_that_cannot_be_ranked_fails_at_once_for_all() {
    let t0 = Instant::now();
    let mut broken = cand("b");
    broken.slots = 0;
    let view = RoundView {
        opened_at: t0,
        min_reached_at: Some(t0),
        candidates: vec![cand("a"), broken.clone()],
        outstanding: None,
        newcomers: 0,
        running: None,
    };
    // At MAX: at once, not after the join timeout.
    match decide(&view, t0, &cfg(2, 2)) {
        Decision::Fail { reason, cause } => {
            assert_eq!(cause, FailCause::Unformable);
            assert!(reason.contains("[a, b] cannot form a group"), "{reason}");
            assert!(reason.contains("node b offers no worker slots"), "{reason}");
        }
        d => panic!("{d:?}"),
    }
    // Below MAX: it waits for the last call like any set, then fails instead of forming.
    assert!(matches!(
        decide(&view, t0 + Duration::from_secs(29), &cfg(2, 3)),
        Decision::Wait { .. }
    ));
    assert!(matches!(
        decide(&view, t0 + Duration::from_secs(30), &cfg(2, 3)),
        Decision::Fail {
            cause: FailCause::Unformable,
            ..
        }
    ));
    // Pins never make a set unformable: duplicates and gaps are an order.
    let pinned = |id: &str, r| Candidate {
        requested_node_rank: Some(r),
        ..cand(id)
    };
    let view = RoundView {
        candidates: vec![pinned("x", 2), pinned("y", 2), pinned("z", 7)],
        ..view
    };
    assert!(matches!(
        decide(&view, t0, &cfg(2, 3)),
        Decision::Form { .. }
    ));
}

fn running(g: u64, members: usize) -> Option<RunningGeneration> {
    Some(RunningGeneration {
        generation: g,
        members,
    })
}

#[test]
fn no_second_world_forms_beside_a_running_generation() {
    let t0 = Instant::now();
    // Enough standbys to reach MAX at once: still no formation while generation 4 runs.
    let view = RoundView {
        opened_at: t0,
        min_reached_at: Some(t0),
        candidates: vec![cand("d"), cand("e"), cand("f")],
        outstanding: None,
        newcomers: 0,
        running: running(4, 3),
    };
    match decide(&view, t0 + Duration::from_secs(3600), &cfg(1, 3)) {
        Decision::Wait { reason, wake_at } => {
            assert_eq!(
                reason,
                "generation 4 is running with 3 node(s); 3 node(s) standing by until it re-forms"
            );
            assert_eq!(wake_at, t0 + Duration::from_secs(3600) + PROGRESS_EVERY);
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn a_running_generation_never_fails_its_standbys_on_the_join_timeout() {
    let t0 = Instant::now();
    let view = RoundView {
        opened_at: t0,
        min_reached_at: None,
        candidates: vec![cand("d")],
        outstanding: None,
        newcomers: 0,
        running: running(2, 2),
    };
    assert!(matches!(
        decide(&view, t0 + Duration::from_secs(601), &cfg(3, 3)),
        Decision::Wait { .. }
    ));
}

#[test]
fn a_running_generation_with_only_its_members_own_joins_says_nothing() {
    let t0 = Instant::now();
    let view = RoundView {
        opened_at: t0,
        min_reached_at: None,
        candidates: vec![],
        outstanding: None,
        newcomers: 0,
        running: running(1, 2),
    };
    match decide(&view, t0, &cfg(1, 2)) {
        Decision::Wait { reason, .. } => assert_eq!(reason, ""),
        d => panic!("{d:?}"),
    }
}

#[test]
fn standbys_are_promoted_once_the_generation_stops_running() {
    let t0 = Instant::now();
    let mut view = RoundView {
        opened_at: t0,
        min_reached_at: Some(t0),
        candidates: vec![cand("a"), cand("b"), cand("d")],
        outstanding: Some(vec![]),
        newcomers: 0,
        running: running(5, 2),
    };
    assert!(matches!(
        decide(&view, t0, &cfg(2, 3)),
        Decision::Wait { .. }
    ));
    view.running = None;
    match decide(&view, t0, &cfg(2, 3)) {
        Decision::Form { admitted, .. } => assert_eq!(admitted.len(), 3),
        d => panic!("{d:?}"),
    }
}

#[test]
fn the_lines_of_a_ten_thousand_node_round_stay_short() {
    // Every agent receives the progress line and the plan's "formed because" line: naming all
    // 10,000 nodes made each 110 KB.
    let t0 = Instant::now();
    let ids: Vec<String> = (0..10_000).map(|i| format!("sim-{i:05}")).collect();
    let (back, out) = ids.split_at(100);
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let waiting = reform(t0, &refs(back), &refs(out));
    match decide(&waiting, t0 + Duration::from_secs(1), &cfg(1, 10_000)) {
        Decision::Wait { reason, .. } => {
            assert!(
                reason.contains("9900 member(s) of the last generation to rejoin [sim-00100,"),
                "{reason}"
            );
            assert!(reason.contains("and 9892 more]"), "{reason}");
            assert!(reason.len() < 300, "{} bytes", reason.len());
        }
        d => panic!("{d:?}"),
    }
    let all = reform(t0, &refs(&ids), &[]);
    match decide(&all, t0, &cfg(1, 10_000)) {
        Decision::Form {
            reason, admitted, ..
        } => {
            assert_eq!(admitted.len(), 10_000);
            assert!(
                reason.starts_with("10000 of max 10000 nodes joined [sim-00000,"),
                "{reason}"
            );
            assert!(reason.ends_with("and 9992 more]"), "{reason}");
            assert!(reason.len() < 300, "{} bytes", reason.len());
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn the_progress_line_goes_out_less_often_the_more_nodes_wait() {
    assert_eq!(progress_every(0), PROGRESS_EVERY);
    assert_eq!(progress_every(1_000), PROGRESS_EVERY);
    assert_eq!(progress_every(4_096), Duration::from_millis(4_096));
    assert_eq!(progress_every(10_000), PROGRESS_EVERY_MAX);
    assert_eq!(progress_every(usize::MAX), PROGRESS_EVERY_MAX);
    // At most PROGRESS_LINES_PER_SECOND lines a second relayed, below the cap.
    for n in [1_500, 4_096, 9_999] {
        let per_second = n as f64 / progress_every(n).as_secs_f64();
        assert!(
            per_second <= PROGRESS_LINES_PER_SECOND as f64 + 1.0,
            "{n}: {per_second}"
        );
    }
}

#[test]
fn a_progress_line_is_due_when_its_state_changes_or_after_a_quiet_while() {
    let t0 = Instant::now();
    let line = |left: u64| format!("waiting for 1 more node (2/3), join timeout in {left} s");
    // The first line, and a changed state, at once.
    assert!(progress_due(&line(600), "", None, t0));
    assert!(progress_due(
        "2/3 nodes joined (min 2), last call in 30 s",
        &line(590),
        Some(t0),
        t0 + Duration::from_secs(1)
    ));
    // Only the countdown moved: kept back ...
    assert!(!progress_due(
        &line(590),
        &line(600),
        Some(t0),
        t0 + Duration::from_secs(10)
    ));
    // ... until PROGRESS_REPEAT passed, so a long wait below MIN is seen to go on.
    assert!(progress_due(
        &line(570),
        &line(600),
        Some(t0),
        t0 + PROGRESS_REPEAT
    ));
    // An empty line never is.
    assert!(!progress_due("", &line(600), None, t0 + PROGRESS_REPEAT));
}
