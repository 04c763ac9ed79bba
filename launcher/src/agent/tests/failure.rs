//! Worker failures, the restart decision, success and the exit barrier.

#[allow(unused_imports)]
use super::*;

#[test]
fn worker_failure_with_budget_left_restarts_the_group() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    let fx = t.ev(Event::FailureDecision {
        restart: true,
        restarts: restarts(1, &["generation 1: rank 1"]),
        cause: None,
    });
    assert!(
        logged(&fx, "restarting the worker group (1/3 restarts used)"),
        "{fx:?}"
    );
    assert_eq!(
        fx.last(),
        Some(&Effect::Join {
            fresh: true,
            after: 1
        })
    );
    assert!(matches!(
        t.phase(),
        Phase::Forming {
            rejoin_at: None,
            ..
        }
    ));
}

#[test]
fn worker_failure_with_budget_spent_prints_the_summary_and_exits_1() {
    let mut t = T::running(1, 1);
    report_failure(&mut t);
    let history = ["generation 1: rank 0", "generation 2: rank 1"];
    let fx = t.ev(Event::FailureDecision {
        restart: false,
        restarts: restarts(3, &history),
        cause: None,
    });
    assert_eq!(
        fx,
        vec![Effect::Summarize(
            history.iter().map(|s| s.to_string()).collect()
        )]
    );
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::WorkerFailure)));
}

#[test]
fn an_end_decided_by_another_node_failure_prints_it_after_this_node_summary() {
    for (node, named) in [("n1", true), ("n0", false)] {
        let mut t = T::running(1, 2);
        report_failure(&mut t);
        let cause = drun_rendezvous::decisions::root_cause::RootCause {
            node: node.into(),
            rank: 3,
            ..Default::default()
        };
        let fx = t.ev(Event::FailureDecision {
            restart: false,
            restarts: restarts(0, &[]),
            cause: Some(cause.clone()),
        });
        let mut want = vec![Effect::Summarize(Vec::new())];
        if named {
            want.push(Effect::RemoteCause(cause));
        }
        assert_eq!(fx, want, "{node}");
        assert_eq!(t.done(), Some(&End::Exit(AgentExit::WorkerFailure)));
    }
}

#[test]
fn a_run_another_node_ended_while_this_failure_waited_names_that_node_when_the_session_closes() {
    // Both nodes' workers failed at once; the other node's failure ended the run, and this
    // node's session closed without answering its report.
    let cause = drun_rendezvous::decisions::root_cause::RootCause {
        node: "n1".into(),
        rank: 3,
        ..Default::default()
    };
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    let mut e = end(false);
    e.root_cause = Some(cause.clone());
    assert_eq!(t.ev(Event::Finished(e.clone())), vec![]);
    assert!(matches!(t.phase(), Phase::Reporting(_)));
    let fx = t.feed(Input::SessionClosed);
    assert_eq!(
        fx,
        vec![
            Effect::Summarize(Vec::new()),
            Effect::RemoteCause(cause.clone())
        ]
    );
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::WorkerFailure)));

    // The decision, when it comes after the end, still decides (it carries the history).
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    t.ev(Event::Finished(e));
    let fx = t.ev(Event::FailureDecision {
        restart: false,
        restarts: restarts(0, &["generation 1: rank 3"]),
        cause: Some(cause.clone()),
    });
    assert_eq!(
        fx,
        vec![
            Effect::Summarize(vec!["generation 1: rank 3".into()]),
            Effect::RemoteCause(cause)
        ]
    );
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::WorkerFailure)));
}

#[test]
fn a_failure_caused_by_a_lost_node_waits_for_the_reason_and_spends_nothing() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    // Budget unchanged (0 used, as the plan says): not the workers' own failure.
    let fx = t.ev(Event::FailureDecision {
        restart: true,
        restarts: restarts(0, &[]),
        cause: None,
    });
    assert!(fx.is_empty());
    assert_eq!(t.machine().deadline(), Some(t.now + REFORM_REASON_WAIT));
    let fx = t.ev(Event::Reform {
        generation: 1,
        reason: "node n1 was lost".into(),
    });
    assert!(
        logged(
            &fx,
            "re-forming the group: node n1 was lost; the restart budget is not spent (0/3 used)"
        ),
        "{fx:?}"
    );
    assert_eq!(
        fx.last(),
        Some(&Effect::Join {
            fresh: true,
            after: 1
        })
    );
}

