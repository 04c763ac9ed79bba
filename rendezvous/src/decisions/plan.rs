//! The assignment every agent of a generation receives (stored at `gen/<g>/plan`).
//!
//! Node ranks ([`rank_order`]): in an elastic (dynamic-backend) run a pinned node rank
//! (`--node-rank`, `PET_NODE_RANK`, `SLURM_NODEID`) is an **order**, not an address: the
//! admitted nodes are ranked `0..n-1`, pinned nodes first in pin order, then the unpinned ones in
//! sorted `node_id` order (torchrun's c10d backend sorts by node identity too). So a gap left by a
//! lost node closes up (pins 1 and 2 of a group that lost pin 0 become node ranks 0 and 1) and
//! losing any node still forms; a full set of pins `0..n-1` gets exactly its pins. Two nodes
//! pinning the same rank are ordered by `node_id` (a [`Plan::notes`] line says so on every
//! agent) — never a deadlock. Only the `static` backend needs exact ranks, and it checks them
//! itself without a plan from here.
//!
//! Global ranks are contiguous per node in node-rank order:
//! `RANK = Σ slots of lower node ranks + LOCAL_RANK` (torchrun `_assign_worker_ranks`), so
//! heterogeneous `--nproc-per-node` works. MASTER_ADDR/MASTER_PORT come from node rank 0.
//!
//! A set that cannot be ranked at all ([`formable`]: no worker slots on a node, a world size
//! beyond `u32`) is refused by the decision core before a plan is attempted.

pub use crate::store::records::{Member, Members, Plan, FULL_PLAN_NODES};
use crate::{Candidate, RendezvousError};

/// The node-rank order of an admitted set: indices into it, and the lines to print about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranking {
    /// `order[r]` is the index in the admitted set of the node with node rank `r`.
    pub order: Vec<usize>,
    /// One line per pin tie, naming the nodes and the ranks they got.
    pub notes: Vec<String>,
}

/// Orders an admitted set into node ranks `0..n-1` (pure): pinned nodes first by
/// `(pin, node_id)`, then unpinned nodes by `node_id`. Pins are an order, so gaps close up and
/// ties go by node id (with a note).
///
/// ```
/// use drun_rendezvous::decisions::plan::rank_order;
/// use drun_rendezvous::Candidate;
/// let node = |id: &str, pin| Candidate {
///     node_id: id.into(), advertise_addr: id.into(), slots: 1,
///     requested_node_rank: pin, master_port: 1, probe_port: 0,
/// };
/// // Node rank 0 was lost: pins 1 and 2 close the gap; the unpinned node comes last.
/// let r = rank_order(&[node("u", None), node("c", Some(2)), node("b", Some(1))]);
/// assert_eq!(r.order, [2, 1, 0]);
/// assert!(r.notes.is_empty());
/// ```
pub fn rank_order(admitted: &[Candidate]) -> Ranking {
    let mut order: Vec<usize> = (0..admitted.len()).collect();
    // `None` sorts before `Some`: map pins to (false, pin) and the unpinned to (true, 0).
    order.sort_by(|&a, &b| {
        let key = |c: &Candidate| {
            (
                c.requested_node_rank.is_none(),
                c.requested_node_rank.unwrap_or(0),
            )
        };
        key(&admitted[a])
            .cmp(&key(&admitted[b]))
            .then_with(|| admitted[a].node_id.cmp(&admitted[b].node_id))
    });
    let mut notes = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let Some(pin) = admitted[order[i]].requested_node_rank else {
            break;
        };
        let mut j = i + 1;
        while j < order.len() && admitted[order[j]].requested_node_rank == Some(pin) {
            j += 1;
        }
        if j - i > 1 {
            let who = (i..j)
                .map(|r| format!("{} → node rank {r}", admitted[order[r]].node_id))
                .collect::<Vec<_>>()
                .join(", ");
            notes.push(format!(
                "{} nodes pinned node rank {pin} (--node-rank/SLURM_NODEID); pins are an order and ties go by node id: {who}",
                j - i
            ));
        }
        i = j;
    }
    Ranking { order, notes }
}

