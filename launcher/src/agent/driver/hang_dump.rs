//! What the agent does when it judged a hang, before the group stops: the stuck ranks' stacks
//! are dumped, then every running local rank's flight recorder is asked for its dump, and the
//! flight recorder's verdict ([`drun_rendezvous::decisions::flight`]) is printed beside the stacks.
//! In a generation of several nodes the dumps are also taken ahead, at half the hang timeout
//! (a snapshot): another node's verdict may stop the collective this node's ranks wait in
//! before this node judges, and the snapshot is what those ranks can no longer tell.

use std::collections::BTreeMap;

use super::World;
use crate::agent::hang::{self, FlightSnapshot};
use crate::agent::Agent;
use crate::group::WorkerGroup;
use crate::os::flight_recorder;
use crate::rdzv::Link;
use drun_rendezvous::decisions::flight::{self, Outcome};

impl Agent {
    /// Dumps the stacks of the stuck `ranks`, judges every running rank's flight recorder, and
    /// reports the dumps (cut down) so that `status` judges every node's together.
    /// (`nodes`: the generation's node count; one node's verdict is already whole.) A rank that
    /// no longer answers (another node's verdict broke its collective and it exited) is judged
    /// by its dump in the snapshot, when one was taken.
    pub(super) async fn dump_hung(&self, ranks: &[u32], nodes: usize, w: &mut World, link: &Link) {
        let running = running(w);
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
        let Some(mut dumps) = self.ask_flight(w).await else {
            return;
        };
        let gen = w.group.as_ref().map(|g| g.generation);
        if let Some(s) = w
            .flight_snapshot
            .take()
            .filter(|s| Some(s.generation) == gen)
        {
            for (rank, earlier) in s.dumps {
                let fresh = dumps.get(&rank);
                if matches!(earlier, Outcome::Written(_))
                    && !matches!(fresh, Some(Outcome::Written(_)))
                {
                    tracing::info!(
                        rank,
                        "rank {rank} no longer answers its flight recorder's request: its dump taken at half the hang timeout stands for it"
                    );
                    dumps.insert(rank, earlier);
                }
            }
        }
        for line in flight::judge(&dumps).lines() {
            tracing::warn!(run = %self.cfg.run_id, gen, "{line}");
        }
        if let Some(gen) = gen {
            self.report_flight(gen, &dumps, nodes, link);
        }
    }

    /// A local rank has been silent for half the hang timeout in a generation of several nodes:
    /// every running rank's flight recorder dump is taken and kept ([`FlightSnapshot`]).
    pub(super) async fn snapshot_flight(&self, w: &mut World) {
        let Some(generation) = w.group.as_ref().map(|g| g.generation) else {
            return;
        };
        if let Some(dumps) = self.ask_flight(w).await {
            w.flight_snapshot = Some(FlightSnapshot { generation, dumps });
        }
    }

    /// The group stops in the silence the snapshot was taken in, before this node judged it a
    /// hang: the snapshot is reported, so that `status` can judge it with the node whose
    /// verdict stopped the job.
    pub(super) fn report_snapshot(&self, nodes: usize, w: &mut World, link: &Link) {
        let gen = w.group.as_ref().map(|g| g.generation);
        if let Some(s) = w
            .flight_snapshot
            .take()
            .filter(|s| Some(s.generation) == gen)
        {
            tracing::info!(
                "the workers stop while this node's ranks have been silent for over half the hang timeout: their flight recorder dumps, taken then, are reported"
            );
            self.report_flight(s.generation, &s.dumps, nodes, link);
        }
    }

    /// Every running local rank's flight recorder dump (`None`: no worker API, so no helper
    /// listens).
    async fn ask_flight(&self, w: &World) -> Option<BTreeMap<u32, Outcome>> {
        let api = self.api.as_ref()?;
        let asked: BTreeMap<u32, bool> = running(w)
            .iter()
            .map(|&(rank, _)| (rank, flight_recorder::request(api.dir(), rank)))
            .collect();
        Some(flight_recorder::collect(api.dir(), &asked, flight_recorder::WAIT).await)
    }

    /// Reports `dumps` (cut down) to the job, in a generation of several `nodes`.
    fn report_flight(&self, gen: u64, dumps: &BTreeMap<u32, Outcome>, nodes: usize, link: &Link) {
        let compact: serde_json::Map<String, serde_json::Value> = dumps
            .iter()
            .filter_map(|(rank, o)| Some((rank.to_string(), flight::compact(o)?)))
            .collect();
        if compact.is_empty() || nodes <= 1 {
            return;
        }
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

/// The running local ranks and their pids.
fn running(w: &World) -> Vec<(u32, i32)> {
    w.group
        .as_ref()
        .map(WorkerGroup::running)
        .unwrap_or_default()
}
