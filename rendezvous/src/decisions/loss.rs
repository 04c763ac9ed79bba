//! Naming a lost node, and attributing a survivor's worker failure to it.
//!
//! When a node dies, its peers' workers usually fail first (gloo's "Connection reset by peer",
//! NCCL's "remote process exited") and only then is the node known to be gone: its agent's
//! connection to a `drun-rendezvous` server closes at once (its lease is revoked as soon as its
//! host says its probe port is closed, at the latest [`RECONNECT_GRACE`] later), or its lease
//! expires (`lease_ttl`, the detector for a hung host). A
//! survivor's failure that coincides with such a loss — the member is already gone when the
//! failure is decided, or goes within [`ATTRIBUTION_WINDOW`] — is the loss's doing: the group
//! re-forms as a membership restart (the `--max-restarts` budget is not spent) and the reason
//! names the lost node first, the survivors' errors after it. When every other member's agent
//! answers a knock on its probe port, nobody is being lost and the window is not waited out
//! (`session/liveness.rs`). When a member's host says nothing listens on its probe port any
//! more and each agent's session holds its own lease (`--rdzv-backend etcd`, where nothing else
//! would notice before the lease expires), the failing survivor's session drops that member
//! itself: it records why and revokes the member's lease ([`judge_knocks`]).

use std::time::Duration;

use crate::Plan;

/// How long a server-side session keeps the lease of an agent whose connection closed without
/// a Leave, waiting for it to reconnect (to this replica or another) before revoking it.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(1);

/// How long a worker failure waits for a coinciding membership loss before it is counted
/// against the restart budget (unless every other member's agent answers at once). Covers
/// [`RECONNECT_GRACE`] plus a store round trip.
pub const ATTRIBUTION_WINDOW: Duration = Duration::from_secs(2);

/// Why a node whose membership vanished without a recorded reason is gone.
pub const LEASE_EXPIRED: &str =
    "lease expired (no keep-alive within lease_ttl: host down, hung or partitioned)";

/// What the server records for an agent whose connection closed without a Leave.
pub const CONNECTION_CLOSED: &str =
    "its agent's connection to the rendezvous closed and did not come back (agent process gone, or its host hung or unreachable)";

/// What an agent that leaves on purpose records.
pub const LEFT: &str = "its agent left (stopped by a signal or an error)";

/// Why a node whose host refused the knock on its probe port is gone (dropped by a survivor's
/// session, [`judge_knocks`]).
pub const AGENT_GONE: &str =
    "its agent's process is gone (its host says nothing listens on its probe port any more)";

/// What a knock on an agent's probe port found out (`session/liveness.rs` knocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knock {
    /// The agent answered.
    Alive,
    /// Its host says nothing listens on the port: the agent's process is gone.
    Gone,
    /// No answer within the wait, or no address to knock at: no evidence.
    NoAnswer,
}

/// What the knocks on the other members' agents say about a survivor's worker failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KnockVerdict {
    /// Every other member's agent answered: nobody is being lost, the failure is the workers'.
    WorkersOwn,
    /// These members' agents are gone: drop them now (record [`AGENT_GONE`], revoke their
    /// leases), and the failure is their loss's doing.
    Drop(Vec<String>),
    /// No verdict: look for the loss again until the attribution window ends.
    Undecided,
}

/// Judges the `knocks` (member node id, what its probe port said) of a worker failure.
/// `own_leases`: each agent's session holds its own lease in the store, so the lease on a
/// member's key is that member's (agent-side sessions; a server's sessions share carriers,
/// and there the gone agent's own session revokes its lease within [`RECONNECT_GRACE`]).
///
/// ```
/// use drun_rendezvous::decisions::loss::{judge_knocks, Knock, KnockVerdict};
/// let k = |n: &str, k| (n.to_string(), k);
/// assert_eq!(judge_knocks(&[k("b", Knock::Alive)], true), KnockVerdict::WorkersOwn);
/// assert_eq!(
///     judge_knocks(&[k("b", Knock::Gone), k("c", Knock::NoAnswer)], true),
///     KnockVerdict::Drop(vec!["b".into()])
/// );
/// assert_eq!(judge_knocks(&[k("b", Knock::Gone)], false), KnockVerdict::Undecided);
/// ```
pub fn judge_knocks(knocks: &[(String, Knock)], own_leases: bool) -> KnockVerdict {
    if !knocks.is_empty() && knocks.iter().all(|(_, k)| *k == Knock::Alive) {
        return KnockVerdict::WorkersOwn;
    }
    let gone: Vec<String> = knocks
        .iter()
        .filter(|(_, k)| *k == Knock::Gone)
        .map(|(n, _)| n.clone())
        .collect();
    if own_leases && !gone.is_empty() {
        KnockVerdict::Drop(gone)
    } else {
        KnockVerdict::Undecided
    }
}

