//! Joining the rendezvous: the candidate (with a newly reserved `MASTER_PORT` when asked),
//! then the join through its holds — a node sent away by a partition stands by
//! (`standby`), the GPU checks may hold it (`gpu_check`), and the first join waits for the warm
//! interpreters' import (`import_wait`).

use drun_rendezvous::session::Request;
use drun_rendezvous::Join;

use super::World;
use crate::agent::Agent;
use crate::os::ports::ReservedPort;
use crate::rdzv::Link;
use crate::worker_store::WorkerStoreMode;
use crate::{LaunchError, RendezvousMode};

impl Agent {
    /// Joins the rendezvous: with a newly reserved MASTER_PORT (`fresh`), or the last candidate.
    pub(super) fn join(
        &mut self,
        fresh: bool,
        after: u64,
        w: &mut World,
        link: &mut Link,
    ) -> Result<(), LaunchError> {
        if fresh || w.candidate.is_none() {
            // The last generation's store and port go; a verification under way is moot.
            w.worker_store = None;
            w.reserved = None;
            if let Some(h) = w.verifying.take() {
                h.abort();
            }
            let fixed_port = match &self.cfg.rdzv.mode {
                RendezvousMode::Embedded { fixed_port, .. } => *fixed_port,
                RendezvousMode::Static { master_port, .. } => Some(*master_port),
                _ => None,
            };
            if fixed_port.is_none() {
                // The agent's store listens from the reservation on; worker rank 0's TCPStore
                // must be able to bind the port itself, so its reservation stays shareable.
                let reserved = match self.cfg.workers.worker_store {
                    WorkerStoreMode::Agent => ReservedPort::listening(),
                    WorkerStoreMode::Rank0 => ReservedPort::new(),
                };
                w.reserved =
                    Some(reserved.map_err(|e| LaunchError::os("cannot reserve a MASTER_PORT", e))?);
            }
            let port =
                fixed_port.unwrap_or_else(|| w.reserved.as_ref().map_or(0, ReservedPort::port));
            w.candidate = Some(self.candidate(port));
        }
        let mut cand = w.candidate.clone().expect("a candidate was built above");
        // `--ckpt-replicas`: what this node holds in memory now, for a resume from the
        // survivors' copies (each join says it afresh).
        if self.cfg.ckpt.replicas > 0 {
            cand.held = w.stage.as_mut().map(|s| s.held()).unwrap_or_default();
        }
        if w.partition.sent_away && !self.peers_all_answer() {
            self.stand_by(&mut w.partition, cand, after, link);
            return Ok(());
        }
        w.partition.sent_away = false;
        if self.gpu_holds_join(&cand, after, &mut w.gpus, link)? {
            return Ok(());
        }
        self.send_join(cand, after, w, link);
        Ok(())
    }

    /// Sends the join, unless the first one waits for the warm interpreters' import.
    pub(super) fn send_join(&self, cand: Join, after: u64, w: &mut World, link: &Link) {
        if self.hold_first_join(&cand, after, w) {
            return;
        }
        if let Some(m) = &self.metrics {
            m.joining();
        }
        let _ = link.tx.send(Request::Join(cand, after));
    }
}
