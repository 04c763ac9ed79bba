//! The agent's transitions, through [`step`] alone: synthetic instants, no process, no store,
//! no sleeping.

use std::time::Duration;

use drun_rendezvous::round::Restarts;
use drun_rendezvous::session::{Request, RunEnd, SaveRequest};
use drun_rendezvous::{Event, Member, Plan};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::state::{
    Checked, Effect, End, Input, Level, Machine, Params, Phase, Save, StopStage, Then, Workers,
    KILL_WAIT, REFORM_REASON_WAIT, REJOIN_PAUSE,
};
use super::step;
use crate::AgentExit;

const GRACE: Duration = Duration::from_secs(5);
const PEER_WAIT: Duration = Duration::from_secs(30);

fn params() -> Params {
    Params {
        run_id: "r".into(),
        node_id: "n0".into(),
        max_restarts: 3,
        peer_exit_wait: PEER_WAIT,
        shutdown_timeout: GRACE,
        preempt_signal: Some(Signal::SIGUSR1),
        requeue: true,
    }
}

fn plan(generation: u64, nodes: u32, restarts_failures: u32) -> Plan {
    Plan {
        run_id: "r".into(),
        generation,
        members: (0..nodes)
            .map(|i| Member {
                node_id: format!("n{i}"),
                advertise_addr: "127.0.0.1".into(),
                node_rank: i,
                slots: 2,
                base_rank: 2 * i,
            })
            .collect(),
        world_size: 2 * nodes,
        master_addr: "127.0.0.1".into(),
        master_port: 29500,
        restarts_failures,
        restarts_membership: 0,
        resume: None,
        notes: Vec::new(),
        formed_because: String::new(),
    }
}

/// A machine on a synthetic clock.
struct T {
    m: Option<Machine>,
    now: Instant,
    p: Params,
}

impl T {
    fn new() -> Self {
        let (m, fx) = Machine::start();
        assert_eq!(
            fx,
            vec![Effect::Join {
                fresh: true,
                after: 0
            }]
        );
        T {
            m: Some(m),
            now: Instant::now(),
            p: params(),
        }
    }

    /// Generation `g` (of `nodes` nodes) formed, verified and spawned.
    fn running(g: u64, nodes: u32) -> Self {
        let mut t = T::new();
        t.feed(Input::Event(Event::Formed(plan(g, nodes, 0))));
        assert_eq!(
            t.feed(Input::Verified(Checked::Use(None))),
            vec![Effect::Spawn(None)]
        );
        t.feed(Input::Spawned);
        assert!(
            matches!(t.phase(), Phase::Running { .. }),
            "{:?}",
            t.phase()
        );
        t
    }

    fn feed(&mut self, input: Input) -> Vec<Effect> {
        let (m, fx) = step(self.m.take().expect("machine"), input, self.now, &self.p);
        self.m = Some(m);
        fx
    }

    fn ev(&mut self, ev: Event) -> Vec<Effect> {
        self.feed(Input::Event(ev))
    }

    fn after(&mut self, d: Duration) -> Vec<Effect> {
        self.now += d;
        self.feed(Input::Tick)
    }

    fn machine(&self) -> &Machine {
        self.m.as_ref().expect("machine")
    }

    fn phase(&self) -> &Phase {
        &self.machine().phase
    }

    fn done(&self) -> Option<&End> {
        match self.phase() {
            Phase::Done(e) => Some(e),
            _ => None,
        }
    }

    /// The workers are gone: cleanup, then the stop's follow-up.
    fn workers_gone(&mut self, failure: Option<&str>) -> Vec<Effect> {
        let fx = self.feed(Input::Workers(Workers::default()));
        assert_eq!(fx, vec![Effect::Cleanup]);
        self.feed(Input::Stopped {
            failure: failure.map(String::from),
        })
    }
}

fn failed() -> Workers {
    Workers {
        running: true,
        failed: true,
        ..Workers::default()
    }
}

fn logged(fx: &[Effect], needle: &str) -> bool {
    fx.iter().any(|e| match e {
        Effect::Log(_, _, t) | Effect::Say(t) => t.contains(needle),
        _ => false,
    })
}

fn restarts(failures: u32, history: &[&str]) -> Restarts {
    Restarts {
        failures,
        membership: 0,
        history: history.iter().map(|s| s.to_string()).collect(),
    }
}

fn save(reason: &str, latest_before: &str, scale_up: bool) -> Event {
    Event::SaveRequested(SaveRequest {
        node_id: "n1".into(),
        reason: reason.into(),
        latest_before: latest_before.into(),
        at_ms: 0,
        scale_up,
    })
}

fn end(success: bool) -> RunEnd {
    RunEnd {
        success,
        reason: "the last generation's workers exited".into(),
        at_ms: 0,
    }
}

