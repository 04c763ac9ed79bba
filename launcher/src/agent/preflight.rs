//! The agent's side of `--preflight` (see [`crate::preflight`]): installing the check at start,
//! choosing the generations it runs in, and reporting what the workers measured.

use std::path::{Path, PathBuf};

use drun_rendezvous::Plan;

use crate::ckpt::api::ApiServer;
use crate::metrics::AgentMetrics;
use crate::preflight::{self, Outcome};
use crate::LaunchConfig;

/// Installs the check script next to the worker API socket; `None`, with one line saying why,
/// when the check cannot run with this configuration.
pub(super) fn set_up(cfg: &LaunchConfig, api: Option<&ApiServer>) -> Option<PathBuf> {
    let skip = |why: &str| tracing::warn!("--preflight: skipped: {why}");
    if let Some(why) = preflight::unsupported(
        &cfg.workers.entrypoint,
        cfg.workers.worker_store == crate::worker_store::WorkerStoreMode::Agent,
    ) {
        skip(why);
        return None;
    }
    let Some(dir) = api.and_then(|a| a.path().parent()) else {
        skip("the worker API socket could not be opened (the workers report through it)");
        return None;
    };
    match preflight::install(dir) {
        Ok(path) => Some(path),
        Err(e) => {
            skip(&format!(
                "cannot write the check into {}: {e}",
                dir.display()
            ));
            None
        }
    }
}

/// The installed check script when `plan` is the run's first generation (no restart of either
/// kind yet: every member decides alike from the plan); re-forms skip the check.
pub(super) fn for_plan<'a>(installed: Option<&'a Path>, plan: &Plan) -> Option<&'a Path> {
    let first = plan.restarts_failures == 0 && plan.restarts_membership == 0;
    installed.filter(|_| first)
}

/// A worker's preflight outcome, on node `node_id` (`min_gbps`: `--preflight-min-gbps`): node
/// rank 0 prints the table, the other nodes one line; the metrics take the links this node
/// sends on. Node rank 0 returns the report for `status` (the measurements, the verdicts and
/// the generation).
pub(super) fn reported(
    o: &Outcome,
    plan: &Plan,
    node_id: &str,
    min_gbps: Option<f64>,
    metrics: Option<&AgentMetrics>,
) -> Option<serde_json::Value> {
    let run = &plan.run_id;
    let gen = plan.generation;
    if let Some(e) = &o.error {
        tracing::warn!(run = %run, gen, "preflight: rank {}: {e}; the script runs", o.rank);
        return None;
    }
    if let Some(why) = &o.skipped {
        tracing::warn!(run = %run, gen, "preflight: skipped: {why}; the script runs");
        return None;
    }
    let r = o.report.as_ref()?;
    let slow = preflight::judge(&r.links, min_gbps);
    let node_rank = plan.member(node_id).map_or(0, |m| m.node_rank);
    if let Some(m) = metrics {
        m.preflight(r, &slow, node_rank);
    }
    let any_slow = slow.iter().any(Option::is_some)
        || preflight::within::judge(&r.within)
            .iter()
            .any(Option::is_some);
    let text = if node_rank == 0 {
        preflight::lines(r, &slow).join("\n")
    } else {
        preflight::summary(r, &slow)
    };
    if any_slow {
        tracing::warn!(run = %run, gen, "{text}");
    } else {
        tracing::info!(run = %run, gen, "{text}");
    }
    (node_rank == 0).then(|| serde_json::json!({"generation": gen, "report": r, "slow": slow}))
}
