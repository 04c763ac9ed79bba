//! [`K8sJob::fill`]: completes the command line with what the operator injected.

use super::K8sJob;
use crate::Args;

impl K8sJob {
    /// Completes `a` with what the user did not set (flags and `PET_*` win); returns one line
    /// saying what was taken, printed at start. Dynamic settings (an embedded rendezvous on the
    /// index-0 pod) apply only to a multi-node launch without `--rdzv-endpoint`,
    /// `--rdzv-backend` or `--master-port`; static ones (node rank, master) only without
    /// `--rdzv-endpoint`.
    pub fn fill(&self, a: &mut Args) -> String {
        let mut taken = Vec::new();
        if a.nnodes == "1:1" {
            if let Some((n, from)) = &self.nnodes {
                a.nnodes = n.clone();
                taken.push(format!("--nnodes {n} ({from})"));
            }
        }
        if a.nproc_per_node.trim() == "1" {
            if let Some((n, from)) = &self.nproc_per_node {
                a.nproc_per_node = n.clone();
                taken.push(format!("--nproc-per-node {n} ({from})"));
            }
        }
        let multi = crate::config::parse_nnodes(&a.nnodes).is_ok_and(|(_, max)| max > 1);
        let dynamic = self.endpoint.is_some();
        if a.rdzv_endpoint.is_none() && !dynamic {
            if a.node_rank.is_none() {
                if let Some((r, from)) = self.node_rank {
                    a.node_rank = Some(r);
                    taken.push(format!("node rank {r} ({from})"));
                }
            }
            if let Some((addr, port, from)) = &self.master {
                if a.master_addr == "127.0.0.1" {
                    a.master_addr = addr.clone();
                    taken.push(format!("master {addr} ({from})"));
                }
                if a.master_port.is_none() {
                    a.master_port = Some(*port);
                    taken.push(format!("master port {port}"));
                }
            }
        }
        let open = a.rdzv_endpoint.is_none() && a.rdzv_backend.is_none() && a.master_port.is_none();
        if let (Some((ep, from)), true, true) = (&self.endpoint, open, multi) {
            a.rdzv_endpoint = Some(ep.clone());
            a.rdzv_backend = Some("embedded".into());
            let who = match self.hosts(ep) {
                Some(true) => "hosted by this pod",
                _ => "hosted by the index-0 pod",
            };
            taken.push(format!(
                "rendezvous embedded (c10d) on {ep}, {who} ({from})"
            ));
        }
        if a.rdzv_id == "none" && (multi || a.rdzv_endpoint.is_some()) {
            if let Some((id, from)) = &self.job {
                a.rdzv_id = id.clone();
                taken.push(format!("run id {id} ({from})"));
            }
        }
        let what = if taken.is_empty() {
            "every setting given on the command line or by PET_*".to_string()
        } else {
            taken.join(", ")
        };
        format!("kubernetes: {}: {what}", self.operator.name())
    }
}
