//! A generation whose members cannot all reach each other (their agents' peer probes go
//! unanswered): after each peers report of its node, a session judges the generation with the
//! pure [`crate::partition::decide`] — every session reads the same reports and takes the same
//! decision — and acts for its own node only: a node sent away is fenced (its agent stops its
//! workers and stands by until it reaches the others again; the others lose it as any lost node
//! and re-form), and a split below the run's minimum ends the run for every node.

use super::actor::{Actor, Phase};
use super::protocol::RunEnd;
use crate::clock::now_ms;
use crate::partition::{self, Decision};
use crate::reports::ReportKind;
use crate::store::{Compare, Op, Txn};
use crate::{run_state, Plan, RendezvousError};

/// How a fence for a partition begins (the agent stands by after it).
pub const PARTITIONED: &str = "partitioned from its peers";

impl Actor {
    /// Judges `plan`'s generation after a peers report; `Some(Idle)`: this node was sent away.
    pub(super) async fn judge_partition(
        &mut self,
        plan: &Plan,
    ) -> Result<Option<Phase>, RendezvousError> {
        let Some(me) = plan.member(&self.cfg.node_id).map(|m| m.node_rank) else {
            return Ok(None);
        };
        let reports = crate::reports::read(self.store.as_ref(), self.round.keys()).await?;
        let peers = reports
            .get(ReportKind::Peers.as_str())
            .into_iter()
            .flatten()
            .map(|(_, r)| r)
            .filter(|r| r["generation"].as_u64() == Some(plan.generation))
            .filter_map(|r| {
                let from = u32::try_from(r["node_rank"].as_u64()?).ok()?;
                let silent = r["silent"]
                    .as_array()?
                    .iter()
                    .filter_map(|s| u32::try_from(s.as_u64()?).ok())
                    .collect();
                Some((from, silent))
            });
        let broken = partition::broken_pairs(peers);
        let nodes = plan.node_count() as u32;
        match partition::decide(nodes, &broken, self.cfg.round.min_nodes as u32) {
            Decision::Whole => Ok(None),
            Decision::Split { leave, reason, .. } if leave.contains(&me) => {
                tracing::warn!(run = %self.cfg.run_id, gen = plan.generation, node = %self.cfg.node_id, "{reason}");
                let keys = self.round.keys().clone();
                self.store
                    .put(
                        &keys.lost(&self.cfg.node_id),
                        reason.clone().into_bytes(),
                        None,
                    )
                    .await?;
                if let Some(lease) = self.lease {
                    self.stop_keeper();
                    self.store.lease_revoke(lease).await?;
                }
                self.fence(format!("{PARTITIONED}: {reason}"));
                Ok(Some(Phase::Idle))
            }
            Decision::Split { .. } => Ok(None),
            Decision::End { reason } => {
                let keys = self.round.keys();
                let end = RunEnd {
                    success: false,
                    reason: reason.clone(),
                    at_ms: now_ms(),
                    root_cause: None,
                    retryable: true,
                };
                self.store
                    .txn(Txn {
                        compares: vec![Compare::Missing(keys.finished())],
                        success: vec![Op::put(keys.finished(), run_state::encode(&end))],
                        failure: vec![],
                    })
                    .await?;
                tracing::error!(run = %self.cfg.run_id, gen = plan.generation, "{reason}");
                Ok(None)
            }
        }
    }
}
