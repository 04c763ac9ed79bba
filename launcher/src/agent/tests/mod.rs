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

mod ckpt;
mod failure;
mod lifecycle;
mod progress;
use crate::AgentExit;

pub(super) const GRACE: Duration = Duration::from_secs(5);
pub(super) const PEER_WAIT: Duration = Duration::from_secs(30);

pub(super) fn params() -> Params {
    Params {
        run_id: "r".into(),
        node_id: "n0".into(),
        max_restarts: 3,
        peer_exit_wait: PEER_WAIT,
        shutdown_timeout: GRACE,
        preempt_signal: Some(Signal::SIGUSR1),
        requeue: true,
        hang_timeout: None,
        straggler_factor: 0.0,
    }
}

pub(super) fn plan(generation: u64, nodes: u32, restarts_failures: u32) -> Plan {
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
                probe_port: 0,
            })
            .collect(),
        world_size: 2 * nodes,
        master_addr: "127.0.0.1".into(),
        master_port: 29500,
        restarts_failures,
        restarts_membership: 0,
        resume: None,
        resume_memory: None,
        notes: Vec::new(),
        formed_because: String::new(),
        node_count: 0,
    }
}

/// A machine on a synthetic clock.
pub(super) struct T {
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
        T::running_with(g, nodes, params())
    }

    /// [`T::running`] with these launch parameters.
    fn running_with(g: u64, nodes: u32, p: Params) -> Self {
        let mut t = T::new();
        t.p = p;
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
            cause: None,
        })
    }
}

pub(super) fn failed() -> Workers {
    Workers {
        running: true,
        failed: true,
        ..Workers::default()
    }
}

pub(super) fn logged(fx: &[Effect], needle: &str) -> bool {
    fx.iter().any(|e| match e {
        Effect::Log(_, _, t) | Effect::Say(t) => t.contains(needle),
        _ => false,
    })
}

pub(super) fn restarts(failures: u32, history: &[&str]) -> Restarts {
    Restarts {
        failures,
        membership: 0,
        history: history.iter().map(|s| s.to_string()).collect(),
    }
}

pub(super) fn save(reason: &str, latest_before: &str, scale_up: bool) -> Event {
    Event::SaveRequested(SaveRequest {
        node_id: "n1".into(),
        reason: reason.into(),
        latest_before: latest_before.into(),
        at_ms: 0,
        scale_up,
        interval: false,
    })
}

pub(super) fn end(success: bool) -> RunEnd {
    RunEnd {
        success,
        reason: "the last generation's workers exited".into(),
        at_ms: 0,
        root_cause: None,
        retryable: false,
        unfit: false,
    }
}

/// Fails generation 1 and reports it; returns the Failed request sent.
pub(super) fn report_failure(t: &mut T) {
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
            cause: None,
        })]
    );
    assert!(matches!(t.phase(), Phase::Reporting(_)));
}
