//! The decider's step: read the waiting set, ask the decision core, write the next generation's plan.

use std::collections::HashSet;

use tokio::time::Instant;

use super::{Round, Step};
use crate::clock::now_ms;
use crate::core::{FailCause, RoundView, RunningGeneration};
use crate::envcheck::{self, Report, Verdict};
use crate::formation::{lost_work, Formation};
use crate::ledger::Manifest;
use crate::run_state::round::FormGeneration;
use crate::{assign, decide, Candidate, Decision, Join, Plan, RendezvousError};

impl Round {
    /// The decider's step: read the waiting set, decide, and form the next generation if due.
    pub(super) async fn decide_once(
        &self,
        g: u64,
        rev: i64,
        opened_at: &mut Instant,
        min_reached_at: &mut Option<Instant>,
        batched: &mut HashSet<String>,
    ) -> Result<Step, RendezvousError> {
        // A waiting key written before generation `g` formed, by a node admitted to `g`, is the
        // join that got it in; the node deletes it once it starts. Not a new candidate.
        let current = if g > 0 { self.plan(g).await? } else { None };
        // Members of `g` still live, read BEFORE the waiting set: a survivor moves from one to
        // the other in one transaction (`Round::rejoin`), so each is seen in at least
        // one of the two reads and none is left out of a re-form.
        let live: HashSet<String> = match &current {
            Some(_) => self.live_members(g).await?.into_iter().collect(),
            None => HashSet::new(),
        };
        let (joins, starting) = self.read_waiting(rev, current.as_ref()).await?;
        let candidates: Vec<Candidate> = joins.iter().map(|j| j.candidate.clone()).collect();
        let now = Instant::now();
        if self.state.has_finished().await? {
            return Err(RendezvousError::RunFinished(self.run_id.clone()));
        }
        let running = match &current {
            Some(plan) if self.running(plan, starting).await? => Some(RunningGeneration {
                generation: g,
                members: plan.members.len(),
            }),
            _ => None,
        };
        if running.is_some() {
            // Nobody forms beside it (see `core::decide`); the round starts over when it closes.
            *opened_at = now;
            *min_reached_at = None;
        } else if candidates.len() >= self.cfg.min_nodes {
            min_reached_at.get_or_insert(now);
        } else {
            *min_reached_at = None;
        }
        // A re-form: which live members of generation `g` are still to rejoin.
        let outstanding = match &current {
            Some(plan) if running.is_none() => {
                let joined: HashSet<&str> = candidates.iter().map(|c| c.node_id.as_str()).collect();
                Some(
                    plan.members
                        .iter()
                        .map(|m| &m.node_id)
                        .filter(|id| live.contains(*id) && !joined.contains(id.as_str()))
                        .cloned()
                        .collect(),
                )
            }
            _ => None,
        };
        let newcomers = fresh_newcomers(current.as_ref(), &candidates, running.is_some(), batched);
        let view = RoundView {
            opened_at: *opened_at,
            min_reached_at: *min_reached_at,
            candidates,
            outstanding,
            newcomers,
            running,
        };
        match decide(&view, now, &self.cfg) {
            Decision::Wait { reason, wake_at } => Ok(Step::Wait(reason, wake_at)),
            Decision::Fail { reason, cause } => Ok(Step::Failed {
                reason,
                cause,
                nodes: view.candidates.iter().map(|c| c.node_id.clone()).collect(),
            }),
            Decision::Form {
                admitted, reason, ..
            } => match env_verdict(&admitted, &joins) {
                Verdict::Refuse(why) => match turned_away(current.as_ref(), &admitted, &joins) {
                    // A re-form refused because of newcomers only: they are turned away (and
                    // end with the refusal); the running job re-forms without them.
                    Some(nodes) if nodes.len() < admitted.len() => {
                        Ok(Step::TurnAway { reason: why, nodes })
                    }
                    _ => Ok(Step::Failed {
                        reason: why,
                        cause: FailCause::Unformable,
                        nodes: view.candidates.iter().map(|c| c.node_id.clone()).collect(),
                    }),
                },
                Verdict::Warn(table) => {
                    let opened = opened_ms(*opened_at, now);
                    self.form(g, rev, &admitted, &joins, reason, Some(table), opened)
                        .await
                }
                Verdict::Consistent => {
                    let opened = opened_ms(*opened_at, now);
                    self.form(g, rev, &admitted, &joins, reason, None, opened)
                        .await
                }
            },
        }
    }

    /// The waiting set in arrival order, less the joins of generation `current`'s members that
    /// got them in (`rev`: `gen/current`'s revision); and whether such a member is starting.
    async fn read_waiting(
        &self,
        rev: i64,
        current: Option<&Plan>,
    ) -> Result<(Vec<Join>, bool), RendezvousError> {
        let waiting = self.state.waiting().await?;
        let mut joins = Vec::with_capacity(waiting.len());
        let mut starting = false;
        for (j, mod_revision) in waiting {
            let consumed = mod_revision <= rev
                && current.is_some_and(|p| p.member(&j.candidate.node_id).is_some());
            if consumed {
                starting = true;
            } else {
                joins.push(j);
            }
        }
        Ok((joins, starting))
    }

