//! A node sent away by a partition stands by: its join is held back until every node its
//! session names (`drun_rendezvous::session::standby`) answers this node's probes, or the
//! session says the run ended.

use std::time::Duration;

use drun_rendezvous::session::standby::Reach;
use drun_rendezvous::session::Request;
use drun_rendezvous::Join;
use tokio::time::Instant;

use crate::agent::Agent;
use crate::rdzv::Link;

/// How often a node standing by asks its session again (a session opened anew after the
/// link reconnected does not know the node stands by).
const STAND_BY_AGAIN: Duration = Duration::from_secs(3);

/// Where this node stands after a partition.
#[derive(Default)]
pub(super) struct Partition {
    /// The session sent this node away for a partition: it joins again only once every peer
    /// of its last generation answers its probes.
    pub(super) sent_away: bool,
    /// Standing by: the join held back meanwhile.
    stand_by: Option<StandBy>,
}

/// A join held back by a partition.
struct StandBy {
    /// The join, with its candidate.
    join: Join,
    /// The generation this node was sent away from.
    after: u64,
    /// When the session was last asked whom this node must reach.
    asked: Instant,
    /// The session said whom to reach (`Event::StandBy`): the probes watch those nodes, and the
    /// join goes once every one of them answers.
    told_whom: bool,
}

impl Agent {
    /// Holds `join` (after generation `after`) back: this node stands by and asks its session
    /// whom it must reach.
    pub(super) fn stand_by(&self, part: &mut Partition, join: Join, after: u64, link: &Link) {
        tracing::warn!(
            "standing by: sent away from generation {after} because its nodes could not all reach each other; joining again once every one of them answers this node's probes"
        );
        part.stand_by = Some(StandBy {
            join,
            after,
            asked: Instant::now(),
            told_whom: false,
        });
        let _ = link.tx.send(Request::StandBy(after));
    }

    /// Whether every peer of the last generation answers this node's probes.
    pub(super) fn peers_all_answer(&self) -> bool {
        self.peers
            .as_ref()
            .is_none_or(|p| p.health().verdict(Instant::now()) == crate::peers::Verdict::AllAnswer)
    }

    /// The session said whom this node, standing by, must reach: the probes watch them, or,
    /// with nobody to reach, the join goes now.
    pub(super) fn told_whom(&mut self, part: &mut Partition, reach: &[Reach], link: &Link) {
        let (Some(s), Some(p)) = (part.stand_by.as_mut(), &self.peers) else {
            return;
        };
        if reach.is_empty() {
            tracing::info!("no node this one could fail to reach runs now: joining");
            self.join_deferred(part, link);
            return;
        }
        p.watch(s.after, reach);
        s.told_whom = true;
        let names: Vec<&str> = reach.iter().map(|r| r.node_id.as_str()).collect();
        tracing::info!(
            "standing by: joining once {} answer this node's probes",
            names.join(", ")
        );
    }

    /// A join deferred by a partition goes out once every node to reach answers: those the
    /// session named, or before it did, every node of the last generation.
    pub(super) fn join_when_reachable(&mut self, part: &mut Partition, link: &Link) {
        let Some(s) = part.stand_by.as_ref() else {
            return;
        };
        let (after, now) = (s.after, Instant::now());
        let reachable = if s.told_whom {
            self.peers
                .as_ref()
                .is_none_or(|p| p.health().all_heard(now))
        } else {
            self.peers_all_answer()
        };
        if reachable {
            tracing::info!(
                "every node to reach answers this node's probes again (sent away after generation {after}): joining"
            );
            self.join_deferred(part, link);
        } else if now.saturating_duration_since(s.asked) >= STAND_BY_AGAIN {
            if let Some(s) = part.stand_by.as_mut() {
                s.asked = now;
            }
            let _ = link.tx.send(Request::StandBy(after));
        }
    }

    /// Sends the join held back by a partition.
    fn join_deferred(&mut self, part: &mut Partition, link: &Link) {
        let Some(s) = part.stand_by.take() else {
            return;
        };
        part.sent_away = false;
        if let Some(m) = &self.metrics {
            m.joining();
        }
        let _ = link.tx.send(Request::Join(s.join, s.after));
    }
}
