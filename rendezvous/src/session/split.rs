//! A generation whose members cannot all reach each other (their agents' peer probes go
//! unanswered): after each peers report of its node, a session judges the generation with the
//! pure [`crate::decisions::partition::decide`] — every session reads the same reports and takes the same
//! decision — and acts for its own node only: a node sent away is fenced (its agent stops its
//! workers and stands by until it reaches the others again; the others lose it as any lost node
//! and re-form), and a split below the run's minimum ends the run for every node.

use std::collections::BTreeSet;

use super::actor::Actor;
use super::generation::Running;
use super::protocol::RunEnd;
use super::state::Phase;
use crate::clock::now_ms;
use crate::decisions::partition::{self, Decision};
use crate::store::reports::ReportKind;
use crate::{Plan, RendezvousError};

/// How a fence for a partition begins (the agent stands by after it).
pub const PARTITIONED: &str = "partitioned from its peers";

impl Actor {
    /// Writes this node's accusations for its agent's peers report `json` of `run`'s
    /// generation (`gen/<g>/silent/<accused>/<me>`, under this node's lease), and withdraws the
    /// ones its agent dropped ([`super::silence`]).
    pub(super) async fn accuse(
        &mut self,
        run: &mut Running,
        json: &str,
    ) -> Result<(), RendezvousError> {
        let Some(lease) = self.lease() else {
            return Ok(());
        };
        let Ok(r) = serde_json::from_str::<serde_json::Value>(json) else {
            return Ok(());
        };
        let g = run.generation();
        if r["generation"].as_u64() != Some(g) {
            return Ok(());
        }
        let silent: BTreeSet<String> = r["silent"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| u32::try_from(s.as_u64()?).ok())
            .filter_map(|rank| run.plan.members.iter().find(|m| m.node_rank == rank))
            .map(|m| m.node_id.clone())
            .filter(|id| *id != self.cfg.node_id)
            .collect();
        let acc = run.silence.report(silent);
        self.round
            .state()
            .accuse(g, &self.cfg.node_id, &acc.write, &acc.withdraw, lease)
            .await?;
        Ok(())
    }

    /// Gives this node up as lost in generation `g` (its peers and the server do not hear it,
    /// [`super::silence`]): records why, revokes the lease (its membership key goes, and the
    /// member watching it re-forms the others) and fences the agent (the phase to go to).
    pub(super) async fn give_up(
        &mut self,
        g: u64,
        reason: String,
    ) -> Result<Phase, RendezvousError> {
        tracing::warn!(run = %self.cfg.run_id, gen = g, node = %self.cfg.node_id, "node {} is lost: {reason}", self.cfg.node_id);
        let fence = format!("given up: {reason}");
        self.leave_as_lost(reason, fence).await
    }

    /// Drops this node from its generation: `lost/<node>` says why (`reason`), the lease is
    /// revoked (its membership key goes, and the member watching it re-forms the others), and
    /// the agent is fenced with `fence` (the phase to go to).
    async fn leave_as_lost(
        &mut self,
        reason: String,
        fence: String,
    ) -> Result<Phase, RendezvousError> {
        let state = self.round.state().clone();
        state.record_lost(&self.cfg.node_id, &reason).await?;
        if let Some(lease) = self.lease() {
            self.stop_keeper();
            state.revoke_lease(lease).await?;
        }
        Ok(self.fence(fence))
    }

    /// Judges `plan`'s generation after a peers report; `Some(Fenced)`: this node was sent away.
    pub(super) async fn judge_partition(
        &mut self,
        plan: &Plan,
    ) -> Result<Option<Phase>, RendezvousError> {
        let Some(me) = plan.member(&self.cfg.node_id).map(|m| m.node_rank) else {
            return Ok(None);
        };
        let reports = self.round.state().reports().await?;
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
                let fence = format!("{PARTITIONED}: {reason}");
                self.leave_as_lost(reason, fence).await.map(Some)
            }
            Decision::Split { .. } => Ok(None),
            Decision::End { reason } => {
                let end = RunEnd {
                    success: false,
                    reason: reason.clone(),
                    at_ms: now_ms(),
                    root_cause: None,
                    retryable: true,
                    unfit: false,
                };
                self.round.state().end(&end).await?;
                tracing::error!(run = %self.cfg.run_id, gen = plan.generation, "{reason}");
                Ok(None)
            }
        }
    }
}
