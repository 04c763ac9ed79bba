//! Unit tests of the session's transitions: synthetic instants, no store, no runtime.

use std::time::Duration;

use tokio::time::Instant;

use super::step;
use crate::session::generation::{self, Rules, Running};
use crate::session::liveness::Knock;
use crate::session::protocol::{Event, Request, RunEnd};
use crate::session::standby::{Look, Reach, Seen};
use crate::session::state::{
    Abandoned, Attempt, Attribution, BudgetSeen, BudgetStage, Decided, Effect, Failure, Input,
    LeaseChange, LossLook, Opened, Params, Phase, Read, Retry, Session, Spending, ATTRIBUTION_POLL,
    REQUEST_TRIES, RETRY_PAUSE,
};
use crate::store::reports::ReportKind;
use crate::{assign, Candidate, Join, Plan};

const LEASE: i64 = 0x51;

fn cand(id: &str, probe_port: u16) -> Candidate {
    Candidate {
        master_port: 1,
        probe_port,
        ..Candidate::local(id, 2)
    }
}

fn join(id: &str) -> Join {
    cand(id, 0).into()
}

/// Generation `g` of the given nodes (node ranks follow the ids' order).
fn plan(g: u64, nodes: &[&str]) -> Plan {
    let cands: Vec<Candidate> = nodes.iter().map(|n| cand(n, 0)).collect();
    assign("run", g, &cands, 0, 0).expect("formable")
}

fn params() -> Params {
    Params {
        node: "a".into(),
        rules: Rules {
            max_nodes: 4,
            scale_up_save: None,
            scale_up_window: Duration::ZERO,
            lease_ttl: Duration::from_secs(10),
            max_restarts: 2,
            ckpt_interval: Default::default(),
        },
        renews_itself: true,
        keep_alive: Duration::from_millis(3300),
    }
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

/// Node `a` running generation 3 of a, b, c entered at `t0`; `started`: its successor's key
/// is there.
fn running_view(t0: Instant, started: bool) -> Running {
    Running::enter(
        plan(3, &["a", "b", "c"]),
        "a",
        None,
        started,
        t0,
        &params().rules,
    )
}

fn session(phase: Phase) -> Session {
    Session {
        phase,
        lease: Some(LEASE),
        last_gen: 2,
        retry: None,
    }
}

fn idle() -> Session {
    session(Phase::Idle)
}

fn waiting(t0: Instant) -> Session {
    session(Phase::Waiting {
        join: join("a"),
        since: t0,
    })
}

fn running(t0: Instant) -> Session {
    Session {
        last_gen: 3,
        ..session(Phase::Running(running_view(t0, true)))
    }
}

fn run(s: Session, input: Input, now: Instant) -> (Session, Vec<Effect>, String) {
    step(s, input, now, &params())
}

fn request(r: Request) -> Input {
    Input::Request(r)
}

fn tried(what: Attempt, tries: u32, result: Result<Option<Phase>, Failure>) -> Input {
    Input::Tried {
        what,
        tries,
        result,
    }
}

fn down() -> Failure {
    Failure {
        transient: true,
        message: "store unavailable".into(),
    }
}

fn broken() -> Failure {
    Failure {
        transient: false,
        message: "corrupt key".into(),
    }
}

fn end(reason: &str) -> RunEnd {
    RunEnd {
        success: true,
        reason: reason.into(),
        at_ms: 7,
        root_cause: None,
        retryable: false,
        unfit: false,
    }
}

fn tries_of(fx: &[Effect]) -> Vec<(Attempt, u32)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Try { what, tries } => Some((what.clone(), *tries)),
            _ => None,
        })
        .collect()
}

fn enter(plan: Plan, announce: bool) -> Attempt {
    Attempt::Enter {
        plan,
        before: None,
        announce,
    }
}

// ---- the agent's requests ----

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

// ---- the round's decision ----

#[test]
fn a_formed_plan_enters_its_generation_and_announces_it() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, _) = run(waiting(t0), Input::Decided(Decided::Plan(p.clone())), t0);
    assert_eq!(s.last_gen, 3);
    assert_eq!(s.phase, Phase::Idle, "the entry's outcome sets the phase");
    assert_eq!(tries_of(&fx), vec![(enter(p, true), 0)]);
}

