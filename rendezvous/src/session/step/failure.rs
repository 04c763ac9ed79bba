//! A worker failure's transitions: first, is it a lost member's doing (looked at within the
//! attribution window, [`crate::decisions::loss`])? If not, it is decided against the job-wide
//! restart budget in stages of store work (read, then spend or end the run).

use tokio::time::Instant;

use super::ends::end;
use crate::session::protocol::Event;
use crate::session::state::{
    Attempt, Attribution, BudgetSeen, BudgetStage, Effect, Failure, LossLook, Params, Retry,
    Session, Spending, ATTRIBUTION_POLL, REQUEST_TRIES, RETRY_PAUSE,
};
use crate::session::verdicts;

/// One look for a member's loss behind a worker failure. A loss restarts the group without
/// spending the budget; the workers' own failure (or the window's end) is decided against the
/// budget; meanwhile the failure is looked at again every [`ATTRIBUTION_POLL`].
pub(super) fn on_looked(
    s: &mut Session,
    mut a: Attribution,
    tries: u32,
    result: Result<LossLook, Failure>,
    now: Instant,
    fx: &mut Vec<Effect>,
) -> String {
    let g = a.generation;
    let decide = |a: Attribution, fx: &mut Vec<Effect>| {
        fx.push(Effect::Try {
            what: Attempt::Budget {
                spending: a.decide(),
                stage: BudgetStage::Read,
            },
            tries: 0,
        })
    };
    match result {
        Ok(LossLook::Lost(restarts)) => {
            fx.push(Effect::Emit(Event::FailureDecision {
                restart: true,
                restarts,
                cause: None,
            }));
            format!("the failure in generation {g} is a lost member's doing: a membership restart")
        }
        Ok(LossLook::NotALoss) => {
            decide(a, fx);
            format!("the failure in generation {g} is the workers' own (or decided by a re-form under way)")
        }
        Ok(LossLook::Knocked) => {
            a.knocked = true;
            fx.push(Effect::Try {
                what: Attempt::Attribute(a),
                tries,
            });
            "not every other member's agent answers: looking for a lost member again".into()
        }
        Ok(LossLook::Unseen) if now >= a.until => {
            decide(a, fx);
            format!("no member of generation {g} was lost within the attribution window")
        }
        Ok(LossLook::Unseen) => {
            s.retry = Some(Retry {
                what: Attempt::Attribute(a),
                tries,
                at: now + ATTRIBUTION_POLL,
            });
            String::new()
        }
        Err(f) if f.transient && tries + 1 < REQUEST_TRIES => {
            let why = format!(
                "store unavailable ({}); looking for a lost member again",
                f.message
            );
            s.retry = Some(Retry {
                what: Attempt::Attribute(a),
                tries: tries + 1,
                at: now + RETRY_PAUSE,
            });
            why
        }
        Err(f) => end(s, f.message, fx),
    }
}

/// One stage of deciding a worker failure against the job-wide restart budget came back: the
/// read is judged ([`verdicts::failure_verdict`]) — the failure joins a re-form under way,
/// spends one restart, or ends the run — and the agent hears the decision once the store
/// work for it is done. A spend that lost its race reads again at once; a store that did
/// not answer starts over from the read after [`RETRY_PAUSE`], up to [`REQUEST_TRIES`]
/// tries in all.
pub(super) fn on_budget(
    s: &mut Session,
    spending: Spending,
    tries: u32,
    result: Result<BudgetSeen, Failure>,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    let g = spending.generation;
    let seen = match result {
        Ok(seen) => seen,
        Err(f) if f.transient && tries + 1 < REQUEST_TRIES => {
            let why = format!(
                "store unavailable ({}); deciding the failure of generation {g} again",
                f.message
            );
            s.retry = Some(Retry {
                what: Attempt::Budget {
                    spending,
                    stage: BudgetStage::Read,
                },
                tries: tries + 1,
                at: now + RETRY_PAUSE,
            });
            return why;
        }
        Err(f) => return end(s, f.message, fx),
    };
    let next_stage = |stage: BudgetStage, fx: &mut Vec<Effect>| {
        fx.push(Effect::Try {
            what: Attempt::Budget {
                spending: spending.clone(),
                stage,
            },
            tries,
        })
    };
    match seen {
        BudgetSeen::Read {
            restarts: (restarts, restarts_rev),
            current: (current, gen_rev),
            closed,
            at_ms,
        } => match verdicts::failure_verdict(
            g,
            &spending.description,
            &restarts,
            current,
            closed.as_deref(),
            &p.rules,
            at_ms,
        ) {
            verdicts::FailureVerdict::Joins { restarts, reason } => {
                if closed.is_some() {
                    fx.push(Effect::Note {
                        generation: g,
                        line: reason.clone(),
                    });
                }
                fx.push(Effect::Emit(Event::FailureDecision {
                    restart: true,
                    restarts,
                    cause: None,
                }));
                reason
            }
            verdicts::FailureVerdict::Spend { next, closed } => {
                let why = format!("generation {g}: spending one restart ({closed})");
                next_stage(
                    BudgetStage::Spend {
                        gen_rev,
                        restarts_rev,
                        next,
                        closed,
                    },
                    fx,
                );
                why
            }
            verdicts::FailureVerdict::End { mut end, last } => {
                end.root_cause = spending.cause.clone();
                let why = format!("the restart budget is spent: the run ends ({})", end.reason);
                next_stage(BudgetStage::End { end, last }, fx);
                why
            }
        },
        BudgetSeen::Spent {
            won: true,
            next,
            closed,
        } => {
            fx.push(Effect::Reformed {
                generation: g,
                reason: closed,
            });
            fx.push(Effect::Emit(Event::FailureDecision {
                restart: true,
                restarts: next,
                cause: None,
            }));
            format!("generation {g} closed for a restart of the failed workers")
        }
        BudgetSeen::Spent { won: false, .. } => {
            next_stage(BudgetStage::Read, fx);
            "the budget or the generation changed meanwhile: reading them again".into()
        }
        BudgetSeen::Ended { last, cause } => {
            fx.push(Effect::Emit(Event::FailureDecision {
                restart: false,
                restarts: last,
                cause,
            }));
            format!("generation {g}'s failure ended the run")
        }
    }
}
