//! What the agent does when it judged a hang, before the group stops: every running local
//! rank's flight recorder is asked for its dump, the stuck ranks' stacks are dumped, and the
//! flight recorder's verdict ([`crate::agent::flight`]) is printed beside the stacks.

use std::collections::BTreeMap;

use super::World;
use crate::agent::{flight, hang, Agent};
use crate::group::WorkerGroup;
use crate::os::flight_recorder;

impl Agent {
    /// Dumps the stacks of the stuck `ranks` and judges every running rank's flight recorder.
    pub(super) async fn dump_hung(&self, ranks: &[u32], w: &World) {
        let running = w
            .group
            .as_ref()
            .map(WorkerGroup::running)
            .unwrap_or_default();
        // Asked first: the workers write while the stacks are dumped.
        let flight = self.api.as_ref().map(|api| {
            let asked: BTreeMap<u32, bool> = running
                .iter()
                .map(|&(rank, _)| (rank, flight_recorder::request(api.dir(), rank)))
                .collect();
            (api.dir().to_path_buf(), asked)
        });
        let stuck: Vec<(u32, i32)> = running
            .into_iter()
            .filter(|(rank, _)| ranks.contains(rank))
            .collect();
        crate::os::stacks::dump(&stuck, hang::DUMP_SIGNAL).await;
        if let Some((dir, asked)) = flight {
            let dumps = flight_recorder::collect(&dir, &asked, flight_recorder::WAIT).await;
            let gen = w.group.as_ref().map(|g| g.generation);
            for line in flight::judge(&dumps).lines() {
                tracing::warn!(run = %self.cfg.run_id, gen, "{line}");
            }
        }
    }
}