#[test]
fn a_run_that_ended_while_waiting_releases_the_lease_and_reports_the_end() {
    let t0 = Instant::now();
    let (s, fx, _) = run(waiting(t0), Input::Decided(Decided::RunFinished), t0);
    assert_eq!(s.lease, None);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(fx, vec![Effect::Release(LEASE), Effect::ReportFinished]);
}

#[test]
fn a_run_that_ended_while_waiting_without_a_lease_releases_nothing() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..waiting(t0)
    };
    let (_, fx, _) = run(s, Input::Decided(Decided::RunFinished), t0);
    assert_eq!(fx, vec![Effect::ReportFinished]);
}

#[test]
fn a_store_error_while_waiting_joins_again_after_a_pause() {
    let t0 = Instant::now();
    let (s, fx, why) = run(
        waiting(t0),
        Input::Decided(Decided::StoreError("etcd down".into())),
        ms(t0, 40),
    );
    assert!(fx.is_empty(), "nothing at once");
    assert!(why.contains("etcd down"), "{why}");
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        s.retry,
        Some(Retry {
            what: Attempt::Join(join("a")),
            tries: 1,
            at: ms(t0, 40) + RETRY_PAUSE
        })
    );
    assert_eq!(s.wake_at(), Some(ms(t0, 540)));
    assert!(
        !s.reads_requests() && !s.reads_round(),
        "requests wait behind it"
    );
}

#[test]
fn a_store_error_while_waiting_without_a_lease_is_the_agents_error() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..waiting(t0)
    };
    let (s, fx, _) = run(s, Input::Decided(Decided::StoreError("down".into())), t0);
    assert_eq!(s.retry, None);
    assert_eq!(fx, vec![Effect::Emit(Event::Error("down".into()))]);
}

#[test]
fn a_failed_round_releases_the_lease_and_tells_the_agent() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        waiting(t0),
        Input::Decided(Decided::Failed("join timeout".into())),
        t0,
    );
    assert_eq!(s.lease, None);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        fx,
        vec![
            Effect::Release(LEASE),
            Effect::Emit(Event::Error("join timeout".into()))
        ]
    );
}

#[test]
fn a_decision_nobody_waits_for_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        running(t0),
        Input::Decided(Decided::Plan(plan(4, &["a"]))),
        t0,
    );
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
}

#[test]
fn a_line_of_the_round_reaches_the_agent_while_waiting() {
    let t0 = Instant::now();
    let line = "1/2 nodes joined (min 2), waiting for 1 more";
    let (s, fx, _) = run(waiting(t0), Input::Progress(line.into()), ms(t0, 300));
    assert_eq!(s, waiting(t0), "a line changes nothing");
    assert_eq!(fx, vec![Effect::Emit(Event::Waiting(line.into()))]);
}

#[test]
fn a_line_of_the_round_after_the_node_left_it_is_dropped() {
    let t0 = Instant::now();
    for s in [idle(), running(t0)] {
        let (after, fx, _) = run(s.clone(), Input::Progress("2/2 nodes joined".into()), t0);
        assert_eq!(after, s);
        assert!(fx.is_empty(), "{fx:?}");
    }
}

// ---- the running generation ----

#[test]
fn a_closed_generation_ends_after_its_reform_is_told() {
    let t0 = Instant::now();
    let closed = generation::Input::Closed("node c left".into());
    let (s, fx, why) = run(running(t0), Input::Watch(closed), t0);
    assert!(why.contains("node c left"));
    assert_eq!(
        fx,
        vec![Effect::Generation {
            effects: vec![generation::Effect::Emit(Event::Reform {
                generation: 3,
                reason: "node c left".into()
            })],
            ends: true
        }]
    );
    assert!(s.phase.is_running(), "until the effects are carried out");
}

#[test]
fn a_watch_event_of_no_use_does_nothing() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), Input::Watch(generation::Input::Other), t0);
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
}