#[test]
fn a_reason_that_never_comes_is_a_membership_change() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    t.ev(Event::FailureDecision {
        restart: true,
        restarts: restarts(0, &[]),
        cause: None,
    });
    assert!(t.after(REFORM_REASON_WAIT / 2).is_empty());
    let fx = t.after(REFORM_REASON_WAIT);
    assert!(
        logged(&fx, "re-forming the group: a membership change"),
        "{fx:?}"
    );
    assert!(matches!(t.phase(), Phase::Forming { .. }));
}

#[test]
fn fenced_while_reporting_joins_again_as_a_newcomer() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    let fx = t.ev(Event::Fenced("lease expired".into()));
    assert!(
        logged(&fx, "fenced while reporting it: lease expired"),
        "{fx:?}"
    );
    assert_eq!(
        fx.last(),
        Some(&Effect::Join {
            fresh: true,
            after: 1
        })
    );
}

#[test]
fn an_unreachable_rendezvous_leaves_the_failure_primary() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    let why = format!("{} for 10 s", crate::rdzv::grpc::UNREACHABLE);
    let fx = t.ev(Event::Fenced(why.clone()));
    assert_eq!(
        fx,
        vec![
            Effect::Also(format!(
                "could not report the failure to the rendezvous: {why}"
            )),
            Effect::Summarize(Vec::new()),
        ]
    );
    // The budget was never consulted: exit 3 (rendezvous), not 1 (budget spent).
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Rendezvous)));
}

#[test]
fn a_node_cut_off_from_its_peers_too_joins_again_instead_of_ending_on_its_failure() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    let why = format!(
        "{}: {} for 4 s",
        crate::rdzv::grpc::CUT_OFF,
        crate::rdzv::grpc::UNREACHABLE
    );
    let fx = t.ev(Event::Fenced(why));
    assert!(
        logged(&fx, "the group went on without this node: joining again"),
        "{fx:?}"
    );
    assert_eq!(
        fx.last(),
        Some(&Effect::Join {
            fresh: true,
            after: 1
        })
    );
    assert_eq!(t.done(), None);
}

#[test]
fn all_workers_succeed_then_the_node_reports_and_awaits_the_end() {
    let mut t = T::running(1, 2);
    let fx = t.feed(Input::Workers(Workers {
        all_succeeded: true,
        ..Workers::default()
    }));
    assert_eq!(fx, vec![Effect::Stop(Signal::SIGTERM)]);
    let fx = t.workers_gone(None);
    assert_eq!(fx.first(), Some(&Effect::ReleasePort));
    assert_eq!(fx.last(), Some(&Effect::Send(Request::Succeeded(1))));
    assert_eq!(t.machine().deadline(), Some(t.now + PEER_WAIT));
    // The last step is sealed as the workers end: it is said (it was not, while the node
    // awaited the end).
    let fx = t.ev(Event::Sealed("0042-0002".into()));
    assert!(
        logged(&fx, "checkpoint step 42 (generation 2) sealed"),
        "{fx:?}"
    );
    t.ev(Event::Finished(end(true)));
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Success)));
}

#[test]
fn peers_that_never_finish_make_a_partial_success_a_failure() {
    let mut t = T::running(1, 2);
    t.feed(Input::Workers(Workers {
        all_succeeded: true,
        ..Workers::default()
    }));
    t.workers_gone(None);
    let fx = t.after(PEER_WAIT);
    assert!(
        matches!(&fx[..], [Effect::Send(Request::Failed { description, .. })]
        if description.starts_with("partial success: the workers of node n0 finished"))
    );
    let fx = t.ev(Event::FailureDecision {
        restart: false,
        restarts: restarts(0, &[]),
        cause: None,
    });
    assert!(matches!(&fx[..], [Effect::Say(l)] if l.starts_with("drun: partial success")));
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::WorkerFailure)));
}