/// Whether an admitted set can be ranked into a plan (pure); `Err` says why not, in one line.
///
/// Pins never make a set unformable (see [`rank_order`]); what does is a node without worker
/// slots (LOCAL_WORLD_SIZE 0: a foreign or broken client) or a world size beyond `u32`.
pub fn formable(admitted: &[Candidate]) -> Result<(), Unformable> {
    if admitted.is_empty() {
        return Err(Unformable::NoNodes);
    }
    if let Some(c) = admitted.iter().find(|c| c.slots == 0) {
        return Err(Unformable::NoSlots(c.node_id.clone()));
    }
    admitted
        .iter()
        .try_fold(0u32, |sum, c| sum.checked_add(c.slots))
        .map(|_| ())
        .ok_or(Unformable::WorldTooLarge(admitted.len()))
}

/// Why an admitted set cannot be ranked into a plan ([`formable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unformable {
    /// The set is empty.
    #[error("no nodes")]
    NoNodes,
    /// A node offers no worker slots.
    #[error("node {0} offers no worker slots (--nproc-per-node 0)")]
    NoSlots(String),
    /// The world size of this many nodes exceeds `u32::MAX`.
    #[error("the world size of {0} nodes exceeds {max}", max = u32::MAX)]
    WorldTooLarge(usize),
}

