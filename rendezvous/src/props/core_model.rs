//! The decision core over random event sequences: joins, leaves, lease expiries, worker
//! failures, scale-ups, checkpoint seals (by the running and by the previous generation) and
//! clock steps, checked after every event.
//!
//! Invariants: every formed plan ranks its nodes `0..n-1` and its workers `0..world-1` (each
//! exactly once); generations only increase, by one; no generation forms beside a running one;
//! a formation admits between MIN and MAX nodes, all of them waiting, and leaves the rest of the
//! waiting set standing by in arrival order; a round fails only below MIN after
//! `join_timeout`; the ledger refuses every commit of an older generation; `ckpt/latest` and
//! the resume point of each new generation never move backwards and always name the newest
//! sealed step.

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;

use super::model::{Event, Outcome, Sim};
use crate::decisions::core::FailCause;
use crate::ledger::{CommitOutcome, LedgerError};
use crate::{Candidate, Plan, RoundConfig};

/// Random event sequences the CI run checks (each up to 48 events).
const SEQUENCES: u32 = 10_000;

fn config() -> impl Strategy<Value = RoundConfig> {
    (
        1usize..=3,
        0usize..=3,
        0u64..=3_000,
        500u64..=10_000,
        0u64..=1_500,
    )
        .prop_map(
            |(min, extra, last_call, join_timeout, settle)| RoundConfig {
                min_nodes: min,
                max_nodes: min + extra,
                last_call: Duration::from_millis(last_call),
                join_timeout: Duration::from_millis(join_timeout),
                settle: Duration::from_millis(settle),
            },
        )
}

fn nodes() -> impl Strategy<Value = Vec<Candidate>> {
    let pin = prop_oneof![3 => Just(None), 1 => (0u32..4).prop_map(Some)];
    prop::collection::vec((1u32..=4, pin), 1..=7).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (slots, pin))| Candidate {
                node_id: format!("n{i}"),
                advertise_addr: format!("10.0.0.{i}"),
                slots,
                requested_node_rank: pin,
                master_port: 29_500 + i as u16,
                probe_port: 0,
            })
            .collect()
    })
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => (0usize..8).prop_map(Event::Join),
        1 => (0usize..8).prop_map(Event::Leave),
        1 => (0usize..8).prop_map(Event::Expire),
        1 => Just(Event::Fail),
        1 => Just(Event::ScaleUp),
        2 => (0u64..30).prop_map(Event::Seal),
        1 => (0u64..30).prop_map(Event::StaleSeal),
        3 => (0u64..4_000).prop_map(Event::Advance),
    ]
}

/// What the checks remember between events.
#[derive(Default)]
struct Seen {
    generation: u64,
    resume: Option<(u64, u64)>,
    latest: Option<(u64, u64)>,
    sealed: BTreeSet<(u64, u64)>,
}

fn check_plan(plan: &Plan, cfg: &RoundConfig, seen: &Seen) -> Result<(), TestCaseError> {
    let n = plan.members.len();
    prop_assert!(
        (cfg.min_nodes..=cfg.max_nodes).contains(&n),
        "{n} nodes admitted"
    );
    let mut node_ranks: Vec<u32> = plan.members.iter().map(|m| m.node_rank).collect();
    node_ranks.sort_unstable();
    prop_assert_eq!(node_ranks, (0..n as u32).collect::<Vec<_>>());
    let mut ranks: Vec<u32> = plan
        .members
        .iter()
        .flat_map(|m| m.base_rank..m.base_rank + m.slots)
        .collect();
    ranks.sort_unstable();
    prop_assert_eq!(ranks, (0..plan.world_size).collect::<Vec<_>>());
    let zero = plan
        .members
        .iter()
        .find(|m| m.node_rank == 0)
        .expect("n ≥ 1");
    prop_assert_eq!(&plan.master_addr, &zero.advertise_addr);
    prop_assert_eq!(
        plan.generation,
        seen.generation + 1,
        "generations go up by one"
    );
    let resume = plan.resume.as_ref().map(|m| (m.step, m.generation));
    prop_assert!(resume >= seen.resume, "resume point moved back: {resume:?}");
    prop_assert_eq!(
        resume,
        seen.sealed.last().copied(),
        "resumes from the newest seal"
    );
    Ok(())
}

