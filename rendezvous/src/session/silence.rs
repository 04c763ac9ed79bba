//! A member its peers no longer hear: the pure rule by which a node's own session gives the node
//! up a moment after its cable is pulled or its host hangs, long before its lease would expire.
//!
//! # Theory of operation
//!
//! Each agent probes its generation's peers (the launcher's `peers` module) and reports the ones
//! that stopped answering. Its session writes one accusation per silent peer,
//! `gen/<g>/silent/<accused>/<by>`, under its own lease (withdrawn when the peer answers again,
//! gone with the accuser). Every member watches `gen/<g>/`, so the accused node's session sees
//! it, and only that session acts for its node:
//!
//! - it asks its agent to answer at once (a ping on the session's stream);
//! - an agent that answers within [`PING_WAIT`] still reaches the control plane, so the fault
//!   lies on the path between the peers: both sides report each other, and the partition rule
//!   (`crate::decisions::partition`) decides which side leaves;
//! - an agent that does not answer reaches neither its peers nor the server (a pulled cable, a
//!   dead switch port, a hung host): the node is lost now. The session records why, revokes the
//!   lease, and the others re-form as after any loss.
//!
//! Each new accusation (an accuser repeats its report while the silence lasts) asks again, so an
//! agent that answered once and then went is still found. The cut-off agent itself hears from
//! neither the server nor its peers and fences itself when its lease TTL passes, stopping its
//! workers within their grace; whatever its old world still does is refused by the generation's
//! fencing token (see `docs/architecture.md`, "Silent members").
//!
//! A false accusation costs a ping. A node is given up only when a peer cannot hear it *and* the
//! server cannot either, for [`PING_WAIT`] after asking.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

/// How long the accused node's agent has to answer the ping.
pub const PING_WAIT: Duration = Duration::from_millis(500);

/// One node's side of the accusations of its generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Silence {
    /// Members that say this node does not answer their probes.
    accused_by: BTreeSet<String>,
    /// When this node's agent was asked to answer; cleared when it answers.
    asked: Option<Instant>,
    /// Members this node's agent says do not answer (this session's accusations).
    accusing: BTreeSet<String>,
}

/// What the session does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Act {
    /// Nothing; the reason, if not empty, is logged.
    Nothing(String),
    /// Ask the agent to answer at once.
    Ping(String),
    /// Give the node up unless its agent was heard since the ask: the one-line reason is
    /// recorded as its loss.
    GiveUp {
        /// When the agent was asked.
        asked_at: Instant,
        /// Why, for the loss record and the others' re-form line.
        reason: String,
    },
}

/// The accusations to write and to withdraw after this node's agent reported `silent`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Accusations {
    /// Peers accused (again: a repeated accusation asks the accused again).
    pub write: Vec<String>,
    /// Peers no longer accused.
    pub withdraw: Vec<String>,
}

impl Silence {
    /// Member `by` says this node does not answer (`still`), or no longer says so.
    pub fn accused(&mut self, by: &str, still: bool, now: Instant) -> Act {
        if !still {
            self.accused_by.remove(by);
            if self.accused_by.is_empty() {
                self.asked = None;
            }
            return Act::Nothing(format!("node {by} hears this node again"));
        }
        self.accused_by.insert(by.to_string());
        if self.asked.is_some() {
            return Act::Nothing(String::new());
        }
        self.asked = Some(now);
        Act::Ping(format!(
            "node {by} says this node does not answer its probes; asking this node's agent to answer within {} ms",
            PING_WAIT.as_millis()
        ))
    }

    /// The agent was heard (any message after the ask).
    pub fn heard(&mut self, now: Instant) -> Act {
        match self.asked.take() {
            Some(at) => Act::Nothing(format!(
                "this node's agent answered after {} ms: it reaches the control plane, so the path between the peers is at fault (the partition rule judges both sides' reports)",
                now.saturating_duration_since(at).as_millis()
            )),
            None => Act::Nothing(String::new()),
        }
    }