/// Ranks an admitted set into a [`Plan`] for `generation` (node ranks by [`rank_order`]).
///
/// ```
/// use drun_rendezvous::{assign, Candidate};
/// let node = |id: &str, slots| Candidate {
///     node_id: id.into(), advertise_addr: format!("{id}.cluster"), slots,
///     requested_node_rank: None, master_port: 29500, probe_port: 0,
/// };
/// let plan = assign("job", 1, &[node("b", 4), node("a", 2)], 0, 0).unwrap();
/// assert_eq!(plan.members[1].node_id, "b");
/// assert_eq!(plan.members[1].base_rank, 2); // RANK of b's local rank 0
/// assert_eq!(plan.world_size, 6);
/// assert_eq!(plan.master_addr, "a.cluster");
/// ```
///
/// # Errors
/// [`RendezvousError::Assignment`] when the set is not [`formable`] (the decision core refuses
/// such a set before it gets here).
pub fn assign(
    run_id: &str,
    generation: u64,
    admitted: &[Candidate],
    restarts_failures: u32,
    restarts_membership: u32,
) -> Result<Plan, RendezvousError> {
    formable(admitted).map_err(|e| RendezvousError::Assignment(e.to_string()))?;
    let Ranking { order, notes } = rank_order(admitted);
    let mut members = Vec::with_capacity(order.len());
    let mut base = 0u32;
    for (rank, &i) in order.iter().enumerate() {
        let c = &admitted[i];
        members.push(Member {
            node_id: c.node_id.clone(),
            advertise_addr: c.advertise_addr.clone(),
            node_rank: rank as u32,
            slots: c.slots,
            base_rank: base,
            probe_port: c.probe_port,
        });
        base += c.slots;
    }
    let master = &admitted[order[0]];
    Ok(Plan {
        run_id: run_id.to_string(),
        generation,
        world_size: base,
        master_addr: master.advertise_addr.clone(),
        master_port: master.master_port,
        members: members.into(),
        restarts_failures,
        restarts_membership,
        resume: None,
        resume_memory: None,
        notes,
        formed_because: String::new(),
        node_count: 0,
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
            probe_port: 0,
        }
    }

    #[test]
    fn a_large_plan_reaches_each_agent_with_its_own_entry_and_the_node_count() {
        let nodes: Vec<Candidate> = (0..FULL_PLAN_NODES + 1)
            .map(|i| cand(&format!("n{i:03}"), 2, None, 1))
            .collect();
        let plan = assign("r", 1, &nodes, 0, 0).unwrap();
        let sent = plan.for_node("n007");
        assert_eq!(sent.members.len(), 1);
        assert_eq!(sent.member("n007"), plan.member("n007"));
        assert_eq!(sent.node_count(), FULL_PLAN_NODES + 1);
        assert!(!sent.complete() && plan.complete());
        assert_eq!(
            (sent.world_size, &sent.master_addr),
            (plan.world_size, &plan.master_addr)
        );
        // Through the wire and back, the count survives.
        let back: Plan = drun_proto::v1::Plan::from(&sent).into();
        assert_eq!(back, sent);
        // The lookup index changes nothing a plan compares or serializes as.
        let json = serde_json::to_string(&plan).unwrap();
        let fresh: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(fresh, plan);
        assert_eq!(plan.members.position("n064"), Some(64));
        assert_eq!(plan.members.position("nobody"), None);
        // A small plan goes whole.
        let small = assign("r", 1, &nodes[..3], 0, 0).unwrap();
        assert_eq!(small.for_node("n001"), small);
        assert_eq!(small.node_count(), 3);
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

    fn ranks(plan: &Plan) -> Vec<(&str, u32)> {
        plan.members
            .iter()
            .map(|m| (m.node_id.as_str(), m.node_rank))
            .collect()
    }

    #[test]
    fn a_full_set_of_pins_gets_exactly_its_pins() {
        let plan = assign(
            "r",
            1,
            &[cand("a", 1, Some(1), 1), cand("b", 1, Some(0), 2)],
            0,
            0,
        )
        .unwrap();
        assert_eq!(ranks(&plan), [("b", 0), ("a", 1)]);
        assert_eq!(plan.master_port, 2);
        assert!(plan.notes.is_empty());
    }

    #[test]
    fn pins_are_an_order_so_gaps_close_up() {
        // Pinned 0/1/2; node rank 0 lost: 1 and 2 become 0 and 1 (b is the new master).
        let plan = assign(
            "r",
            2,
            &[cand("c", 1, Some(2), 3), cand("b", 1, Some(1), 2)],
            0,
            0,
        )
        .unwrap();
        assert_eq!(ranks(&plan), [("b", 0), ("c", 1)]);
        assert_eq!(plan.master_port, 2);
        // Node rank 1 lost instead.
        let plan = assign(
            "r",
            2,
            &[cand("c", 1, Some(2), 3), cand("a", 1, Some(0), 1)],
            0,
            0,
        )
        .unwrap();
        assert_eq!(ranks(&plan), [("a", 0), ("c", 1)]);
        // A pin far beyond the group size is an order too.
        let plan = assign("r", 1, &[cand("a", 1, Some(5), 1)], 0, 0).unwrap();
        assert_eq!(ranks(&plan), [("a", 0)]);
        assert!(plan.notes.is_empty());
    }

    #[test]
    fn ties_go_by_node_id_with_a_note() {
        let admitted = [
            cand("n3", 1, Some(0), 3),
            cand("n1", 1, Some(1), 1),
            cand("n2", 1, Some(0), 2),
        ];
        let plan = assign("r", 1, &admitted, 0, 0).unwrap();
        assert_eq!(ranks(&plan), [("n2", 0), ("n3", 1), ("n1", 2)]);
        assert_eq!(plan.master_port, 2);
        assert_eq!(
            plan.notes,
            ["2 nodes pinned node rank 0 (--node-rank/SLURM_NODEID); pins are an order and ties go by node id: n2 → node rank 0, n3 → node rank 1"]
        );
        // The same set in any arrival order gives the same plan.
        let mut reversed = admitted.to_vec();
        reversed.reverse();
        assert_eq!(assign("r", 1, &reversed, 0, 0).unwrap(), plan);
    }

    #[test]
    fn pinned_first_then_unpinned_by_node_id() {
        let plan = assign(
            "r",
            1,
            &[
                cand("a", 2, None, 1),
                cand("z", 1, Some(3), 2),
                cand("c", 4, None, 3),
                cand("y", 1, Some(1), 4),
            ],
            0,
            0,
        )
        .unwrap();
        assert_eq!(ranks(&plan), [("y", 0), ("z", 1), ("a", 2), ("c", 3)]);
        let bases: Vec<u32> = plan.members.iter().map(|m| m.base_rank).collect();
        assert_eq!(bases, [0, 1, 2, 4]);
        assert_eq!(plan.world_size, 8);
    }

    #[test]
    fn unformable_sets_are_refused_with_the_reason() {
        assert_eq!(
            formable(&[cand("a", 1, None, 1), cand("b", 0, None, 2)]),
            Err(Unformable::NoSlots("b".into()))
        );
        assert!(
            formable(&[cand("a", u32::MAX, None, 1), cand("b", 1, None, 2)])
                .unwrap_err()
                .to_string()
                .contains("exceeds")
        );
        assert!(formable(&[]).is_err());
        let err = assign("r", 1, &[cand("a", 0, Some(0), 1)], 0, 0).unwrap_err();
        assert!(err.to_string().contains("no worker slots"), "{err}");
    }
}
