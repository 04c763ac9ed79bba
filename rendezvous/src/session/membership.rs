//! The session's store work around membership loss: which session speaks for a node, the knock
//! on a vanished agent's probe port and the revocation of its lease (when, is the step's), lost
//! members named, and one look whether a worker failure coincides with a loss (see
//! [`crate::decisions::loss`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::actor::Actor;
use super::liveness::{self, Knock};
use super::protocol::SaveRequest;
use super::state::{Attribution, LeaseChange, LossLook};
use crate::clock::now_ms;
use crate::decisions::loss::{self, KnockVerdict};
use crate::store::LeaseId;
use crate::{Plan, RendezvousError, StoreError};

/// A worker failure's session knocks on the other members' probe ports only up to this many
/// nodes (beyond, the attribution window is waited out as before).
const KNOCK_UP_TO: usize = 64;
/// How long the other members' agents have to answer that knock.
const KNOCK_WAIT: Duration = Duration::from_millis(300);

impl Actor {
    /// Server-side: records that this session resumed the node's lease `lease` and speaks for
    /// it now (see [`crate::store::keys::RunKeys::session_owner`]).
    pub(super) async fn claim(&self, lease: LeaseId) -> Result<(), StoreError> {
        if self.cfg.auto_keep_alive {
            return Ok(());
        }
        self.round
            .state()
            .claim(&self.cfg.node_id, &self.token, lease)
            .await
    }

    /// The plan that admitted this node while its agent was away: the generation's membership
    /// key is written (and the join deleted) before the agent is told, so a server that stops
    /// in between leaves an agent that still thinks it waits, with no join left to wait on. A
    /// membership key of the current generation, under the lease the agent resumes with (a
    /// later join of the node deletes it in the same transaction), is that admission.
    pub(super) async fn admitted_while_away(&self) -> Result<Option<Plan>, StoreError> {
        let (g, _) = self.round.current_generation().await?;
        if g == 0 || g <= self.state.last_gen {
            return Ok(None);
        }
        if !self.round.state().is_member(g, &self.cfg.node_id).await? {
            return Ok(None);
        }
        Ok(self
            .round
            .plan(g)
            .await?
            .filter(|p| p.member(&self.cfg.node_id).is_some()))
    }

    /// Knocks on the abandoned agent's probe port, up to [`loss::RECONNECT_GRACE`]
    /// (`liveness.rs`); no address to knock at is no evidence.
    pub(super) async fn knock_agent(&self) -> Knock {
        match self.probe_address().await {
            Some((host, port)) => {
                let tag = crate::probe::run_tag(&self.cfg.run_id);
                liveness::knock(tag, &host, port, loss::RECONNECT_GRACE).await
            }
            None => Knock::NoAnswer,
        }
    }

    /// How long no agent of the run was heard on this server (`None`: not a server session).
    pub(super) fn run_silent(&self) -> Option<Duration> {
        self.run_heard
            .as_ref()
            .map(|r| Duration::from_millis(now_ms().saturating_sub(r.load(Ordering::SeqCst))))
    }

    /// Where this node's agent answers peer probes: its candidacy's, or its member entry's in
    /// the generation it ran (a session resumed on this replica); `None` without a probe port.
    async fn probe_address(&self) -> Option<(String, u16)> {
        if let Some(at) = &self.probe_at {
            return Some(at.clone()).filter(|(_, port)| *port != 0);
        }
        let plan = self.round.plan(self.state.last_gen).await.ok()??;
        let me = plan.member(&self.cfg.node_id)?;
        (me.probe_port != 0).then(|| (me.advertise_addr.clone(), me.probe_port))
    }

    /// Knocks on the probe port of every other member of `plan` (`liveness.rs`): each member
    /// with what its port said. `None` when some member cannot be asked (no probe port, a group
    /// beyond [`KNOCK_UP_TO`] nodes); an agent that does not answer within [`KNOCK_WAIT`] is
    /// [`Knock::NoAnswer`].
    async fn knock_other_members(&self, plan: &Plan) -> Option<Vec<(String, Knock)>> {
        if plan.members.len() > KNOCK_UP_TO {
            return None;
        }
        let others: Vec<_> = plan
            .members
            .iter()
            .filter(|m| m.node_id != self.cfg.node_id)
            .collect();
        if others.is_empty() || others.iter().any(|m| m.probe_port == 0) {
            return None;
        }
        let at: Vec<(String, u16)> = others
            .iter()
            .map(|m| (m.advertise_addr.clone(), m.probe_port))
            .collect();
        let tag = crate::probe::run_tag(&self.cfg.run_id);
        let knocks = liveness::knock_all(tag, &at, KNOCK_WAIT).await;
        Some(
            others
                .iter()
                .map(|m| m.node_id.clone())
                .zip(knocks)
                .collect(),
        )
    }