#[test]
fn a_watch_event_while_idle_is_ignored() {
    let t0 = Instant::now();
    let closed = generation::Input::Closed("x".into());
    let (s, fx, _) = run(idle(), Input::Watch(closed), t0);
    assert_eq!((s, fx), (idle(), vec![]));
}

#[test]
fn a_broken_watch_enters_the_generation_again_with_the_view_it_had() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let (s, fx, _) = run(running(t0), Input::WatchBroke, ms(t0, 10));
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        tries_of(&fx),
        vec![(
            Attempt::Enter {
                plan: view.plan.clone(),
                before: Some(Box::new(view)),
                announce: false
            },
            0
        )]
    );
}

#[test]
fn a_broken_watch_after_the_generation_ended_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = run(idle(), Input::WatchBroke, t0);
    assert_eq!((s, fx), (idle(), vec![]));
}

#[test]
fn the_successors_start_deadline_is_checked_at_its_tick() {
    let t0 = Instant::now();
    let s = session(Phase::Running(running_view(t0, false)));
    assert_eq!(s.wake_at(), Some(ms(t0, 10_000)));
    let (s, fx, _) = run(s, Input::Tick, ms(t0, 9_999));
    assert!(fx.is_empty(), "not yet");
    let (s, fx, _) = run(s, Input::Tick, ms(t0, 10_000));
    assert!(matches!(
        &fx[..],
        [Effect::Generation { effects, ends: false }]
            if matches!(&effects[..], [generation::Effect::CheckSuccessorStarted { node, .. }] if node == "b")
    ));
    assert_eq!(s.wake_at(), None);
}

// ---- the lease ----

#[test]
fn the_current_lease_lost_fences_a_running_node() {
    let t0 = Instant::now();
    let (s, fx, why) = run(running(t0), Input::LeaseLost((LEASE, "expired".into())), t0);
    assert_eq!(
        s.phase,
        Phase::Fenced {
            reason: "expired".into()
        }
    );
    assert_eq!(s.lease, None);
    assert_eq!(s.last_gen, 3, "the next world must be newer");
    assert_eq!(
        fx,
        vec![
            Effect::StopKeeper,
            Effect::Emit(Event::Fenced("expired".into()))
        ]
    );
    assert_eq!(why, "expired");
}

#[test]
fn a_stale_keepers_report_changes_nothing() {
    let t0 = Instant::now();
    let (s, fx, why) = run(running(t0), Input::LeaseLost((0x99, "old".into())), t0);
    assert_eq!(s, running(t0));
    assert!(fx.is_empty());
    assert!(why.contains("earlier join"), "{why}");
}

#[test]
fn a_lease_lost_during_a_retry_fences_at_once_and_drops_the_retry() {
    let t0 = Instant::now();
    let s = Session {
        retry: Some(Retry {
            what: Attempt::Request(Request::Succeeded(3)),
            tries: 4,
            at: ms(t0, 500),
        }),
        ..running(t0)
    };
    let (s, _, _) = run(s, Input::LeaseLost((LEASE, "gone".into())), ms(t0, 100));
    assert_eq!(s.retry, None);
    assert!(matches!(s.phase, Phase::Fenced { .. }));
    assert!(s.reads_requests());
}

#[test]
fn a_lease_lost_while_waiting_fences() {
    let t0 = Instant::now();
    let (s, _, _) = run(waiting(t0), Input::LeaseLost((LEASE, "gone".into())), t0);
    assert!(matches!(s.phase, Phase::Fenced { .. }));
}

#[test]
fn a_lost_lease_after_a_release_fences_nobody() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s2, fx, _) = run(s.clone(), Input::LeaseLost((LEASE, "gone".into())), t0);
    assert_eq!((s2, fx), (s, vec![]));
}

// ---- retries and the clock ----

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

// ---- the outcomes of store work ----

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

// ---- the generation core's effects carried out ----

fn executed(run: Running, ends: bool, result: Result<Option<Phase>, Failure>) -> Input {
    Input::Executed {
        run: Box::new(run),
        ends,
        result,
        read: None,
    }
}

