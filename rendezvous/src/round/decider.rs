//! The decider's step, a driver: read the round ([`snapshot::read`]), judge it
//! ([`judge::judge`], pure), write the formation in one transaction through the door, and emit
//! what the judgement says (logs, the re-form metric).

use tokio::time::Instant;

use super::judge::{self, Judgement, RoundTimes};
use super::{snapshot, Round, Step};
use crate::clock::now_ms;
use crate::store::run_state::round::FormGeneration;
use crate::RendezvousError;

impl Round {
    /// The decider's step at generation `g` (`gen/current`'s revision `rev`): read the round,
    /// judge it, and form the next generation if due. `times`: the decider's memory of the
    /// round, updated.
    pub(super) async fn decide_once(
        &self,
        g: u64,
        rev: i64,
        times: &mut RoundTimes,
    ) -> Result<Step, RendezvousError> {
        let snap = snapshot::read(&self.state, g, rev).await?;
        let now = Instant::now();
        let judged = judge::judge(&snap, times, now, &self.cfg);
        *times = judged.times;
        let reason = judged.reason;
        let order = match judged.judgement {
            Judgement::Finished => return Err(RendezvousError::RunFinished(self.run_id.clone())),
            Judgement::Wait { until } => {
                return Ok(Step::Wait {
                    reason,
                    until,
                    waiting: snap.waiting.len(),
                })
            }
            Judgement::Fail { cause, nodes } => {
                return Ok(Step::Failed {
                    reason,
                    cause,
                    nodes,
                })
            }
            Judgement::TurnAway { who } => return Ok(Step::TurnAway { reason, nodes: who }),
            Judgement::Form(order) => order,
        };
        let inputs = snapshot::read_formation(&self.state, &self.ledger, g).await?;
        let formed = judge::formation(
            &self.run_id,
            &snap,
            &order,
            &reason,
            &inputs,
            times.opened_at,
            now,
            now_ms(),
        )?;
        let written = self
            .state
            .form(FormGeneration {
                g,
                rev,
                plan: &formed.plan,
                formation: &formed.formation,
                import: formed.import.as_ref(),
                latest_revision: formed.latest_revision,
                unclosed: formed.unclosed.as_ref().map(|(r, rev)| (r, *rev)),
            })
            .await?;
        if !written {
            return Ok(Step::Retry);
        }
        if formed.unclosed.is_some() {
            tracing::info!(run = %self.run_id, gen = g, "every member of generation {g} lost its lease (a store outage, or every node lost): re-formed as generation {}", g + 1);
            crate::server::metrics::global().reformed(&self.run_id, "every member's lease expired");
        }
        tracing::debug!(run = %self.run_id, gen = g + 1, "group formed: {reason}");
        Ok(Step::Formed(Box::new(formed.plan)))
    }
}