/// Fails generation 1 and reports it; returns the Failed request sent.
fn report_failure(t: &mut T) {
    assert_eq!(
        t.feed(Input::Workers(failed())),
        vec![Effect::Stop(Signal::SIGTERM)]
    );
    let fx = t.workers_gone(Some("rank 1 exited with 3 on node n0"));
    assert_eq!(
        fx,
        vec![Effect::Send(Request::Failed {
            generation: 1,
            description: "rank 1 exited with 3 on node n0".into(),
        })]
    );
    assert!(matches!(t.phase(), Phase::Reporting(_)));
}

#[test]
fn a_plan_is_verified_then_its_workers_spawned() {
    let mut t = T::new();
    assert_eq!(
        t.ev(Event::Waiting("waiting for 1 more node".into())).len(),
        1
    );
    let fx = t.ev(Event::Formed(plan(1, 1, 0)));
    assert_eq!(fx, vec![Effect::Formed(Box::new(plan(1, 1, 0)))]);
    assert!(matches!(t.phase(), Phase::Verifying { .. }));
    assert_eq!(
        t.feed(Input::Verified(Checked::Use(None))),
        vec![Effect::Spawn(None)]
    );
    assert!(t.feed(Input::Spawned).is_empty());
    assert!(matches!(
        t.phase(),
        Phase::Running {
            save: Save::Idle,
            ..
        }
    ));
    // Progress lines are for forming only.
    assert!(t.ev(Event::Waiting("late".into())).is_empty());
}

#[test]
fn worker_failure_with_budget_left_restarts_the_group() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    let fx = t.ev(Event::FailureDecision {
        restart: true,
        restarts: restarts(1, &["generation 1: rank 1"]),
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
    assert!(matches!(t.phase(), Phase::Forming { rejoin_at: None }));
}

#[test]
fn worker_failure_with_budget_spent_prints_the_summary_and_exits_1() {
    let mut t = T::running(1, 1);
    report_failure(&mut t);
    let history = ["generation 1: rank 0", "generation 2: rank 1"];
    let fx = t.ev(Event::FailureDecision {
        restart: false,
        restarts: restarts(3, &history),
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
fn a_failure_caused_by_a_lost_node_waits_for_the_reason_and_spends_nothing() {
    let mut t = T::running(1, 2);
    report_failure(&mut t);
    // Budget unchanged (0 used, as the plan says): not the workers' own failure.
    let fx = t.ev(Event::FailureDecision {
        restart: true,
        restarts: restarts(0, &[]),
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
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::WorkerFailure)));
}

#[test]
fn a_reform_stops_the_workers_gently_and_joins_again() {
    let mut t = T::running(1, 2);
    let fx = t.ev(Event::Reform {
        generation: 1,
        reason: "node n2 joined".into(),
    });
    assert!(logged(&fx, "re-forming the group: node n2 joined"));
    assert_eq!(fx.last(), Some(&Effect::Stop(Signal::SIGTERM)));
    // Events wait while stopping.
    assert!(!t.machine().reads_session());
    assert_eq!(
        t.workers_gone(None),
        vec![Effect::Join {
            fresh: true,
            after: 1
        }]
    );
    let clock = t.machine().clock.expect("a restart is timed");
    assert_eq!(clock.stopped, Some(t.now));
}

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

#[test]
fn a_preemption_warning_saves_then_stops_and_requeues() {
    let mut t = T::running(1, 1);
    t.feed(Input::Signal(Signal::SIGUSR1));
    t.ev(save(
        "SIGUSR1 (preemption warning) on node n0",
        "0004-0001",
        false,
    ));
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
    t.ev(save("node n1 waits to join", "0004-0001", true));
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
fn a_fence_while_running_kills_the_workers_and_joins_again() {
    let mut t = T::running(3, 2);
    let fx = t.ev(Event::Fenced("lease lost".into()));
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Log(Level::Error, Some(3), _))));
    assert_eq!(fx.last(), Some(&Effect::Stop(Signal::SIGKILL)));
    assert_eq!(
        t.workers_gone(None),
        vec![Effect::Join {
            fresh: true,
            after: 3
        }]
    );
}

#[test]
fn a_fence_while_stopping_changes_nothing() {
    let mut t = T::running(1, 2);
    t.feed(Input::Signal(Signal::SIGTERM));
    assert!(t.ev(Event::Fenced("lease lost".into())).is_empty());
    assert!(t.ev(Event::Error("etcd is gone".into())).is_empty());
    assert!(t.feed(Input::SessionClosed).is_empty());
    assert!(matches!(t.phase(), Phase::Stopping(s) if s.then == Then::Exit(Signal::SIGTERM)));
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
fn a_handled_signal_is_forwarded_once_then_the_agent_exits_128_plus_n() {
    let mut t = T::running(1, 1);
    let fx = t.feed(Input::Signal(Signal::SIGTERM));
    assert_eq!(fx.last(), Some(&Effect::Stop(Signal::SIGTERM)));
    let fx = t.feed(Input::Signal(Signal::SIGTERM));
    assert!(!fx
        .iter()
        .any(|e| matches!(e, Effect::Stop(_) | Effect::Relay(_) | Effect::Kill)));
    assert!(t.workers_gone(None).is_empty());
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Signal(15))));
}