#[test]
fn a_generation_that_goes_on_runs_on_with_the_view_the_effects_left() {
    let t0 = Instant::now();
    let mut view = running_view(t0, true);
    view.successor_deadline = Some(ms(t0, 77));
    let (s, fx, _) = run(idle(), executed(view.clone(), false, Ok(None)), t0);
    assert!(fx.is_empty());
    assert_eq!(s.phase, Phase::Running(view));
}

#[test]
fn a_generation_that_ended_leaves_the_session_idle() {
    let t0 = Instant::now();
    let (s, _, _) = run(idle(), executed(running_view(t0, true), true, Ok(None)), t0);
    assert_eq!(s.phase, Phase::Idle);
}

#[test]
fn a_node_given_up_while_the_effects_ran_is_fenced() {
    let t0 = Instant::now();
    let fenced = Phase::Fenced {
        reason: "given up".into(),
    };
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, _, _) = run(
        s,
        executed(running_view(t0, true), false, Ok(Some(fenced.clone()))),
        t0,
    );
    assert_eq!(s.phase, fenced);
}

#[test]
fn a_generation_whose_lease_went_meanwhile_is_left() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, _, _) = run(s, executed(running_view(t0, true), false, Ok(None)), t0);
    assert_eq!(s.phase, Phase::Idle);
}

#[test]
fn an_effect_the_store_did_not_answer_rewatches_the_generation() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let (s, fx, _) = run(idle(), executed(view.clone(), false, Err(down())), t0);
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(
        tries_of(&fx),
        vec![(
            Attempt::Enter {
                plan: view.plan.clone(),
                before: Some(Box::new(view)),
                announce: false
            },
            0
        )]
    );
}

#[test]
fn an_effect_refused_by_the_store_ends_the_session() {
    let t0 = Instant::now();
    let (s, fx, _) = run(
        idle(),
        executed(running_view(t0, true), false, Err(broken())),
        t0,
    );
    assert!(s.phase.is_left());
    assert_eq!(fx, vec![Effect::Emit(Event::Error("corrupt key".into()))]);
}

// ---- standing by ----

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

// ---- a worker failure: a lost member's doing, or the workers' own ----

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

// ---- an agent whose stream ended without a leave (server-side) ----

fn server() -> Params {
    Params {
        renews_itself: false,
        ..params()
    }
}

fn on_server(s: Session, input: Input, now: Instant) -> (Session, Vec<Effect>, String) {
    step(s, input, now, &server())
}

fn abandoned(at: Option<Instant>, gone: bool, held: bool) -> Session {
    Session {
        last_gen: 3,
        ..session(Phase::Abandoned(Abandoned {
            lease: LEASE,
            at,
            gone,
            held,
        }))
    }
}

fn speaks(speaks: bool, run_silent_ms: u64) -> Input {
    Input::Speaks(Ok((speaks, Some(Duration::from_millis(run_silent_ms)))))
}

#[test]
fn an_agent_side_session_ends_with_its_agents_stream() {
    let t0 = Instant::now();
    let (s, fx, _) = run(running(t0), Input::RequestsClosed, t0);
    assert!(s.phase.is_left());
    assert!(fx.is_empty());
    assert!(!s.reads_requests());
}

#[test]
fn an_abandoned_agents_probe_port_is_knocked_on_within_the_reconnect_grace() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(running(t0), Input::RequestsClosed, t0);
    assert_eq!(s, abandoned(Some(ms(t0, 1000)), false, false));
    assert_eq!(fx, vec![Effect::Knock]);
    assert!(!s.reads_requests(), "the stream is over");
    assert_eq!(s.wake_at(), Some(ms(t0, 1000)));
}

#[test]
fn a_server_session_without_a_lease_ends_with_its_agents_stream() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, fx, _) = on_server(s, Input::RequestsClosed, t0);
    assert!(s.phase.is_left());
    assert!(fx.is_empty());
}

#[test]
fn a_closed_probe_port_cuts_the_grace_short() {
    let t0 = Instant::now();
    let s = abandoned(Some(ms(t0, 1000)), false, false);
    let (s, fx, _) = on_server(s, Input::Knocked(Knock::Gone), ms(t0, 20));
    assert_eq!(s, abandoned(None, true, false));
    assert_eq!(fx, vec![Effect::CheckSpeaks]);
}