    /// When a tick can give the node up.
    pub fn wake_at(&self) -> Option<Instant> {
        self.asked.map(|at| at + PING_WAIT)
    }

    /// Time passed: an ask unanswered for [`PING_WAIT`] gives the node up.
    pub fn tick(&self, now: Instant) -> Act {
        match self.asked {
            Some(at) if now >= at + PING_WAIT && !self.accused_by.is_empty() => {
                let by: Vec<&str> = self.accused_by.iter().map(String::as_str).collect();
                Act::GiveUp {
                    asked_at: at,
                    reason: format!(
                        "neither its peers ({}) nor the rendezvous server hear it (a pulled cable, a dead switch port or a hung host)",
                        by.join(", ")
                    ),
                }
            }
            _ => Act::Nothing(String::new()),
        }
    }

    /// This node's agent reports `silent` (node ids of its generation's peers): the accusations
    /// to write — all of them, again — and the ones to withdraw.
    pub fn report(&mut self, silent: BTreeSet<String>) -> Accusations {
        let withdraw = self.accusing.difference(&silent).cloned().collect();
        let write = silent.iter().cloned().collect();
        self.accusing = silent;
        Accusations { write, withdraw }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_accused_node_whose_agent_stays_silent_is_given_up_after_the_wait() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        let act = s.accused("n1", true, t0);
        assert!(
            matches!(act, Act::Ping(ref r) if r.contains("node n1 says")),
            "{act:?}"
        );
        assert_eq!(s.wake_at(), Some(t0 + PING_WAIT));
        assert!(
            matches!(s.accused("n2", true, t0 + ms(100)), Act::Nothing(_)),
            "one ask at a time"
        );
        assert_eq!(s.tick(t0 + PING_WAIT - ms(1)), Act::Nothing(String::new()));
        match s.tick(t0 + PING_WAIT) {
            Act::GiveUp { asked_at, reason } => {
                assert_eq!(asked_at, t0);
                assert!(
                    reason.contains("neither its peers (n1, n2) nor the rendezvous server"),
                    "{reason}"
                );
            }
            a => panic!("{a:?}"),
        }
    }

    #[test]
    fn an_agent_that_answers_keeps_its_node_and_a_repeated_accusation_asks_again() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.accused("n1", true, t0);
        let act = s.heard(t0 + ms(3));
        assert!(
            matches!(act, Act::Nothing(ref r) if r.contains("answered after 3 ms")),
            "{act:?}"
        );
        assert_eq!(s.wake_at(), None);
        assert_eq!(s.tick(t0 + ms(5_000)), Act::Nothing(String::new()));
        // The accuser repeats its report while the silence lasts: the agent is asked again.
        assert!(matches!(
            s.accused("n1", true, t0 + ms(2_000)),
            Act::Ping(_)
        ));
        assert!(
            matches!(s.tick(t0 + ms(2_500)), Act::GiveUp { asked_at, .. } if asked_at == t0 + ms(2_000))
        );
    }

    #[test]
    fn withdrawn_accusations_call_the_ask_off() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        s.accused("n1", true, t0);
        s.accused("n2", true, t0);
        s.accused("n1", false, t0 + ms(100));
        assert!(s.wake_at().is_some(), "n2 still accuses");
        s.accused("n2", false, t0 + ms(200));
        assert_eq!(s.wake_at(), None);
        assert_eq!(s.tick(t0 + ms(1_000)), Act::Nothing(String::new()));
    }

    #[test]
    fn a_report_writes_every_accusation_again_and_withdraws_the_ones_dropped() {
        let mut s = Silence::default();
        let set = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            s.report(set(&["a", "b"])),
            Accusations {
                write: vec!["a".into(), "b".into()],
                withdraw: vec![]
            }
        );
        assert_eq!(
            s.report(set(&["b"])),
            Accusations {
                write: vec!["b".into()],
                withdraw: vec!["a".into()]
            }
        );
        assert_eq!(
            s.report(set(&[])),
            Accusations {
                write: vec![],
                withdraw: vec!["b".into()]
            }
        );
    }
}