#[test]
fn a_second_sigint_kills_at_once() {
    let mut t = T::running(1, 1);
    t.feed(Input::Signal(Signal::SIGINT));
    let fx = t.feed(Input::Signal(Signal::SIGINT));
    assert!(logged(&fx, "second SIGINT"));
    assert_eq!(fx.last(), Some(&Effect::Kill));
    assert!(
        matches!(t.phase(), Phase::Stopping(s) if matches!(s.stage, StopStage::Killing { .. }))
    );
}

#[test]
fn usr1_and_usr2_are_relayed_and_never_tear_down() {
    let mut t = T::running(1, 1);
    t.p.preempt_signal = None;
    let fx = t.feed(Input::Signal(Signal::SIGUSR2));
    assert_eq!(fx.last(), Some(&Effect::Relay(Signal::SIGUSR2)));
    let fx = t.feed(Input::Signal(Signal::SIGUSR1));
    assert_eq!(fx.last(), Some(&Effect::Relay(Signal::SIGUSR1)));
    assert!(matches!(t.phase(), Phase::Running { .. }));
    // Before workers start there is nobody to relay to.
    let mut t = T::new();
    let fx = t.feed(Input::Signal(Signal::SIGUSR2));
    assert!(logged(&fx, "nothing to relay"));
    assert!(matches!(t.phase(), Phase::Forming { .. }));
}

#[test]
fn a_signal_while_forming_exits_at_once() {
    let mut t = T::new();
    assert!(t.feed(Input::Signal(Signal::SIGINT)).is_empty());
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Signal(2))));
}

#[test]
fn a_stop_timeout_sends_sigkill_then_gives_up_waiting() {
    let mut t = T::running(1, 1);
    t.ev(Event::Reform {
        generation: 1,
        reason: "x".into(),
    });
    assert!(t.after(GRACE - Duration::from_millis(1)).is_empty());
    let fx = t.after(Duration::from_millis(1));
    assert!(logged(&fx, "sending SIGKILL"));
    assert_eq!(fx.last(), Some(&Effect::Kill));
    assert_eq!(t.after(KILL_WAIT), vec![Effect::Cleanup]);
    assert_eq!(
        t.feed(Input::Stopped { failure: None }),
        vec![Effect::Join {
            fresh: true,
            after: 1
        }]
    );
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
fn a_run_that_ended_before_this_node_joined_is_an_error() {
    let mut t = T::new();
    t.ev(Event::Finished(end(true)));
    assert_eq!(t.done(), Some(&End::RunFinished(end(true))));
}

#[test]
fn a_fence_while_forming_joins_again_with_the_same_candidate_after_a_pause() {
    let mut t = T::new();
    let fx = t.ev(Event::Fenced("lease expired".into()));
    assert!(logged(&fx, "joining again as a new member"));
    assert!(t.after(REJOIN_PAUSE / 2).is_empty());
    assert_eq!(
        t.after(REJOIN_PAUSE),
        vec![Effect::Join {
            fresh: false,
            after: 0
        }]
    );
}

#[test]
fn workers_that_cannot_start_are_killed_and_the_error_ends_the_agent() {
    let mut t = T::new();
    t.ev(Event::Formed(plan(1, 1, 0)));
    t.feed(Input::Verified(Checked::Use(None)));
    assert_eq!(
        t.feed(Input::SpawnFailed),
        vec![Effect::Stop(Signal::SIGKILL)]
    );
    assert!(t.workers_gone(None).is_empty());
    assert_eq!(t.done(), Some(&End::Fatal));
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
fn a_signal_during_a_gentle_stop_wins_over_the_rejoin() {
    let mut t = T::running(1, 2);
    t.ev(Event::Reform {
        generation: 1,
        reason: "x".into(),
    });
    t.feed(Input::Signal(Signal::SIGTERM));
    assert!(t.workers_gone(None).is_empty());
    assert_eq!(t.done(), Some(&End::Exit(AgentExit::Signal(15))));
}

#[test]
fn commits_reach_the_ledger_only_while_workers_run() {
    let committed = || Event::Committed {
        generation: 1,
        step: 4,
        result: Err("stale".into()),
    };
    let mut t = T::new();
    assert!(t.ev(committed()).is_empty());
    let mut t = T::running(1, 1);
    assert!(matches!(
        &t.ev(committed())[..],
        [Effect::Committed { step: 4, .. }]
    ));
}