#[test]
fn no_answer_to_the_knock_waits_out_the_grace() {
    let t0 = Instant::now();
    let s = abandoned(Some(ms(t0, 1000)), false, false);
    let (s, fx, _) = on_server(s, Input::Knocked(Knock::NoAnswer), ms(t0, 1000));
    assert!(fx.is_empty());
    let (s2, fx, _) = on_server(s.clone(), Input::Tick, ms(t0, 999));
    assert_eq!((s2, fx), (s.clone(), vec![]));
    let (s, fx, _) = on_server(s, Input::Tick, ms(t0, 1000));
    assert_eq!(fx, vec![Effect::CheckSpeaks]);
    assert_eq!(s.wake_at(), None, "one look at a time");
}

#[test]
fn an_agent_that_came_back_elsewhere_keeps_its_lease() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, true, false), speaks(false, 0), t0);
    assert!(s.phase.is_left());
    assert_eq!(s.lease, Some(LEASE), "not revoked");
    assert!(fx.is_empty());
}

#[test]
fn a_gone_agents_lease_is_revoked_at_once() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, true, false), speaks(true, 0), t0);
    assert!(s.phase.is_left());
    assert_eq!(s.lease, None);
    assert!(matches!(
        &fx[..],
        [Effect::RevokeAbandoned { lease: LEASE, why }] if why.contains("process is gone")
    ));
}

#[test]
fn an_agent_that_did_not_come_back_while_its_run_talks_loses_its_lease() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, false, false), speaks(true, 200), t0);
    assert!(s.phase.is_left());
    assert!(matches!(
        &fx[..],
        [Effect::RevokeAbandoned { lease: LEASE, why }] if why.contains("did not come back within 1 s")
    ));
}

#[test]
fn a_server_that_hears_nobody_of_the_run_holds_the_lease_and_says_so_once() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, false, false), speaks(true, 6000), t0);
    assert_eq!(s, abandoned(Some(ms(t0, 1000)), false, true));
    assert!(matches!(&fx[..], [Effect::Warn(line)] if line.contains("holding its lease")));
    let (s, fx, _) = on_server(s, Input::Tick, ms(t0, 1000));
    assert_eq!(fx, vec![Effect::CheckSpeaks]);
    let (s, fx, _) = on_server(s, speaks(true, 7000), ms(t0, 1000));
    assert!(fx.is_empty(), "said once");
    assert_eq!(s, abandoned(Some(ms(t0, 2000)), false, true));
}

#[test]
fn a_held_lease_gets_a_grace_to_come_back_once_the_run_is_heard_again() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(abandoned(None, false, true), speaks(true, 100), t0);
    assert!(fx.is_empty());
    assert_eq!(s, abandoned(Some(ms(t0, 5000)), false, false));
    let (s, _, _) = on_server(s, Input::Tick, ms(t0, 5000));
    let (s, fx, _) = on_server(s, speaks(true, 100), ms(t0, 5000));
    assert!(s.phase.is_left());
    assert!(matches!(&fx[..], [Effect::RevokeAbandoned { .. }]));
}

#[test]
fn a_look_the_store_refused_ends_the_abandoned_session() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(
        abandoned(None, false, false),
        Input::Speaks(Err(down())),
        t0,
    );
    assert!(s.phase.is_left());
    assert_eq!(
        fx,
        vec![Effect::Emit(Event::Error("store unavailable".into()))]
    );
}

#[test]
fn a_lease_lost_while_abandoned_ends_the_session_quietly() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(
        abandoned(Some(ms(t0, 1000)), false, false),
        Input::LeaseLost((LEASE, "expired".into())),
        t0,
    );
    assert!(s.phase.is_left());
    assert_eq!(s.lease, None);
    assert_eq!(fx, vec![Effect::StopKeeper]);
}

#[test]
fn a_knock_or_a_look_after_the_session_moved_on_is_ignored() {
    let t0 = Instant::now();
    let (s, fx, _) = on_server(running(t0), Input::Knocked(Knock::Gone), t0);
    assert_eq!((s, fx), (running(t0), vec![]));
    let (s, fx, _) = on_server(running(t0), speaks(true, 0), t0);
    assert_eq!((s, fx), (running(t0), vec![]));
}

