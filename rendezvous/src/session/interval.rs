//! Node rank 0's `--ckpt-interval` I/O: reading C and M from the store and reporting the
//! interval ([`Actor::evaluate_interval`]), and writing the interval save request
//! ([`Actor::request_interval_save`]). The decisions are [`crate::decisions::ckpt_interval::decide`] and
//! the [`super::save_clock::SaveClock`] in the generation core.

use std::time::Duration;

use super::actor::Actor;
use super::generation::Running;
use super::protocol::SaveRequest;
use crate::clock::now_ms;
use crate::human::duration as human;
use crate::ledger::failure_log;
use crate::RendezvousError;

impl Actor {
    /// Decides the interval from what the store measured; logs it (one line when it changed),
    /// records it (`ckpt/interval`, metrics) and returns it for `run`'s clock (the generation
    /// core sets it). `entered`: generation `g` just started; after a re-form, the work it
    /// lost is logged next to what was expected.
    pub(super) async fn evaluate_interval(
        &self,
        run: &Running,
        entered: bool,
    ) -> Result<Option<Duration>, RendezvousError> {
        let g = run.generation();
        let state = self.round.state();
        let obs = failure_log::observe(state, &self.ledger, g, now_ms()).await?;
        let Some(interval) = self.rules.ckpt_interval.decide(&obs) else {
            return Ok(None);
        };
        let before = state.ckpt_interval().await?;
        let run_id = &self.cfg.run_id;
        if entered && g > 1 {
            if let Some(lost) = state.formation(g).await?.and_then(|f| f.lost_work) {
                let secs = lost.ms as f64 / 1000.0;
                let expected = before
                    .as_ref()
                    .map(|b| format!(" (expected ≈ {:.1} s)", b.expected_loss_s))
                    .unwrap_or_default();
                tracing::info!(run = %run_id, gen = g, "the re-form lost {secs:.1} s of work since the checkpoint it resumed from{expected}");
                crate::server::metrics::global()
                    .reform_lost_work
                    .get_or_create(&crate::server::metrics::RunLabel {
                        run: run_id.clone(),
                    })
                    .set(secs);
            }
        }
        if before.as_ref().is_none_or(|b| b.differs(&interval)) {
            tracing::info!(run = %run_id, gen = g, "{}", interval.line());
            state.record_interval(&interval).await?;
        }
        crate::server::metrics::global().interval(run_id, &interval);
        Ok(Some(interval.duration()))
    }

    /// Asks every rank of generation `g` for a checkpoint: `interval` since the last seal
    /// passed. Written once per checkpoint (`gen/<g>/save-due/<ckpt/latest>`), guarded on
    /// `gen/current` and on `ckpt/latest` (a seal that landed meanwhile makes it moot).
    pub(super) async fn request_interval_save(
        &self,
        g: u64,
        interval: Duration,
    ) -> Result<(), RendezvousError> {
        let state = self.round.state();
        let (latest_before, latest_rev) = match state.ckpt_latest().await? {
            Some((id, rev)) => (id, Some(rev)),
            None => (String::new(), None),
        };
        let reason = format!(
            "the checkpoint interval ({}) since the last seal passed (--ckpt-interval)",
            human(interval)
        );
        let req = SaveRequest {
            node_id: self.cfg.node_id.clone(),
            reason: reason.clone(),
            latest_before,
            at_ms: now_ms(),
            scale_up: false,
            interval: true,
        };
        if state.request_interval_save(g, latest_rev, &req).await? {
            tracing::info!(run = %self.cfg.run_id, gen = g, "{reason}: asking every rank for a checkpoint");
        }
        Ok(())
    }
}
