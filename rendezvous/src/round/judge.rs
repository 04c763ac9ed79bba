//! The round's judgement, pure: a [`RoundSnapshot`] and the decider's [`RoundTimes`] in, a
//! [`Judgement`] with a one-line reason out; then, for a formation, the plan and its record
//! ([`formation`]). No store, no clock, no metrics: the driver (`decider.rs`) reads the
//! snapshot, judges it here, writes the formation in one transaction and emits what it says.
//!
//! The rules, in order: the run has ended; the decision core ([`decide`]) on the round's view
//! (a running generation stands everyone by, MAX forms at once, MIN forms when the last call
//! or a re-form's settle window closes, below MIN fails at `join_timeout`); the environment
//! check of the set due to form, which refuses the round, or turns away a re-form's newcomers
//! when the previous members alone agree, or forms with a warning table.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use tokio::time::Instant;

use super::snapshot::{FormationInputs, RoundSnapshot};
use crate::decisions::core::{FailCause, RoundView, RunningGeneration};
use crate::decisions::envcheck::{self, Report, Verdict};
use crate::decisions::formation::{lost_work, lost_work_after};
use crate::ledger::memory;
use crate::ledger::resume::newest_good;
use crate::ledger::Manifest;
use crate::store::records::{Formation, HeldStep, Restarts};
use crate::{assign, decide, Candidate, Decision, Join, Plan, RendezvousError, RoundConfig};

/// The decider's memory of its round between two steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundTimes {
    /// When the round opened (reset while a generation runs).
    pub opened_at: Instant,
    /// When the waiting set reached MIN.
    pub min_reached_at: Option<Instant>,
    /// Newcomers seen waiting while the previous generation ran (batched by its last call).
    pub batched: BTreeSet<String>,
}

impl RoundTimes {
    /// A round opened at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            opened_at: now,
            min_reached_at: None,
            batched: BTreeSet::new(),
        }
    }
}

/// What the decider is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The run has ended: nothing forms.
    Finished,
    /// Not yet: judge again at `until`, or when the round changes.
    Wait {
        /// When time alone can change the answer.
        until: Instant,
    },
    /// The round fails for every node waiting in it.
    Fail {
        /// Which rule failed it.
        cause: FailCause,
        /// Every waiting node.
        nodes: Vec<String>,
    },
    /// The environment check refuses these newcomers of a re-form; the others wait for them
    /// to leave, then form.
    TurnAway {
        /// The newcomers refused.
        who: Vec<String>,
    },
    /// Form the next generation.
    Form(FormOrder),
}

/// Whom a formation admits, and what it carries besides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormOrder {
    /// The nodes of the new generation, in arrival order.
    pub admitted: Vec<Candidate>,
    /// Arrivals beyond MAX: they wait for a free place.
    pub standby: Vec<Candidate>,
    /// The environment check's warning table, printed by every agent.
    pub env_table: Option<String>,
}

/// A judgement, the decider's times after it, and why (empty: nothing to say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// What to do.
    pub judgement: Judgement,
    /// The decider's times for its next step.
    pub times: RoundTimes,
    /// One line for the user: the progress line, the failure, the refusal, why it formed.
    pub reason: String,
}

/// Everything one formation writes, built from the snapshot (see
/// [`crate::store::run_state::round::FormGeneration`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Formed {
    /// The plan of generation `g + 1`.
    pub plan: Plan,
    /// Its formation record.
    pub formation: Formation,
    /// A manifest from a node's checkpoint directory to import into the ledger.
    pub import: Option<Manifest>,
    /// `ckpt/latest`'s `mod_revision` the resume point was chosen at.
    pub latest_revision: i64,
    /// Generation `g` was never closed (every member lost its lease at once): the restart
    /// counters with one more membership restart, and the revision they were read at.
    pub unclosed: Option<(Restarts, i64)>,
}

/// The joins of `snap` that are candidates: less those of generation `current`'s members that
/// got them in (written no later than `gen/current`); and whether such a member is starting.
pub fn candidates(snap: &RoundSnapshot) -> (Vec<&Join>, bool) {
    let mut joins = Vec::with_capacity(snap.waiting.len());
    let mut starting = false;
    for (j, mod_revision) in &snap.waiting {
        let consumed = *mod_revision <= snap.revision
            && snap
                .current
                .as_ref()
                .is_some_and(|p| p.member(&j.candidate.node_id).is_some());
        if consumed {
            starting = true;
        } else {
            joins.push(j);
        }
    }
    (joins, starting)
}