// ---- whole paths ----

#[test]
fn join_form_run_and_reform_from_idle_back_to_idle() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, _) = run(idle(), request(Request::Join(join("a"), 2)), t0);
    let (what, n) = tries_of(&fx).remove(0);
    let wait = Phase::Waiting {
        join: join("a"),
        since: t0,
    };
    let (s, _, _) = run(s, tried(what, n, Ok(Some(wait))), t0);
    assert!(s.phase.is_waiting());
    let (s, fx, _) = run(s, Input::Decided(Decided::Plan(p.clone())), ms(t0, 300));
    let (what, n) = tries_of(&fx).remove(0);
    let view = Running::enter(p, "a", None, true, ms(t0, 300), &params().rules);
    let (s, _, _) = run(
        s,
        tried(what, n, Ok(Some(Phase::Running(view)))),
        ms(t0, 300),
    );
    assert_eq!(s.phase.running_generation(), Some(3));
    let closed = generation::Input::Closed("node b left".into());
    let (s, fx, _) = run(s, Input::Watch(closed), ms(t0, 900));
    let [Effect::Generation { ends: true, .. }] = &fx[..] else {
        panic!("{fx:?}")
    };
    let Phase::Running(view) = s.phase.clone() else {
        panic!()
    };
    let (s, _, _) = run(s, executed(view, true, Ok(None)), ms(t0, 900));
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(s.last_gen, 3);
}

#[test]
fn the_transitions_need_no_runtime() {
    // Every test here is a plain `#[test]`: `Instant::now()` is the only clock read, and
    // nothing sleeps. This one steps ten thousand times to show it is cheap.
    let t0 = Instant::now();
    let mut s = running(t0);
    for i in 0..10_000u64 {
        let (s2, _, _) = run(s, request(Request::KeepAlive), ms(t0, i));
        s = s2;
    }
    assert!(s.phase.is_running());
}

// ---- opening, and the lease as store work left it ----

fn opened(phase: Option<Phase>, last_gen: u64) -> Input {
    Input::Opened(Opened { phase, last_gen })
}

#[test]
fn a_session_opens_in_the_phase_its_opening_found() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let (s, fx, why) = run(
        Session::default(),
        opened(Some(Phase::Running(view.clone())), 3),
        t0,
    );
    assert_eq!((s.phase, s.last_gen, fx), (Phase::Running(view), 3, vec![]));
    assert!(why.contains("opens in generation 3"), "{why}");
}

#[test]
fn a_session_opened_after_the_run_ended_is_over() {
    let t0 = Instant::now();
    let (s, fx, _) = run(Session::default(), opened(None, 0), t0);
    assert_eq!((s.phase, fx), (Phase::Left, vec![]));
}

#[test]
fn a_session_that_opens_fenced_keeps_the_newer_last_generation_and_says_nothing_twice() {
    let t0 = Instant::now();
    let fenced = Phase::Fenced {
        reason: "lease 0x51 expired while reconnecting".into(),
    };
    let s = Session {
        lease: None,
        ..session(Phase::Idle)
    };
    // Opening told the agent already: no second Fenced event.
    let (s, fx, why) = run(s, opened(Some(fenced.clone()), 7), t0);
    assert_eq!((s.phase, s.last_gen, fx), (fenced, 7, vec![]));
    assert!(why.contains("opens fenced"), "{why}");
}

#[test]
fn an_opening_never_lowers_the_last_generation() {
    let t0 = Instant::now();
    let s = Session {
        last_gen: 5,
        ..Session::default()
    };
    let (s, _, _) = run(s, opened(Some(Phase::Idle), 2), t0);
    assert_eq!((s.phase, s.last_gen), (Phase::Idle, 5));
}

#[test]
fn a_lease_granted_by_store_work_is_held_and_the_phase_waits_for_the_outcome() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..session(Phase::Fenced {
            reason: "gone".into(),
        })
    };
    let (s, fx, why) = run(s, Input::Leased(LeaseChange::Granted(0x77)), t0);
    assert_eq!(s.lease, Some(0x77));
    assert!(matches!(s.phase, Phase::Fenced { .. }), "{:?}", s.phase);
    assert!(fx.is_empty());
    assert!(why.contains("0x77"), "{why}");
}