    /// Drops `node`, a member of generation `g` whose agent's process is gone: records why
    /// and revokes the lease its membership key is under (agent-side sessions only, where that
    /// lease is the node's own; see [`loss::judge_knocks`]).
    async fn drop_gone_member(&self, g: u64, node: &str) -> Result<(), StoreError> {
        let state = self.round.state();
        let Some(lease) = state.member_lease(g, node).await? else {
            return Ok(());
        };
        state.record_lost(node, loss::AGENT_GONE).await?;
        state.revoke_lease(lease).await
    }

    /// Records why the agent is gone and revokes its lease: the others re-form.
    pub(super) async fn revoke_abandoned(&mut self, lease: LeaseId) -> Result<(), RendezvousError> {
        let state = self.round.state().clone();
        self.stop_keeper();
        state
            .record_lost(&self.cfg.node_id, loss::CONNECTION_CLOSED)
            .await?;
        state.revoke_lease(lease).await?;
        self.lease_changed(LeaseChange::Released);
        Ok(())
    }

    /// Whether this session still speaks for its node's `lease`: no other session resumed it
    /// (the agent reconnected elsewhere) and the run has not finished.
    pub(super) async fn still_speaks_for_the_node(
        &self,
        lease: LeaseId,
    ) -> Result<bool, RendezvousError> {
        let speaks = self
            .round
            .state()
            .speaks_for(&self.cfg.node_id, lease, &self.token)
            .await?;
        Ok(speaks && self.finished().await?.is_none())
    }

    /// Members of `plan` (other than this node) that are gone now, each described with why.
    pub(super) async fn lost_members(&self, plan: &Plan) -> Result<Vec<String>, RendezvousError> {
        let present = self.round.live_members(plan.generation).await?;
        let mut out = Vec::new();
        for node in loss::missing(plan, &self.cfg.node_id, &present) {
            let why = self.round.state().lost(&node).await?;
            out.push(loss::describe(plan, &node, &why));
        }
        Ok(out)
    }

    /// Whether generation `g` was asked for a preemption checkpoint that is now sealed: its
    /// agents are stopping for good.
    pub(super) async fn preemption_sealed(&self, g: u64) -> Result<bool, RendezvousError> {
        let state = self.round.state();
        let Some(req) = state.save_request(g, false).await? else {
            return Ok(false);
        };
        let Ok(req) = serde_json::from_slice::<SaveRequest>(&req) else {
            return Ok(false);
        };
        let latest = state.ckpt_latest().await?;
        Ok(latest.is_some_and(|(id, _)| id > req.latest_before))
    }

    /// One look whether the worker failure `a` coincides with a membership loss (see
    /// [`loss`]; the step looks again until the window ends): a member gone closes the
    /// generation as a membership restart naming the lost node(s) first; a re-form under way,
    /// or every other member's agent answering a knock (asked once), says the failure is the
    /// workers' own.
    pub(super) async fn look_for_loss(&self, a: &Attribution) -> Result<LossLook, RendezvousError> {
        let g = a.generation;
        let Some(plan) = self.round.plan(g).await? else {
            return Ok(LossLook::NotALoss);
        };
        if plan.members.len() < 2 {
            return Ok(LossLook::NotALoss);
        }
        if self.round.state().closed(g).await?.is_some() {
            // A re-form is under way (a loss, or a peer that failed first): decided there.
            return Ok(LossLook::NotALoss);
        }
        let lost = self.lost_members(&plan).await?;
        if !lost.is_empty() {
            let reason = loss::attributed(&lost, &a.description);
            self.close(g, reason, true).await?;
            return Ok(LossLook::Lost(self.round.restarts().await?));
        }
        if a.knocked {
            return Ok(LossLook::Unseen);
        }
        let knocks = self.knock_other_members(&plan).await.unwrap_or_default();
        match loss::judge_knocks(&knocks, self.cfg.auto_keep_alive) {
            KnockVerdict::WorkersOwn => {
                tracing::info!(
                    run = %self.cfg.run_id,
                    gen = g,
                    "every other node's agent answers its probe port: the failure is the workers' own"
                );
                Ok(LossLook::NotALoss)
            }
            KnockVerdict::Drop(gone) => {
                for node in &gone {
                    tracing::warn!(
                        run = %self.cfg.run_id,
                        gen = g,
                        "node {node}'s host says nothing listens on its probe port any more: dropping it from the group"
                    );
                    self.drop_gone_member(g, node).await?;
                }
                let lost = self.lost_members(&plan).await?;
                if lost.is_empty() {
                    return Ok(LossLook::Knocked);
                }
                self.close(g, loss::attributed(&lost, &a.description), true)
                    .await?;
                Ok(LossLook::Lost(self.round.restarts().await?))
            }
            KnockVerdict::Undecided => Ok(LossLook::Knocked),
        }
    }
}
