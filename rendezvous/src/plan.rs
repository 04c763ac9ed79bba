//! The assignment every agent of a generation receives (stored at `gen/<g>/plan`).
//!
//! Node ranks: nodes that pinned a rank (`--node-rank`, later `SLURM_NODEID`) get it; the rest
//! fill the free ranks in sorted `node_id` order (torchrun's c10d backend sorts by node identity
//! too). Global ranks are contiguous per node in node-rank order:
//! `RANK = Σ slots of lower node ranks + LOCAL_RANK` (torchrun `_assign_worker_ranks`), so
//! heterogeneous `--nproc-per-node` works. MASTER_ADDR/MASTER_PORT come from node rank 0.

use serde::{Deserialize, Serialize};

use crate::ledger::Manifest;
use crate::{Candidate, RendezvousError};

/// One node of a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Node identity.
    pub node_id: String,
    /// Address the node advertised.
    pub advertise_addr: String,
    /// GROUP_RANK, dense in `0..members.len()`.
    pub node_rank: u32,
    /// LOCAL_WORLD_SIZE of this node.
    pub slots: u32,
    /// Global rank of this node's local rank 0.
    pub base_rank: u32,
}

/// The assignment of generation `generation`. Identical for every agent of the generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Run id (`--rdzv-id`).
    pub run_id: String,
    /// Generation number, ≥ 1; the fencing token.
    pub generation: u64,
    /// Members in node-rank order.
    pub members: Vec<Member>,
    /// Sum of all slots (WORLD_SIZE).
    pub world_size: u32,
    /// Node rank 0's advertised address.
    pub master_addr: String,
    /// Port node rank 0 holds reserved for its rank-0 worker's store.
    pub master_port: u16,
    /// Group restarts caused by worker failures so far (job-wide).
    pub restarts_failures: u32,
    /// Group restarts caused by membership changes so far.
    pub restarts_membership: u32,
    /// The checkpoint every rank resumes from: the newest sealed manifest not marked bad at
    /// formation (`None`: start fresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Manifest>,
}

impl Plan {
    /// This node's entry, if it is a member.
    pub fn member(&self, node_id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.node_id == node_id)
    }
}

/// Ranks an admitted set into a [`Plan`] for `generation`.
///
/// ```
/// use drun_rendezvous::{assign, Candidate};
/// let node = |id: &str, slots| Candidate {
///     node_id: id.into(), advertise_addr: format!("{id}.cluster"), slots,
///     requested_node_rank: None, master_port: 29500, resume_hint: None,
/// };
/// let plan = assign("job", 1, &[node("b", 4), node("a", 2)], 0, 0).unwrap();
/// assert_eq!(plan.members[1].node_id, "b");
/// assert_eq!(plan.members[1].base_rank, 2); // RANK of b's local rank 0
/// assert_eq!(plan.world_size, 6);
/// assert_eq!(plan.master_addr, "a.cluster");
/// ```
///
/// # Errors
/// [`RendezvousError::Assignment`] when two nodes pin the same rank or a pinned rank is not below
/// the number of admitted nodes.
pub fn assign(
    run_id: &str,
    generation: u64,
    admitted: &[Candidate],
    restarts_failures: u32,
    restarts_membership: u32,
) -> Result<Plan, RendezvousError> {
    let n = admitted.len();
    let mut slots: Vec<Option<&Candidate>> = vec![None; n];
    for c in admitted {
        if let Some(r) = c.requested_node_rank {
            let r = r as usize;
            if r >= n {
                return Err(RendezvousError::Assignment(format!(
                    "node {} asked for node rank {r} but only {n} nodes are in the group",
                    c.node_id
                )));
            }
            if let Some(other) = slots[r] {
                return Err(RendezvousError::Assignment(format!(
                    "nodes {} and {} both asked for node rank {r}",
                    other.node_id, c.node_id
                )));
            }
            slots[r] = Some(c);
        }
    }
    let mut rest: Vec<&Candidate> = admitted
        .iter()
        .filter(|c| c.requested_node_rank.is_none())
        .collect();
    rest.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let mut rest = rest.into_iter();
    let mut members = Vec::with_capacity(n);
    let mut base = 0u32;
    for (rank, slot) in slots.into_iter().enumerate() {
        let c = slot
            .or_else(|| rest.next())
            .expect("pinned + unpinned nodes fill every rank exactly once");
        members.push(Member {
            node_id: c.node_id.clone(),
            advertise_addr: c.advertise_addr.clone(),
            node_rank: rank as u32,
            slots: c.slots,
            base_rank: base,
        });
        base += c.slots;
    }
    let master = admitted
        .iter()
        .find(|c| c.node_id == members[0].node_id)
        .expect("rank 0 comes from the admitted set");
    Ok(Plan {
        run_id: run_id.to_string(),
        generation,
        world_size: base,
        master_addr: master.advertise_addr.clone(),
        master_port: master.master_port,
        members,
        restarts_failures,
        restarts_membership,
        resume: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, slots: u32, rank: Option<u32>, port: u16) -> Candidate {
        Candidate {
            node_id: id.into(),
            advertise_addr: format!("10.0.0.{}", slots),
            slots,
            requested_node_rank: rank,
            master_port: port,
            resume_hint: None,
        }
    }

    #[test]
    fn sorted_order_and_contiguous_heterogeneous_ranks() {
        let plan = assign(
            "r",
            3,
            &[
                cand("node-b", 4, None, 2),
                cand("node-a", 2, None, 1),
                cand("node-c", 1, None, 3),
            ],
            1,
            0,
        )
        .unwrap();
        let got: Vec<_> = plan
            .members
            .iter()
            .map(|m| (m.node_id.as_str(), m.node_rank, m.base_rank))
            .collect();
        assert_eq!(got, [("node-a", 0, 0), ("node-b", 1, 2), ("node-c", 2, 6)]);
        assert_eq!(plan.world_size, 7);
        assert_eq!(
            (plan.master_addr.as_str(), plan.master_port),
            ("10.0.0.2", 1)
        );
        assert_eq!(plan.generation, 3);
    }

    #[test]
    fn pinned_ranks_win_and_conflicts_are_errors() {
        let plan = assign(
            "r",
            1,
            &[cand("a", 1, Some(1), 1), cand("b", 1, Some(0), 2)],
            0,
            0,
        )
        .unwrap();
        assert_eq!(plan.members[0].node_id, "b");
        assert_eq!(plan.master_port, 2);
        let err = assign(
            "r",
            1,
            &[cand("a", 1, Some(0), 1), cand("b", 1, Some(0), 2)],
            0,
            0,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("both asked for node rank 0"),
            "{err}"
        );
        let err = assign("r", 1, &[cand("a", 1, Some(5), 1)], 0, 0).unwrap_err();
        assert!(err.to_string().contains("only 1 nodes"), "{err}");
    }
}