    /// Writes generation `g + 1` of `admitted` (guarded on `gen/current`'s revision `rev` and
    /// on `ckpt/latest`), resuming from the newest sealed checkpoint or a node's hint in `joins`;
    /// with it the [`Formation`] record (`opened_at_ms`: when the round opened, wall clock).
    #[allow(clippy::too_many_arguments)]
    async fn form(
        &self,
        g: u64,
        rev: i64,
        admitted: &[Candidate],
        joins: &[Join],
        reason: String,
        env_table: Option<String>,
        opened_at_ms: u64,
    ) -> Result<Step, RendezvousError> {
        let (mut restarts, restarts_rev) = self.read_restarts().await?;
        // Every re-form closes the generation it ends (a lost node, a failure, a scale-up),
        // except one whose members all lost their leases at once (a store outage longer than
        // the TTL fences every agent): nobody was left to close it, so it is counted here, in
        // the formation's own transaction, as the membership restart it is.
        let unclosed = g > 0 && self.state.closed(g).await?.is_none();
        if unclosed {
            restarts.membership += 1;
        }
        let mut plan = assign(
            &self.run_id,
            g + 1,
            admitted,
            restarts.failures,
            restarts.membership,
        )?;
        // Every rank of the generation resumes from the same checkpoint: the newest sealed one
        // not marked bad (or one a node found in its checkpoint directory). Another run's
        // checkpoint (`--ckpt-resume-from`) only starts a run: adopted later, it would throw
        // away the progress of the generations so far.
        let hints: Vec<&Manifest> = admitted
            .iter()
            .filter_map(|c| {
                joins
                    .iter()
                    .find(|j| j.candidate.node_id == c.node_id)
                    .and_then(|j| j.resume_hint.as_deref())
            })
            .filter(|m| g == 0 || m.adopted_from.is_none())
            .collect();
        let resume = self.ledger.resume_point(&hints).await?;
        plan.resume = resume.manifest.clone();
        plan.formed_because = reason.clone();
        plan.notes.extend(env_table);
        let mut formation = self
            .formation_record(g, opened_at_ms, plan.resume.as_ref())
            .await?;
        formation.door = envcheck::door(&env_reports(admitted, joins));
        let formed = self
            .state
            .form(FormGeneration {
                g,
                rev,
                plan: &plan,
                formation: &formation,
                import: resume.manifest.as_ref().filter(|_| resume.import),
                latest_revision: resume.latest_revision,
                unclosed: unclosed.then_some((&restarts, restarts_rev)),
            })
            .await;
        match formed {
            Err(e) => Err(e.into()),
            Ok(true) => {
                if unclosed {
                    tracing::info!(run = %self.run_id, gen = g, "every member of generation {g} lost its lease (a store outage, or every node lost): re-formed as generation {}", g + 1);
                    crate::metrics::global().reformed(&self.run_id, "every member's lease expired");
                }
                tracing::debug!(run = %self.run_id, gen = g + 1, "group formed: {reason}");
                Ok(Step::Formed(Box::new(plan)))
            }
            Ok(false) => Ok(Step::Retry),
        }
    }
}

impl Round {
    /// The record of generation `g + 1`'s formation: the round opened at `opened_at_ms` and
    /// closes now; a re-form (`g > 0`) also counts the work of generation `g` it repeats.
    async fn formation_record(
        &self,
        g: u64,
        opened_at_ms: u64,
        resume: Option<&Manifest>,
    ) -> Result<Formation, RendezvousError> {
        let previous = if g > 0 {
            self.state().formation(g).await?
        } else {
            None
        };
        Ok(Formation {
            round_opened_at_ms: opened_at_ms,
            formed_at_ms: now_ms(),
            lost_work: previous.map(|p| lost_work(p.formed_at_ms, opened_at_ms, resume)),
            door: None,
        })
    }
}

/// The wall-clock time of `opened_at` (milliseconds since the Unix epoch), `now` being now.
fn opened_ms(opened_at: Instant, now: Instant) -> u64 {
    now_ms().saturating_sub((now - opened_at).as_millis() as u64)
}

/// The environment check of the admitted set (pure; see [`crate::envcheck`]).
fn env_verdict(admitted: &[Candidate], joins: &[Join]) -> Verdict {
    envcheck::verdict(&env_reports(admitted, joins))
}

/// Each admitted node as the environment check sees it: the fingerprint its join carries.
fn env_reports<'a>(admitted: &[Candidate], joins: &'a [Join]) -> Vec<Report<'a>> {
    let by_id: std::collections::HashMap<&str, &Join> = joins
        .iter()
        .map(|j| (j.candidate.node_id.as_str(), j))
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
    joins: &[Join],
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
    batched: &mut HashSet<String>,
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
