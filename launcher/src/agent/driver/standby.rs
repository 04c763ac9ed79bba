//! A node sent away by a partition stands by: its join is held back until every node its
//! session names (`drun_rendezvous::session::standby`) answers this node's probes, or the
//! session says the run ended.

use std::time::Duration;

use drun_rendezvous::session::standby::Reach;
use drun_rendezvous::session::Request;
use tokio::time::Instant;

use super::World;
use crate::agent::Agent;
use crate::rdzv::Link;

/// How often a node standing by asks its session again (a session opened anew after the
/// link reconnected does not know the node stands by).
const STAND_BY_AGAIN: Duration = Duration::from_secs(3);

impl Agent {
    /// Whether every peer of the last generation answers this node's probes.
    pub(super) fn peers_all_answer(&self) -> bool {
        self.peers
            .as_ref()
            .is_none_or(|p| p.health().verdict(Instant::now()) == crate::peers::Verdict::AllAnswer)
    }

    /// The session said whom this node, standing by, must reach: the probes watch them, or,
    /// with nobody to reach, the join goes now.
    pub(super) fn told_whom(&mut self, w: &mut World, reach: &[Reach], link: &Link) {
        let (Some((_, after)), Some(p)) = (&w.deferred_join, &self.peers) else {
            return;
        };
        if reach.is_empty() {
            tracing::info!("no node this one could fail to reach runs now: joining");
            self.join_deferred(w, link);
            return;
        }
        p.watch(*after, reach);
        w.told_whom = true;
        let names: Vec<&str> = reach.iter().map(|r| r.node_id.as_str()).collect();
        tracing::info!(
            "standing by: joining once {} answer this node's probes",
            names.join(", ")
        );
    }

    /// A join deferred by a partition goes out once every node to reach answers: those the
    /// session named, or before it did, every node of the last generation.
    pub(super) fn join_when_reachable(&mut self, w: &mut World, link: &Link) {
        let Some((_, after)) = &w.deferred_join else {
            return;
        };
        let now = Instant::now();
        let reachable = if w.told_whom {
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
            self.join_deferred(w, link);
        } else if w
            .stand_by_asked
            .is_none_or(|at| now.saturating_duration_since(at) >= STAND_BY_AGAIN)
        {
            w.stand_by_asked = Some(now);
            let _ = link.tx.send(Request::StandBy(*after));
        }
    }

    /// Sends the join held back by a partition.
    fn join_deferred(&mut self, w: &mut World, link: &Link) {
        let Some((cand, after)) = w.deferred_join.take() else {
            return;
        };
        w.partitioned = false;
        w.told_whom = false;
        w.stand_by_asked = None;
        if let Some(m) = &self.metrics {
            m.joining();
        }
        let _ = link.tx.send(Request::Join(cand, after));
    }
}
