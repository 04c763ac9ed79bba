//! Checkpoints: preemption and scale-up saves, resume verification, the worker API.

#[allow(unused_imports)]
use super::*;

#[test]
fn a_reform_during_a_preemption_save_asks_the_next_generation_again() {
    let mut t = T::running(1, 2);
    let fx = t.feed(Input::Signal(Signal::SIGUSR1));
    let reason = "SIGUSR1 (preemption warning) on node n0".to_string();
    assert_eq!(
        fx.last(),
        Some(&Effect::Send(Request::Preempt {
            generation: 1,
            reason: reason.clone(),
        }))
    );
    t.ev(save(&reason, "0004-0001", false));
    assert_eq!(
        t.feed(Input::Api),
        vec![Effect::Serve { should_save: true }]
    );
    t.ev(Event::Reform {
        generation: 1,
        reason: "node n1 was lost".into(),
    });
    t.workers_gone(None);
    t.ev(Event::Formed(plan(2, 1, 0)));
    t.feed(Input::Verified(Checked::Use(None)));
    let fx = t.feed(Input::Spawned);
    assert!(fx.contains(&Effect::Send(Request::Preempt {
        generation: 2,
        reason,
    })));
    // The new generation starts without a request of its own until the session repeats it.
    assert_eq!(
        t.feed(Input::Api),
        vec![Effect::Serve { should_save: false }]
    );
}

/// Chaos seed 35 (torch, preemption): a warning that arrives while the group restarts after a
/// worker failure (stopping, reporting or forming) is kept and asked of the next generation;
/// it was dropped ("received SIGUSR1 before workers started; nothing to relay").
#[test]
fn a_preemption_warning_between_generations_is_asked_of_the_next_one() {
    let reason = "SIGUSR1 (preemption warning) on node n0".to_string();
    for when in ["stopping", "reporting", "forming"] {
        let mut t = T::running(1, 2);
        let warn = |t: &mut T| {
            let fx = t.feed(Input::Signal(Signal::SIGUSR1));
            assert!(
                logged(&fx, "preemption warning; asking every rank"),
                "{when}: {fx:?}"
            );
            assert!(!fx.iter().any(|e| matches!(e, Effect::Send(_))), "{fx:?}");
        };
        t.feed(Input::Workers(failed()));
        if when == "stopping" {
            warn(&mut t);
        }
        t.workers_gone(Some("rank 1 exited with 3 on node n0"));
        if when == "reporting" {
            warn(&mut t);
        }
        t.ev(Event::FailureDecision {
            restart: true,
            restarts: restarts(1, &["generation 1: rank 1"]),
            cause: None,
        });
        if when == "forming" {
            warn(&mut t);
        }
        t.ev(Event::Formed(plan(2, 1, 0)));
        t.feed(Input::Verified(Checked::Use(None)));
        let fx = t.feed(Input::Spawned);
        assert!(
            fx.contains(&Effect::Send(Request::Preempt {
                generation: 2,
                reason: reason.clone(),
            })),
            "{when}: {fx:?}"
        );
    }
}

#[test]
fn a_preemption_warning_saves_then_stops_and_requeues() {
    let mut t = T::running(1, 1);
    t.feed(Input::Signal(Signal::SIGUSR1));
    let fx = t.ev(save(
        "SIGUSR1 (preemption warning) on node n0",
        "0004-0001",
        false,
    ));
    assert!(
        fx.contains(&Effect::PersistNow),
        "the preemption's step goes to the disk at full speed: {fx:?}"
    );
    // An older seal does not fulfil the request.
    assert!(!t
        .ev(Event::Sealed("0004-0001".into()))
        .contains(&Effect::Stop(Signal::SIGTERM)));
    let fx = t.ev(Event::Sealed("0006-0001".into()));
    assert!(
        logged(
            &fx,
            "drun: preempted: checkpoint step 6 (generation 1) sealed"
        ),
        "{fx:?}"
    );
    assert_eq!(fx.last(), Some(&Effect::Stop(Signal::SIGTERM)));
    assert_eq!(t.workers_gone(None), vec![Effect::Requeue]);
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Preempted)));
}

#[test]
fn a_scale_up_save_ends_with_its_seal_and_the_workers_go_on() {
    let mut t = T::running(1, 1);
    let fx = t.ev(save("node n1 waits to join", "0004-0001", true));
    assert!(
        fx.contains(&Effect::PersistNow),
        "the newcomer waits for the seal: the step goes to the disk at full speed: {fx:?}"
    );
    assert_eq!(
        t.feed(Input::Api),
        vec![Effect::Serve { should_save: true }]
    );
    let fx = t.ev(Event::Sealed("0008-0001".into()));
    assert!(!fx.iter().any(|e| matches!(e, Effect::Stop(_))));
    assert!(matches!(
        t.phase(),
        Phase::Running {
            save: Save::Idle,
            ..
        }
    ));
    assert_eq!(
        t.feed(Input::Api),
        vec![Effect::Serve { should_save: false }]
    );
}

