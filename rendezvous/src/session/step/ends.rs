//! What the session's transitions share, a leaf: ending the session on an error.

use crate::session::protocol::Event;
use crate::session::state::{Effect, Phase, Session};

/// The session ends on an error it cannot get past; the agent hears it.
pub(super) fn end(s: &mut Session, message: String, fx: &mut Vec<Effect>) -> String {
    s.phase = Phase::Left;
    s.retry = None;
    fx.push(Effect::Emit(Event::Error(message.clone())));
    format!("the session ends: {message}")
}