/// Judges the round `snap` at `now` under `cfg`, the decider's times being `times`.
pub fn judge(snap: &RoundSnapshot, times: &RoundTimes, now: Instant, cfg: &RoundConfig) -> Judged {
    if snap.finished {
        return Judged {
            judgement: Judgement::Finished,
            times: times.clone(),
            reason: "the run has ended".into(),
        };
    }
    let (joins, starting) = candidates(snap);
    let candidates: Vec<Candidate> = joins.iter().map(|j| j.candidate.clone()).collect();
    let g = snap.generation;
    let current = snap.current.as_ref();
    // Whether generation `g` still runs: not closed, and a member alive (a membership key
    // under its lease, or `starting`: a member's join not yet replaced by its membership key).
    // A generation whose members all died (leases expired) has ended.
    let running = current
        .filter(|_| !snap.closed && (starting || snap.live_after))
        .map(|plan| RunningGeneration {
            generation: g,
            members: plan.members.len(),
        });
    let mut times = times.clone();
    if running.is_some() {
        // Nobody forms beside it (see `core::decide`); the round starts over when it closes.
        times.opened_at = now;
        times.min_reached_at = None;
    } else if candidates.len() >= cfg.min_nodes {
        times.min_reached_at.get_or_insert(now);
    } else {
        times.min_reached_at = None;
    }
    // A re-form: which live members of generation `g` are still to rejoin.
    let outstanding = current.filter(|_| running.is_none()).map(|plan| {
        let joined: HashSet<&str> = candidates.iter().map(|c| c.node_id.as_str()).collect();
        plan.members
            .iter()
            .map(|m| &m.node_id)
            .filter(|id| snap.live.contains(*id) && !joined.contains(id.as_str()))
            .cloned()
            .collect()
    });
    let newcomers = fresh_newcomers(current, &candidates, running.is_some(), &mut times.batched);
    let view = RoundView {
        opened_at: times.opened_at,
        min_reached_at: times.min_reached_at,
        candidates,
        outstanding,
        newcomers,
        running,
    };
    let everyone = || view.candidates.iter().map(|c| c.node_id.clone()).collect();
    let (judgement, reason) = match decide(&view, now, cfg) {
        Decision::Wait { reason, wake_at } => (Judgement::Wait { until: wake_at }, reason),
        Decision::Fail { reason, cause } => (
            Judgement::Fail {
                cause,
                nodes: everyone(),
            },
            reason,
        ),
        Decision::Form {
            admitted,
            standby,
            reason,
        } => match env_verdict(&admitted, &joins) {
            Verdict::Refuse(why) => match turned_away(current, &admitted, &joins) {
                // A re-form refused because of newcomers only: they are turned away (and end
                // with the refusal); the running job re-forms without them.
                Some(who) if who.len() < admitted.len() => (Judgement::TurnAway { who }, why),
                _ => (
                    Judgement::Fail {
                        cause: FailCause::Unformable,
                        nodes: everyone(),
                    },
                    why,
                ),
            },
            Verdict::Warn(table) => (
                Judgement::Form(FormOrder {
                    admitted,
                    standby,
                    env_table: Some(table),
                }),
                reason,
            ),
            Verdict::Consistent => (
                Judgement::Form(FormOrder {
                    admitted,
                    standby,
                    env_table: None,
                }),
                reason,
            ),
        },
    };
    Judged {
        judgement,
        times,
        reason,
    }
}