#[test]
fn a_lease_lost_during_resume_verification_joins_again_without_spawning() {
    let mut t = T::new();
    t.ev(Event::Formed(plan(2, 2, 0)));
    let fx = t.ev(Event::Fenced("lease lost".into()));
    assert_eq!(
        fx.last(),
        Some(&Effect::Join {
            fresh: true,
            after: 2
        })
    );
    // The verdict that arrives afterwards is moot.
    assert!(t.feed(Input::Verified(Checked::Use(None))).is_empty());
    assert!(matches!(t.phase(), Phase::Forming { .. }));
}

#[test]
fn a_bad_resume_point_is_marked_and_the_group_reforms_onto_the_previous() {
    let mut t = T::new();
    t.ev(Event::Formed(plan(2, 1, 0)));
    let fx = t.feed(Input::Verified(Checked::Bad {
        id: "0008-0001".into(),
        reason: "rank0.bin has 3 bytes".into(),
    }));
    assert_eq!(
        fx,
        vec![Effect::Send(Request::MarkBad {
            generation: 2,
            id: "0008-0001".into(),
            reason: "rank0.bin has 3 bytes".into(),
        })]
    );
    assert!(matches!(t.phase(), Phase::AwaitingReform { .. }));
    let fx = t.ev(Event::Reform {
        generation: 2,
        reason: "checkpoint marked bad".into(),
    });
    assert_eq!(
        fx,
        vec![Effect::Join {
            fresh: true,
            after: 2
        }]
    );
}

#[test]
fn the_worker_api_is_refused_while_no_group_runs() {
    let mut t = T::new();
    assert_eq!(t.feed(Input::Api), vec![Effect::Refuse]);
    assert!(t.feed(Input::Monitor).is_empty());
    let mut t = T::running(1, 1);
    assert_eq!(t.feed(Input::Monitor), vec![Effect::CheckStalled]);
}

#[test]
fn commits_reach_the_ledger_only_while_workers_run() {
    let committed = || Event::Committed {
        generation: 1,
        step: 4,
        result: Err(drun_rendezvous::CommitRefused::Said("stale".into())),
    };
    let mut t = T::new();
    assert!(t.ev(committed()).is_empty());
    let mut t = T::running(1, 1);
    assert!(matches!(
        &t.ev(committed())[..],
        [Effect::Committed { step: 4, .. }]
    ));
}

#[test]
fn an_interval_save_asks_until_a_newer_seal_and_yields_to_a_preemption() {
    let mut t = T::running(1, 1);
    let Event::SaveRequested(mut req) = save(
        "the checkpoint interval (4.5s) since the last seal passed",
        "0004-0001",
        false,
    ) else {
        unreachable!()
    };
    req.interval = true;
    t.ev(Event::SaveRequested(req.clone()));
    assert_eq!(
        t.feed(Input::Api),
        vec![Effect::Serve { should_save: true }]
    );
    t.ev(Event::Sealed("0004-0001".into()));
    assert_eq!(
        t.feed(Input::Api),
        vec![Effect::Serve { should_save: true }],
        "an older seal does not fulfil it"
    );
    let fx = t.ev(Event::Sealed("0006-0001".into()));
    assert!(
        !fx.contains(&Effect::Stop(Signal::SIGTERM)),
        "the workers carry on"
    );
    assert_eq!(
        t.feed(Input::Api),
        vec![Effect::Serve { should_save: false }]
    );
    // During an interval save a preemption warning takes over: its seal stops the workers.
    req.latest_before = "0006-0001".into();
    t.ev(Event::SaveRequested(req));
    t.ev(save(
        "SIGUSR1 (preemption warning) on node n0",
        "0006-0001",
        false,
    ));
    let fx = t.ev(Event::Sealed("0008-0001".into()));
    assert!(fx.contains(&Effect::Stop(Signal::SIGTERM)) || logged(&fx, "drun: preempted"));
}

#[test]
fn a_step_staged_in_memory_answers_an_interval_request_for_this_nodes_ranks() {
    use crate::agent::state::Save;
    let id = drun_rendezvous::ledger::manifest_id;
    let interval = Save::Interval {
        latest_before: id(8, 1),
    };
    assert!(interval.asks(None), "nothing staged: save");
    assert!(interval.asks(Some(&id(8, 1))), "the step the request saw");
    assert!(
        !interval.asks(Some(&id(12, 1))),
        "a newer step staged: its seal follows once persisted"
    );
    let scale_up = Save::ScaleUp {
        latest_before: id(8, 1),
    };
    assert!(!scale_up.asks(Some(&id(9, 2))));
    let preempt = Save::Preempt {
        latest_before: id(8, 1),
    };
    assert!(preempt.asks(None), "nothing staged: save");
    assert!(preempt.asks(Some(&id(8, 1))), "the step the request saw");
    assert!(
        !preempt.asks(Some(&id(12, 1))),
        "a newer step staged answers a preemption too: its seal (persisted at full speed) stops the workers"
    );
    assert!(!Save::Idle.asks(None));
}