#[test]
fn local_workers_still_running_after_peer_exit_wait_are_a_partial_success() {
    let mut t = T::running(1, 1);
    let line = "ranks [0] exited 0 but ranks [1] still ran after --peer-exit-wait 30 s";
    let fx = t.feed(Input::Workers(Workers {
        running: true,
        first_success: Some((t.now, line.into())),
        ..Workers::default()
    }));
    assert!(fx.is_empty());
    assert_eq!(t.machine().deadline(), Some(t.now + PEER_WAIT));
    assert_eq!(t.after(PEER_WAIT), vec![Effect::Stop(Signal::SIGTERM)]);
    let fx = t.workers_gone(None);
    assert!(
        matches!(&fx[..], [Effect::Send(Request::Failed { description, .. })]
        if description == &format!("partial success on node n0: {line}"))
    );
}

#[test]
fn a_run_ended_by_another_node_stops_the_workers_and_exits_with_its_outcome() {
    let mut t = T::running(1, 2);
    assert_eq!(
        t.ev(Event::Finished(end(false))),
        vec![Effect::Stop(Signal::SIGTERM)]
    );
    let fx = t.workers_gone(None);
    assert!(logged(&fx, "drun: run r failed"), "{fx:?}");
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::WorkerFailure)));
}

#[test]
fn a_run_ended_because_its_rendezvous_went_away_stops_the_workers_and_exits_3() {
    let mut t = T::running(1, 2);
    let mut e = end(false);
    e.retryable = true;
    e.reason = "the agent hosting the rendezvous (n1) stopped by SIGTERM".into();
    assert_eq!(
        t.ev(Event::Finished(e)),
        vec![Effect::Stop(Signal::SIGTERM)]
    );
    let fx = t.workers_gone(None);
    assert!(
        logged(
            &fx,
            "drun: run r ended: the agent hosting the rendezvous (n1)"
        ),
        "{fx:?}"
    );
    assert!(!logged(&fx, "failed"), "not the training's failure: {fx:?}");
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Rendezvous)));
}

#[test]
fn an_agent_told_to_stop_as_its_rendezvous_went_away_ends_as_its_signal_says() {
    let mut t = T::running(1, 2);
    let mut e = end(false);
    e.retryable = true;
    t.ev(Event::Finished(e));
    t.feed(Input::Signal(Signal::SIGTERM));
    t.workers_gone(None);
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Signal(15))));
}

#[test]
fn a_run_ended_by_another_node_names_that_node_root_cause_before_the_failure_line() {
    let cause = drun_rendezvous::decisions::root_cause::RootCause {
        node: "n1".into(),
        rank: 3,
        exitcode: 7,
        message: "ValueError: boom".into(),
        ..Default::default()
    };
    for (node, named) in [("n1", true), ("n0", false)] {
        let mut t = T::running(1, 2);
        let mut e = end(false);
        e.root_cause = Some(drun_rendezvous::decisions::root_cause::RootCause {
            node: node.into(),
            ..cause.clone()
        });
        t.ev(Event::Finished(e));
        let fx = t.workers_gone(None);
        let remote = fx
            .iter()
            .position(|f| matches!(f, Effect::RemoteCause(c) if c.node == "n1" && c.rank == 3));
        // This node's own failure is in its own summary: not repeated as a remote cause.
        assert_eq!(remote.is_some(), named, "{node}: {fx:?}");
        let line = fx
            .iter()
            .position(|f| matches!(f, Effect::Say(l) if l.starts_with("drun: run r failed")));
        assert!(line > remote, "{fx:?}");
    }
}

#[test]
fn a_session_that_closes_after_local_success_is_a_success() {
    let mut t = T::running(1, 1);
    t.feed(Input::Workers(Workers {
        all_succeeded: true,
        ..Workers::default()
    }));
    t.workers_gone(None);
    t.feed(Input::SessionClosed);
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Success)));
}

#[test]
fn a_hang_stops_the_group_and_is_reported_as_its_failure() {
    let mut t = T::running(1, 1);
    let line = "hang: rank 1 on node n0 made no progress for 5.0 s (last step 37)";
    assert_eq!(
        t.feed(Input::Hung(line.into())),
        vec![Effect::Stop(Signal::SIGTERM)]
    );
    let fx = t.workers_gone(None);
    assert_eq!(
        fx,
        vec![Effect::Send(Request::Failed {
            generation: 1,
            description: line.into(),
            cause: None,
        })]
    );
    // A hang judged while not running (already stopping) changes nothing.
    assert!(t.feed(Input::Hung(line.into())).is_empty());
}
