//! A failed round's verdict: published once by its decider, read by every node waiting in it.

use super::{Round, RoundFailure};
use crate::{RendezvousError, StoreError};

impl Round {
    /// The published verdict on this node's round, if any: a [`RoundFailure`] naming `node_id`,
    /// written after its join (`join_rev`).
    pub(super) async fn failure_for(
        &self,
        node_id: &str,
        join_rev: i64,
    ) -> Result<Option<String>, StoreError> {
        let Some((f, mod_revision)) = self.state.round_failure().await? else {
            return Ok(None);
        };
        if mod_revision <= join_rev {
            return Ok(None); // an earlier round's
        }
        Ok(f.message_for(node_id).map(str::to_string))
    }

    /// Publishes the decider's verdict `err` to every node of the round (`nodes`) and returns
    /// what this node reports: `err`, or the verdict another participant published on the same
    /// round first. Best effort: a store error leaves the others to their own deadline.
    pub(super) async fn publish_failure(
        &self,
        err: RendezvousError,
        nodes: Vec<String>,
        node_id: &str,
        join_rev: i64,
    ) -> RendezvousError {
        let record = RoundFailure {
            message: err.to_string(),
            nodes,
            at_ms: crate::clock::now_ms(),
            earlier: Default::default(),
        };
        for _ in 0..5 {
            match self.try_publish(&record, node_id, join_rev).await {
                Ok(Published::Raced) => continue,
                Ok(Published::Mine) => {
                    tracing::debug!(run = %self.run_id, "round failed: {}", record.message);
                    return err;
                }
                Ok(Published::Earlier(message)) => return RendezvousError::RoundFailed(message),
                Err(e) => {
                    tracing::warn!(run = %self.run_id, error = %e, "could not publish the round's failure; the other nodes end at their own deadline");
                    return err;
                }
            }
        }
        err
    }

    /// Whether the published verdict already names every node of `nodes` (turned away by an
    /// earlier step of this decider or of the previous one).
    pub(super) async fn turned_away_already(&self, nodes: &[String]) -> Result<bool, StoreError> {
        let Some((f, _)) = self.state.round_failure().await? else {
            return Ok(false);
        };
        Ok(nodes.iter().all(|n| f.message_for(n).is_some()))
    }

    /// Publishes `err` as the verdict for the newcomers `nodes` only (a re-form's environment
    /// check turned them away, or the running group's door did); the decider stays and forms
    /// without them once they left, the running group runs on.
    ///
    /// Two newcomers turned away in quick succession must both hear it: the nodes of the
    /// record it replaces that still wait with the join it judged (written before it) keep
    /// their own message in [`RoundFailure::earlier`]. One that left, or joined again since,
    /// is dropped. Best effort after a few races.
    pub(crate) async fn publish_turn_away(
        &self,
        err: &RendezvousError,
        nodes: Vec<String>,
    ) -> Result<(), StoreError> {
        tracing::warn!(run = %self.run_id, ?nodes, "turning newcomers away: {err}");
        for _ in 0..5 {
            let mut record = RoundFailure {
                message: err.to_string(),
                nodes: nodes.clone(),
                at_ms: crate::clock::now_ms(),
                earlier: Default::default(),
            };
            let replaces = match self.state.round_failure_lenient().await? {
                None => None,
                Some((old, rev)) => {
                    for (node, message) in old.iter().flat_map(|o| o.verdicts()) {
                        if nodes.iter().any(|n| n == node) {
                            continue;
                        }
                        let join = self.state.join_revisions(node).await?;
                        if join.is_some_and(|(mod_revision, _)| mod_revision < rev) {
                            record.earlier.insert(node.to_string(), message.to_string());
                        }
                    }
                    Some(rev)
                }
            };
            if self.state.put_round_failure(&record, replaces).await? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// One attempt of [`Self::publish_failure`].
    async fn try_publish(
        &self,
        record: &RoundFailure,
        node_id: &str,
        join_rev: i64,
    ) -> Result<Published, StoreError> {
        if let Some(message) = self.failure_for(node_id, join_rev).await? {
            return Ok(Published::Earlier(message));
        }
        // Missing, or an earlier round's record (replaced).
        let replaces = self
            .state
            .round_failure_lenient()
            .await?
            .map(|(_, rev)| rev);
        if !self.state.put_round_failure(record, replaces).await? {
            return Ok(Published::Raced);
        }
        // A new round need not wait for this decider's lease to expire.
        self.state.step_down(node_id).await?;
        Ok(Published::Mine)
    }
}

/// What [`Round::try_publish`] achieved.
enum Published {
    /// This node's verdict is the round's.
    Mine,
    /// Another participant's verdict on this round came first: its message.
    Earlier(String),
    /// The record changed under the attempt: try again.
    Raced,
}