/// Generation `g + 1` of run `run_id` (`g`: `snap`'s generation) as `order` admits it,
/// formed because of `reason`: ranked ([`assign`]) with the restart counters, resuming from
/// the newest sealed checkpoint not marked bad or a newer one a node found in its checkpoint
/// directory, with its [`Formation`] record (the round opened at `opened_at`; `now` is
/// `now_ms` on the wall clock).
///
/// # Errors
/// [`RendezvousError::Assignment`] when the admitted set cannot be ranked.
#[allow(clippy::too_many_arguments)]
pub fn formation(
    run_id: &str,
    snap: &RoundSnapshot,
    order: &FormOrder,
    reason: &str,
    inputs: &FormationInputs,
    opened_at: Instant,
    now: Instant,
    now_ms: u64,
) -> Result<Formed, RendezvousError> {
    let g = snap.generation;
    let (joins, _) = candidates(snap);
    let mut restarts = inputs.restarts.clone();
    // Every re-form closes the generation it ends (a lost node, a failure, a scale-up),
    // except one whose members all lost their leases at once (a store outage longer than the
    // TTL fences every agent): nobody was left to close it, so it is counted here, in the
    // formation's own transaction, as the membership restart it is.
    let unclosed = g > 0 && !inputs.closed;
    if unclosed {
        restarts.membership += 1;
    }
    let admitted = &order.admitted;
    let mut plan = assign(
        run_id,
        g + 1,
        admitted,
        restarts.failures,
        restarts.membership,
    )?;
    // Every rank of the generation resumes from the same checkpoint: the newest sealed one not
    // marked bad (or one a node found in its checkpoint directory). Another run's checkpoint
    // (`--ckpt-resume-from`) only starts a run: adopted later, it would throw away the
    // progress of the generations so far.
    // By node id: a scan of the joins per admitted node was quadratic (10,000 nodes: 10^8
    // comparisons in the decider's formation step).
    let by_id: HashMap<&str, &Join> = joins
        .iter()
        .map(|j| (j.candidate.node_id.as_str(), *j))
        .collect();
    let hints: Vec<&Manifest> = admitted
        .iter()
        .filter_map(|c| {
            by_id
                .get(c.node_id.as_str())
                .and_then(|j| j.resume_hint.as_deref())
        })
        .filter(|m| g == 0 || m.adopted_from.is_none())
        .collect();
    let (resume, mut import) = newest_good(run_id, inputs.manifests.clone(), &inputs.bad, &hints);
    plan.resume = resume;
    // `--ckpt-replicas`: a newer step the joining nodes hold in memory, every rank of it,
    // wins over the sealed one ([`memory::choose`]); the line says which and why.
    let held: BTreeMap<&str, &[HeldStep]> = admitted
        .iter()
        .filter_map(|c| by_id.get(c.node_id.as_str()))
        .filter(|j| !j.held.is_empty())
        .map(|j| (j.candidate.node_id.as_str(), j.held.as_slice()))
        .collect();
    // When the resumed step's ranks went on after staging it (a resume from memory).
    let mut went_on_at_ms = None;
    if !held.is_empty() {
        match memory::choose(
            run_id,
            plan.resume.as_ref(),
            &inputs.bad,
            &held,
            snap.current.as_ref(),
            now_ms,
        ) {
            memory::Choice::Memory {
                manifest,
                sources,
                reason,
                staged_at_ms,
            } => {
                went_on_at_ms = staged_at_ms;
                plan.resume = Some(manifest);
                plan.resume_memory = Some(sources);
                plan.notes.push(reason);
                import = false;
            }
            memory::Choice::Sealed(Some(line)) => plan.notes.push(line),
            memory::Choice::Sealed(None) => {}
        }
    }
    plan.formed_because = reason.to_string();
    plan.notes.extend(order.env_table.clone());
    let opened_at_ms = now_ms.saturating_sub((now - opened_at).as_millis() as u64);
    let formation = Formation {
        round_opened_at_ms: opened_at_ms,
        formed_at_ms: now_ms,
        lost_work: inputs.previous.as_ref().map(|p| match went_on_at_ms {
            // Resumed from memory: the work since its ranks went on after staging it.
            Some(at) => lost_work_after(p.formed_at_ms, opened_at_ms, at, plan.resume.as_ref()),
            None => lost_work(p.formed_at_ms, opened_at_ms, plan.resume.as_ref()),
        }),
        door: crate::decisions::door::door(&env_reports(admitted, &joins)),
    };
    Ok(Formed {
        import: plan.resume.clone().filter(|_| import),
        plan,
        formation,
        latest_revision: inputs.latest_revision,
        unclosed: unclosed.then_some((restarts, inputs.restarts_revision)),
    })
}

/// The environment check of the admitted set (see [`crate::decisions::envcheck`]).
fn env_verdict(admitted: &[Candidate], joins: &[&Join]) -> Verdict {
    envcheck::verdict(&env_reports(admitted, joins))
}

/// Each admitted node as the environment check sees it: the fingerprint its join carries.
fn env_reports<'a>(admitted: &[Candidate], joins: &[&'a Join]) -> Vec<Report<'a>> {
    let by_id: HashMap<&str, &Join> = joins
        .iter()
        .map(|j| (j.candidate.node_id.as_str(), *j))
        .collect();
    admitted
        .iter()
        .filter_map(|c| by_id.get(c.node_id.as_str()).copied())
        .map(Report::of)
        .collect()
}

/// For a re-form (`current`: the previous generation's plan) that the environment check
/// refuses: the newcomers (admitted nodes not in `current`) when the previous generation's
/// members alone pass the check, so the refusal is theirs; `None` otherwise (a first formation,
/// or the members themselves disagree: the whole round is refused).
fn turned_away(
    current: Option<&Plan>,
    admitted: &[Candidate],
    joins: &[&Join],
) -> Option<Vec<String>> {
    let plan = current?;
    let (old, new): (Vec<Candidate>, Vec<Candidate>) = admitted
        .iter()
        .cloned()
        .partition(|c| plan.member(&c.node_id).is_some());
    if new.is_empty() || old.is_empty() || matches!(env_verdict(&old, joins), Verdict::Refuse(_)) {
        return None;
    }
    Some(new.into_iter().map(|c| c.node_id).collect())
}

/// How many of `candidates` are arrivals a re-form of `current` should settle for: not members
/// of it, and not seen waiting while it ran (`running`), when its last call batched them
/// (`session::generation::Arrivals`); those seen now are added to `batched`. The re-form that
/// admits a batch need not wait for it again, only for arrivals after it.
fn fresh_newcomers(
    current: Option<&Plan>,
    candidates: &[Candidate],
    running: bool,
    batched: &mut BTreeSet<String>,
) -> usize {
    let Some(plan) = current else { return 0 };
    let new = candidates
        .iter()
        .filter(|c| plan.member(&c.node_id).is_none());
    if running {
        batched.extend(new.map(|c| c.node_id.clone()));
        return 0;
    }
    new.filter(|c| !batched.contains(&c.node_id)).count()
}

#[cfg(test)]
mod tests;