#[test]
fn a_lease_released_by_store_work_is_held_no_more() {
    let t0 = Instant::now();
    let (s, fx, _) = run(waiting(t0), Input::Leased(LeaseChange::Released), t0);
    assert_eq!((s.lease, fx), (None, vec![]));
    assert!(s.phase.is_waiting());
}

#[test]
fn a_lease_regranted_mid_join_replaces_the_old_one() {
    let t0 = Instant::now();
    let (s, _, _) = run(idle(), Input::Leased(LeaseChange::Granted(0x99)), t0);
    assert_eq!(s.lease, Some(0x99));
}

#[test]
fn a_lease_lost_right_after_its_grant_fences_with_the_new_lease() {
    let t0 = Instant::now();
    let s = Session {
        lease: None,
        ..idle()
    };
    let (s, _, _) = run(s, Input::Leased(LeaseChange::Granted(0x99)), t0);
    let (s, fx, _) = run(s, Input::LeaseLost((0x99, "lease expired".into())), t0);
    assert_eq!(s.lease, None);
    assert!(matches!(s.phase, Phase::Fenced { .. }), "{:?}", s.phase);
    assert!(fx.contains(&Effect::StopKeeper), "{fx:?}");
}

#[test]
fn a_fence_found_by_a_request_tells_the_agent_and_drops_the_lease() {
    let t0 = Instant::now();
    let reason = "partitioned from its peers: node 1 hears nobody".to_string();
    let fenced = Phase::Fenced {
        reason: reason.clone(),
    };
    let what = Attempt::Request(Request::Report {
        kind: ReportKind::Peers,
        json: "{}".into(),
    });
    let (s, fx, why) = run(running(t0), tried(what, 0, Ok(Some(fenced.clone()))), t0);
    assert_eq!((s.phase, s.lease), (fenced, None));
    assert_eq!(
        fx,
        vec![Effect::StopKeeper, Effect::Emit(Event::Fenced(reason))]
    );
    assert!(why.starts_with("fenced: partitioned"), "{why}");
}

#[test]
fn a_fence_found_entering_a_generation_tells_the_agent() {
    let t0 = Instant::now();
    let reason = "lease lost before joining generation 3".to_string();
    let what = Attempt::Enter {
        plan: plan(3, &["a", "b"]),
        before: None,
        announce: true,
    };
    let (s, fx, _) = run(
        idle(),
        tried(
            what,
            0,
            Ok(Some(Phase::Fenced {
                reason: reason.clone(),
            })),
        ),
        t0,
    );
    assert!(matches!(s.phase, Phase::Fenced { .. }));
    assert!(fx.contains(&Effect::Emit(Event::Fenced(reason))), "{fx:?}");
}

#[test]
fn a_node_given_up_while_the_effects_ran_hears_it_once() {
    let t0 = Instant::now();
    let reason = "given up: its agent did not answer".to_string();
    let fenced = Phase::Fenced {
        reason: reason.clone(),
    };
    let (s, fx, _) = run(
        idle(),
        executed(running_view(t0, true), false, Ok(Some(fenced.clone()))),
        t0,
    );
    assert_eq!((s.phase, s.lease), (fenced, None));
    let told = fx
        .iter()
        .filter(|e| matches!(e, Effect::Emit(Event::Fenced(_))))
        .count();
    assert_eq!(told, 1, "{fx:?}");
}

// ---- what the generation core's effects read, judged by it ----

fn read_back(
    run: Running,
    ends: bool,
    input: generation::Input,
    rest: Vec<generation::Effect>,
) -> Input {
    Input::Executed {
        run: Box::new(run),
        ends,
        result: Ok(None),
        read: Some(Read { input, rest }),
    }
}

fn pending_scale_up(t0: Instant) -> Running {
    let mut view = running_view(t0, true);
    view.scale_up_requested("d", "ckpt-1".into(), t0, Duration::from_secs(30));
    view
}

