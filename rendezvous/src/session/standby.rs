//! A node sent away by a partition stands by until it reaches the nodes it would train with:
//! the pure rule by which its session tells it who those are, or that the run has ended.
//!
//! # Theory of operation
//!
//! The partition rule (`crate::decisions::partition`) keeps the largest set of nodes that all reach each
//! other and fences the others (`split.rs`). Such a node must not join again at once: it would be
//! admitted, fail to reach the same peers, and be sent away again, each time a re-form of the
//! whole job. So its agent holds its join back and probes. What it must reach is not the
//! generation it was sent away from, though: a node of that generation may have died since, or
//! the run may have finished, and a stand-by that waited for them would wait forever.
//!
//! So the standing-by agent asks its session ([`super::Request::StandBy`]), and the session looks
//! at the run every [`LOOK_EVERY`] and tells the agent what it sees ([`look`]):
//!
//! - the run ended: [`super::Event::Finished`], and the agent ends as a late joiner of a finished
//!   run does;
//! - otherwise the nodes to reach ([`super::Event::StandBy`]): the live members of the current
//!   generation and the candidates waiting for the next one, less itself and less nodes without
//!   a probe port (nothing can show they answer). The agent joins once every one of them has
//!   answered its probes within the quiet limit, or at once when the list is empty (nobody runs
//!   whom this node could fail to reach).
//!
//! The session says a look again only when it changed.

use std::time::Duration;

use super::RunEnd;
use crate::{Candidate, Member};

/// How often the session of a standing-by node looks at the run.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// A node the standing-by node must reach before it joins again.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reach {
    /// Its node id.
    pub node_id: String,
    /// The address it advertised (where its agent answers probes).
    pub advertise_addr: String,
    /// Its agent's probe port.
    pub probe_port: u16,
}

/// What the session tells the standing-by agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Look {
    /// The run ended.
    Ended(RunEnd),
    /// Join once every one of these answers (none: join now).
    Reach(Vec<Reach>),
}

/// What the session read of the run.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The run's end, if it ended.
    pub finished: Option<RunEnd>,
    /// The live members of the current generation (membership key still held).
    pub members: Vec<Member>,
    /// The candidates waiting for the next generation.
    pub waiting: Vec<Candidate>,
}

/// What `me`, standing by, is told about the run as `seen`.
pub fn look(me: &str, seen: Seen) -> Look {
    if let Some(end) = seen.finished {
        return Look::Ended(end);
    }
    let members = seen
        .members
        .into_iter()
        .map(|m| (m.node_id, m.advertise_addr, m.probe_port));
    let waiting = seen
        .waiting
        .into_iter()
        .map(|c| (c.node_id, c.advertise_addr, c.probe_port));
    let mut reach: Vec<Reach> = members
        .chain(waiting)
        .filter(|(id, _, port)| id != me && *port != 0)
        .map(|(node_id, advertise_addr, probe_port)| Reach {
            node_id,
            advertise_addr,
            probe_port,
        })
        .collect();
    reach.sort();
    // A member of the current generation that waits for the next one is one node to reach.
    reach.dedup_by(|later, earlier| later.node_id == earlier.node_id);
    Look::Reach(reach)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, port: u16) -> Member {
        Member {
            node_id: id.into(),
            advertise_addr: format!("10.0.0.{}", id.len()),
            node_rank: 0,
            slots: 1,
            base_rank: 0,
            probe_port: port,
        }
    }

    fn candidate(id: &str, port: u16) -> Candidate {
        Candidate {
            node_id: id.into(),
            advertise_addr: format!("10.0.0.{}", id.len()),
            slots: 1,
            requested_node_rank: None,
            master_port: 1,
            probe_port: port,
        }
    }

    fn ids(l: &Look) -> Vec<&str> {
        match l {
            Look::Reach(r) => r.iter().map(|r| r.node_id.as_str()).collect(),
            Look::Ended(_) => panic!("not ended"),
        }
    }

    #[test]
    fn a_finished_run_ends_the_stand_by_whoever_still_runs() {
        let end = RunEnd {
            success: true,
            reason: "every worker exited 0".into(),
            at_ms: 1,
            root_cause: None,
            retryable: false,
            unfit: false,
        };
        let seen = Seen {
            finished: Some(end.clone()),
            members: vec![member("a", 7)],
            waiting: vec![],
        };
        assert_eq!(look("c", seen), Look::Ended(end));
    }

    #[test]
    fn the_nodes_to_reach_are_the_live_members_and_the_waiting_less_itself() {
        let seen = Seen {
            finished: None,
            members: vec![member("b", 7), member("a", 7), member("c", 7)],
            waiting: vec![candidate("d", 7), candidate("c", 7)],
        };
        assert_eq!(ids(&look("c", seen)), vec!["a", "b", "d"]);
    }

    #[test]
    fn a_node_of_the_last_generation_that_died_is_not_waited_for() {
        // Sent away from {a, b, c}; b died since, so the current generation is {a} alone.
        let seen = Seen {
            finished: None,
            members: vec![member("a", 7)],
            waiting: vec![],
        };
        assert_eq!(ids(&look("c", seen)), vec!["a"]);
    }

    #[test]
    fn nobody_running_means_join_now() {
        assert_eq!(look("c", Seen::default()), Look::Reach(vec![]));
    }

    #[test]
    fn a_node_without_a_probe_port_cannot_be_waited_for() {
        let seen = Seen {
            finished: None,
            members: vec![member("a", 0), member("b", 9)],
            waiting: vec![],
        };
        assert_eq!(ids(&look("c", seen)), vec!["b"]);
    }

    #[test]
    fn a_member_waiting_again_is_one_node() {
        let seen = Seen {
            finished: None,
            members: vec![member("a", 7)],
            waiting: vec![candidate("a", 8)],
        };
        let Look::Reach(r) = look("c", seen) else {
            panic!("not ended")
        };
        assert_eq!(r.len(), 1);
    }
}
