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

fn executed(run: Running, ends: bool, result: Result<Option<Phase>, Failure>) -> Input {
    Input::Executed {
        run: Box::new(run),
        ends,
        result,
        read: None,
    }
}

mod abandoned;
mod failure;
mod lease;
mod paths;
mod requests;
mod retries;
mod round;
mod running;
mod standby;