/// Members of `plan` other than `me` whose membership key is not among `present`, in node-rank
/// order.
///
/// ```
/// use drun_rendezvous::decisions::loss;
/// use drun_rendezvous::{assign, Candidate};
/// let c = |id: &str| Candidate { node_id: id.into(), advertise_addr: id.into(), slots: 2,
///     requested_node_rank: None, master_port: 1, probe_port: 0 };
/// let plan = assign("r", 1, &[c("a"), c("b"), c("c")], 0, 0).unwrap();
/// assert_eq!(loss::missing(&plan, "a", &["a".into(), "c".into()]), ["b"]);
/// ```
pub fn missing(plan: &Plan, me: &str, present: &[String]) -> Vec<String> {
    plan.members
        .iter()
        .filter(|m| m.node_id != me && !present.contains(&m.node_id))
        .map(|m| m.node_id.clone())
        .collect()
}

/// `node n2 (127.0.0.2, ranks 2-3) lost: <why>`.
pub fn describe(plan: &Plan, node: &str, why: &str) -> String {
    match plan.member(node) {
        Some(m) => {
            let ranks = match m.slots {
                0 => "no ranks".to_string(),
                1 => format!("rank {}", m.base_rank),
                n => format!("ranks {}-{}", m.base_rank, m.base_rank + n - 1),
            };
            format!("node {node} ({}, {ranks}) lost: {why}", m.advertise_addr)
        }
        None => format!("node {node} lost: {why}"),
    }
}

/// The reason of a re-form caused by `lost` nodes, with the survivors' failure after it.
pub fn attributed(lost: &[String], survivors_failure: &str) -> String {
    format!(
        "{}; the survivors' workers failed after it ({survivors_failure}), not counted against --max-restarts",
        lost.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{assign, Candidate};

    fn plan() -> Plan {
        let c = |id: &str, slots| Candidate {
            node_id: id.into(),
            advertise_addr: format!("10.0.0.{}", id.len()),
            slots,
            requested_node_rank: None,
            master_port: 1,
            probe_port: 0,
        };
        assign("r", 3, &[c("n1", 2), c("n22", 2), c("n333", 1)], 0, 0).unwrap()
    }

    #[test]
    fn a_lost_node_is_named_with_its_address_and_ranks() {
        let p = plan();
        assert_eq!(
            describe(&p, "n22", CONNECTION_CLOSED),
            format!("node n22 (10.0.0.3, ranks 2-3) lost: {CONNECTION_CLOSED}")
        );
        assert_eq!(
            describe(&p, "n333", LEASE_EXPIRED),
            format!("node n333 (10.0.0.4, rank 4) lost: {LEASE_EXPIRED}")
        );
        assert_eq!(describe(&p, "zz", LEFT), format!("node zz lost: {LEFT}"));
    }

    #[test]
    fn missing_members_exclude_me_and_the_present() {
        let p = plan();
        assert_eq!(missing(&p, "n1", &["n1".into()]), ["n22", "n333"]);
        assert!(missing(&p, "n1", &["n22".into(), "n333".into()]).is_empty());
    }

    #[test]
    fn knocks_drop_only_gone_agents_and_only_with_own_leases() {
        let k = |n: &str, k| (n.to_string(), k);
        // No knock at all is no evidence.
        assert_eq!(judge_knocks(&[], true), KnockVerdict::Undecided);
        let mixed = [
            k("b", Knock::Alive),
            k("c", Knock::Gone),
            k("d", Knock::Gone),
        ];
        assert_eq!(
            judge_knocks(&mixed, true),
            KnockVerdict::Drop(vec!["c".into(), "d".into()])
        );
        // Under a server the gone agent's own session revokes its lease.
        assert_eq!(judge_knocks(&mixed, false), KnockVerdict::Undecided);
        // A host that does not answer may be cut off, not dead: no verdict.
        let silent = [k("b", Knock::Alive), k("c", Knock::NoAnswer)];
        assert_eq!(judge_knocks(&silent, true), KnockVerdict::Undecided);
        assert_eq!(
            judge_knocks(&[k("b", Knock::Alive), k("c", Knock::Alive)], false),
            KnockVerdict::WorkersOwn
        );
    }

    #[test]
    fn the_attributed_reason_puts_the_loss_first() {
        let r = attributed(
            &["node b (h, rank 1) lost: x".into()],
            "rank 0 (local_rank 0) exited with 1 on node a",
        );
        assert!(
            r.starts_with("node b (h, rank 1) lost: x; the survivors'"),
            "{r}"
        );
        assert!(r.contains("not counted against --max-restarts"), "{r}");
    }
}