#[test]
fn nobody_waiting_any_more_calls_the_scale_up_off_before_the_rest_goes_on() {
    let t0 = Instant::now();
    let read = read_back(
        pending_scale_up(t0),
        false,
        generation::Input::NobodyWaits,
        vec![generation::Effect::Ping],
    );
    let (s, fx, _) = run(idle(), read, ms(t0, 10));
    let Phase::Running(view) = &s.phase else {
        panic!("{:?}", s.phase)
    };
    assert_eq!(view.scale_up, None);
    assert_eq!(
        fx,
        vec![
            Effect::Note {
                generation: 3,
                line: "node d is no longer waiting to join: the scale-up is called off, no re-form"
                    .into()
            },
            Effect::Generation {
                effects: vec![generation::Effect::Ping],
                ends: false
            }
        ]
    );
}

#[test]
fn nobody_waiting_without_a_scale_up_pending_says_nothing() {
    let t0 = Instant::now();
    let view = running_view(t0, true);
    let read = read_back(view.clone(), false, generation::Input::NobodyWaits, vec![]);
    let (s, fx, _) = run(idle(), read, t0);
    assert_eq!((s.phase, fx), (Phase::Running(view), vec![]));
}

#[test]
fn a_scale_up_save_written_holds_the_newcomer_until_its_deadline() {
    let t0 = Instant::now();
    let read = read_back(
        running_view(t0, true),
        false,
        generation::Input::ScaleUpSaveWritten {
            node: "d".into(),
            latest_before: "ckpt-1".into(),
            limit: Duration::from_secs(30),
        },
        vec![],
    );
    let (s, fx, _) = run(idle(), read, ms(t0, 500));
    let Phase::Running(view) = &s.phase else {
        panic!("{:?}", s.phase)
    };
    let pending = view.scale_up.as_ref().expect("pending");
    assert_eq!(
        (pending.node.as_str(), pending.latest_before.as_str()),
        ("d", "ckpt-1")
    );
    assert_eq!(pending.deadline, ms(t0, 30_500));
    assert!(
        matches!(&fx[..], [Effect::Note { generation: 3, line }] if line.contains("asking every rank for a checkpoint first")),
        "{fx:?}"
    );
}

#[test]
fn an_agent_heard_since_the_ping_keeps_the_node_and_the_rest_goes_on() {
    let t0 = Instant::now();
    let read = read_back(
        running_view(t0, true),
        false,
        generation::Input::AgentHeard,
        vec![generation::Effect::Close("newcomer".into())],
    );
    let (s, fx, _) = run(idle(), read, t0);
    assert!(s.phase.is_running());
    assert_eq!(
        fx.last(),
        Some(&Effect::Generation {
            effects: vec![generation::Effect::Close("newcomer".into())],
            ends: false
        })
    );
}

#[test]
fn a_decided_interval_sets_the_save_clock() {
    let t0 = Instant::now();
    let mut view = running_view(t0, true);
    view.save_clock = Some(crate::session::save_clock::SaveClock::start(t0));
    let read = read_back(
        view.clone(),
        false,
        generation::Input::IntervalDecided(Duration::from_secs(60)),
        vec![],
    );
    let (s, fx, _) = run(idle(), read, ms(t0, 5));
    let mut want = view;
    want.save_clock
        .as_mut()
        .expect("clock")
        .set(Duration::from_secs(60));
    // The clock counts now: without the read it would still be evaluating.
    assert_ne!(
        want.save_clock,
        Some(crate::session::save_clock::SaveClock::start(t0))
    );
    assert_eq!((s.phase, fx), (Phase::Running(want), vec![]));
}

#[test]
fn a_read_of_a_generation_that_ends_still_ends_it_after_the_rest() {
    let t0 = Instant::now();
    let read = read_back(
        running_view(t0, true),
        true,
        generation::Input::NobodyWaits,
        vec![],
    );
    let (s, fx, _) = run(idle(), read, t0);
    assert!(s.phase.is_running());
    assert_eq!(
        fx,
        vec![Effect::Generation {
            effects: vec![],
            ends: true
        }]
    );
}

// ---- a worker failure against the job-wide restart budget ----

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