fn check_seal(
    step: u64,
    plan: &Plan,
    answers: &[Result<CommitOutcome, LedgerError>],
    seen: &mut Seen,
) -> Result<(), TestCaseError> {
    let resumed = plan.resume.as_ref().map(|m| m.step);
    let last = answers.len() - 1;
    for (i, a) in answers.iter().enumerate() {
        match a {
            Err(LedgerError::NotAfterResume { .. }) => {
                prop_assert!(resumed.is_some_and(|r| step <= r))
            }
            Err(LedgerError::AlreadySealed(_)) => {
                prop_assert!(seen.sealed.contains(&(step, plan.generation)))
            }
            Ok(CommitOutcome::Recorded { waiting_for }) => {
                prop_assert!(i < last);
                prop_assert_eq!(waiting_for.len(), last - i);
            }
            Ok(CommitOutcome::Sealed { manifest, .. }) => {
                prop_assert_eq!(i, last, "sealed only once every member reported");
                prop_assert_eq!(
                    (manifest.step, manifest.generation),
                    (step, plan.generation)
                );
                prop_assert!(seen.sealed.insert((step, plan.generation)));
            }
            Err(e) => prop_assert!(false, "unexpected ledger error: {e}"),
        }
    }
    Ok(())
}

async fn run(
    cfg: RoundConfig,
    nodes: Vec<Candidate>,
    events: Vec<Event>,
) -> Result<(), TestCaseError> {
    let mut sim = Sim::new(cfg, nodes);
    let mut seen = Seen::default();
    for e in &events {
        match sim.step(e).await {
            Outcome::Formed {
                plan,
                waiting,
                standby,
                beside_running,
            } => {
                prop_assert!(
                    !beside_running,
                    "a second world formed beside a running one"
                );
                check_plan(&plan, &cfg, &seen)?;
                let ids =
                    |cs: &[Candidate]| cs.iter().map(|c| c.node_id.clone()).collect::<Vec<_>>();
                let mut split: Vec<String> =
                    plan.members.iter().map(|m| m.node_id.clone()).collect();
                split.sort_unstable();
                let mut admitted_in_order = ids(&waiting[..plan.members.len()]);
                admitted_in_order.sort_unstable();
                prop_assert_eq!(split, admitted_in_order, "admits the first arrivals");
                prop_assert_eq!(ids(&standby), ids(&waiting[plan.members.len()..]));
                seen.generation = plan.generation;
                seen.resume = plan.resume.as_ref().map(|m| (m.step, m.generation));
            }
            Outcome::Failed { waiting, cause } => {
                prop_assert_eq!(cause, FailCause::JoinTimeout);
                prop_assert!(waiting < cfg.min_nodes, "failed with {waiting} waiting");
            }
            Outcome::Waited => {
                prop_assert!(
                    sim.running || sim.waiting.len() < cfg.max_nodes,
                    "MAX nodes waited with nothing running"
                );
            }
            Outcome::Sealed(answers) => {
                let Event::Seal(step) = *e else {
                    unreachable!("only a seal seals")
                };
                let plan = sim.plan.clone().expect("a seal needs a generation");
                check_seal(step, &plan, &answers, &mut seen)?;
            }
            Outcome::StaleSealed(answers) => {
                for a in &answers {
                    // Refused: as stale, or earlier, for a step at or before its own resume
                    // point or one it already sealed.
                    let refused = matches!(
                        a,
                        Err(LedgerError::Stale(_)
                            | LedgerError::NotAfterResume { .. }
                            | LedgerError::AlreadySealed(_))
                    );
                    prop_assert!(refused, "an old world committed: {a:?}");
                }
            }
        }
        let latest = sim.latest().await;
        prop_assert!(
            latest >= seen.latest,
            "ckpt/latest moved back to {latest:?}"
        );
        prop_assert_eq!(latest, seen.sealed.last().copied());
        seen.latest = latest;
    }
    Ok(())
}

proptest! {
    #![proptest_config(super::config(SEQUENCES))]

    /// 10,000 random runs of up to 48 events each through the real decision core, plan
    /// assignment and ledger.
    #[test]
    fn the_decision_core_keeps_its_invariants(
        cfg in config(),
        nodes in nodes(),
        events in prop::collection::vec(event(), 1..48),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        rt.block_on(run(cfg, nodes, events))?;
    }
}
