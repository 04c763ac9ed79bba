//! What the agent does when it judged a hang, before the group stops: the stuck ranks' stacks
//! are dumped, then every running local rank's flight recorder is asked for its dump, and the
//! flight recorder's verdict ([`drun_rendezvous::decisions::flight`]) is printed beside the stacks.

use std::collections::BTreeMap;

use super::World;
use crate::agent::{hang, Agent};
use crate::group::WorkerGroup;
use crate::os::flight_recorder;
use crate::rdzv::Link;
use drun_rendezvous::decisions::flight;

impl Agent {
    /// Dumps the stacks of the stuck `ranks`, judges every running rank's flight recorder, and
    /// reports the dumps (cut down) so that `status` judges every node's together.
    /// (`nodes`: the generation's node count; one node's verdict is already whole.)
    pub(super) async fn dump_hung(&self, ranks: &[u32], nodes: usize, w: &World, link: &Link) {
        let running = w
            .group
            .as_ref()
            .map(WorkerGroup::running)
            .unwrap_or_default();
        let stuck: Vec<(u32, i32)> = running
            .iter()
            .copied()
            .filter(|(rank, _)| ranks.contains(rank))
            .collect();
        crate::os::stacks::dump(&stuck, hang::DUMP_SIGNAL).await;
        // The flight recorders are asked once the stacks are dumped, not while: a worker's
        // recorder thread runs Python code to write its dump, and faulthandler (the dump without
        // py-spy) reads every thread's frames from a signal handler, without the GIL: it could
        // not read a thread running beside it and stopped there, before the main thread's stack
        // (seen in CI: `File ???`, and no `stuck_here`).
        let flight = self.api.as_ref().map(|api| {
            let asked: BTreeMap<u32, bool> = running
                .iter()
                .map(|&(rank, _)| (rank, flight_recorder::request(api.dir(), rank)))
                .collect();
            (api.dir().to_path_buf(), asked)
        });
        if let Some((dir, asked)) = flight {
            let dumps = flight_recorder::collect(&dir, &asked, flight_recorder::WAIT).await;
            let gen = w.group.as_ref().map(|g| g.generation);
            for line in flight::judge(&dumps).lines() {
                tracing::warn!(run = %self.cfg.run_id, gen, "{line}");
            }
            let compact: serde_json::Map<String, serde_json::Value> = dumps
                .iter()
                .filter_map(|(rank, o)| Some((rank.to_string(), flight::compact(o)?)))
                .collect();
            if let (Some(gen), false, true) = (gen, compact.is_empty(), nodes > 1) {
                let json = serde_json::json!({"generation": gen, "dumps": compact}).to_string();
                if drun_rendezvous::store::reports::invalid(&json).is_none() {
                    tracing::info!(
                        "this node's flight recorder dumps are reported: `drun-rendezvous status {}` judges them with the other nodes' (a rank on another node may be the one this node's ranks wait for)",
                        self.cfg.run_id
                    );
                    let _ = link.tx.send(drun_rendezvous::session::Request::Report {
                        kind: drun_rendezvous::store::reports::ReportKind::Flight,
                        json,
                    });
                }
            }
        }
    }
}
