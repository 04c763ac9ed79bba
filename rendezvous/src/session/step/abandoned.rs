//! The abandoned agent's transitions (server-side sessions): its stream ended without a Leave;
//! the knock on its probe port, the reconnect grace, the hold while the whole run is silent,
//! the return grace, and the revocation of its lease.

use std::time::Duration;

use tokio::time::Instant;

use super::ends::end;
use crate::human::duration as human;
use crate::session::hold;
use crate::session::liveness::Knock;
use crate::session::state::{Abandoned, Effect, Failure, Params, Phase, Session};

/// The agent's stream ended without a Leave (its process died, or its connection broke).
/// Server-side, after [`crate::decisions::loss::RECONNECT_GRACE`] its lease is revoked unless the agent
/// reconnected meanwhile (another session resumed its lease) or the run is over: the others
/// learn of a crashed agent in about a second instead of a lease TTL. The grace is cut short
/// when the agent's host says its probe port is closed (`liveness.rs`).
pub(super) fn on_closed(s: &mut Session, now: Instant, p: &Params, fx: &mut Vec<Effect>) -> String {
    s.retry = None;
    match s.lease {
        Some(lease) if !p.renews_itself => {
            s.phase = Phase::Abandoned(Abandoned {
                lease,
                at: Some(now + crate::decisions::loss::RECONNECT_GRACE),
                gone: false,
                held: false,
            });
            fx.push(Effect::Knock);
            "the agent's stream ended without a leave: knocking on its probe port".into()
        }
        _ => {
            s.phase = Phase::Left;
            "the agent's stream ended".into()
        }
    }
}

/// The abandoned agent's host answered the knock (or did not).
pub(super) fn on_knocked(s: &mut Session, k: Knock, fx: &mut Vec<Effect>) -> String {
    let Phase::Abandoned(a) = &mut s.phase else {
        return String::new();
    };
    if k != Knock::Gone {
        return String::new();
    }
    a.gone = true;
    a.at = None;
    fx.push(Effect::CheckSpeaks { lease: a.lease });
    "nothing listens on the agent's probe port any more: its process is gone".into()
}

/// An abandoned agent's look: revoke its lease, hold it while the whole run is silent, or
/// let another session (or the run's end) have it.
pub(super) fn on_speaks(
    s: &mut Session,
    r: Result<(bool, Option<Duration>), Failure>,
    now: Instant,
    p: &Params,
    fx: &mut Vec<Effect>,
) -> String {
    let mut a = match std::mem::take(&mut s.phase) {
        Phase::Abandoned(a) => a,
        other => {
            s.phase = other;
            return String::new();
        }
    };
    let (speaks, run_silent) = match r {
        Ok(seen) => seen,
        Err(f) => return end(s, f.message, fx),
    };
    let ttl = p.rules.lease_ttl;
    if !speaks {
        s.phase = Phase::Left;
        return "another session resumed the agent's lease, or the run ended: its lease stays"
            .into();
    }
    if a.gone {
        s.phase = Phase::Left;
        s.lease = None;
        fx.push(Effect::RevokeAbandoned {
            lease: a.lease,
            why: "the agent's connection closed without leaving and its host says nothing listens on its probe port any more (its process is gone): revoking its lease".into(),
        });
        return String::new();
    }
    match hold::after_break(run_silent, ttl) {
        hold::AfterBreak::Hold => {
            if !a.held {
                a.held = true;
                fx.push(Effect::Warn(format!(
                    "the agent's connection broke, but no agent of the run was heard for {} either: this server is more likely cut off than every node; holding its lease (up to {}) for it to come back",
                    human(run_silent.unwrap_or_default()),
                    human(hold::HOLD_MAX)
                )));
            }
            a.at = Some(now + p.keep_alive.min(Duration::from_secs(1)));
            s.phase = Phase::Abandoned(a);
            String::new()
        }
        hold::AfterBreak::Revoke if a.held => {
            // The run is heard again: give this agent as long to come back.
            a.held = false;
            a.at = Some(now + hold::return_grace(ttl));
            s.phase = Phase::Abandoned(a);
            "the run is heard again: the abandoned agent has a grace to come back".into()
        }
        hold::AfterBreak::Revoke => {
            s.phase = Phase::Left;
            s.lease = None;
            fx.push(Effect::RevokeAbandoned {
                lease: a.lease,
                why: format!(
                    "the agent's connection closed without leaving and it did not come back within {}: revoking its lease",
                    human(crate::decisions::loss::RECONNECT_GRACE)
                ),
            });
            String::new()
        }
    }
}
