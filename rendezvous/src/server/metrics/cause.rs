//! Why a generation re-formed, as a bounded metric label: [`reform_cause`] maps the free-text
//! reason written at `gen/<g>/closed` (and sent to agents in `Event::Reform`) to one of
//! [`CAUSES`].

use crate::decisions::loss;

/// Every value [`reform_cause`] returns (the label values of `drun_reforms_total{cause}`).
pub const CAUSES: [&str; 7] = [
    "node_lost",
    "node_left",
    "worker_failure",
    "scale_up",
    "bad_checkpoint",
    "not_started",
    "other",
];

/// The cause of a re-form whose reason is `reason`:
///
/// * `node_lost` — a member's lease or connection went (`loss::describe`, also when the
///   survivors' workers failed after it: `loss::attributed`);
/// * `node_left` — a member's agent left on purpose (a signal, an error: `loss::LEFT`);
/// * `worker_failure` — a worker failed and the restart budget paid for it;
/// * `scale_up` — a newcomer was admitted below `--nnodes` MAX;
/// * `bad_checkpoint` — the resume point failed verification;
/// * `not_started` — the successor never joined the generation it was planned into;
/// * `other` — anything else.
///
/// ```
/// use drun_rendezvous::server::metrics::reform_cause;
/// assert_eq!(reform_cause("node n3 (127.0.0.3, rank 2) lost: lease expired"), "node_lost");
/// assert_eq!(reform_cause("worker failure: rank 1 exited with 1"), "worker_failure");
/// ```
pub fn reform_cause(reason: &str) -> &'static str {
    if reason.starts_with("worker failure: ") {
        "worker_failure"
    } else if reason.starts_with("node ") && reason.contains(&format!(" lost: {}", loss::LEFT)) {
        "node_left"
    } else if reason.starts_with("node ") && reason.contains(" lost: ") {
        "node_lost"
    } else if reason.contains("is waiting to join (scale-up)") {
        "scale_up"
    } else if reason.starts_with("checkpoint ") && reason.contains("failed verification") {
        "bad_checkpoint"
    } else if reason.contains("did not start within the lease TTL") {
        "not_started"
    } else {
        "other"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decisions::loss;
    use crate::{assign, Candidate};

    #[test]
    fn the_reasons_the_rendezvous_writes_map_to_their_cause() {
        let c = |id: &str| Candidate {
            node_id: id.into(),
            advertise_addr: id.into(),
            slots: 1,
            requested_node_rank: None,
            master_port: 1,
            probe_port: 0,
        };
        let plan = assign("r", 1, &[c("a"), c("b")], 0, 0).unwrap();
        let lost = loss::describe(&plan, "b", loss::CONNECTION_CLOSED);
        assert_eq!(reform_cause(&lost), "node_lost");
        assert_eq!(
            reform_cause(&loss::attributed(&[lost], "rank 0 exited with 1")),
            "node_lost"
        );
        assert_eq!(reform_cause("node x lost: gone"), "node_lost");
        // A node stopped on purpose is not counted as lost.
        assert_eq!(
            reform_cause(&loss::describe(&plan, "b", loss::LEFT)),
            "node_left"
        );
        assert_eq!(
            reform_cause("node c is waiting to join (scale-up)"),
            "scale_up"
        );
        assert_eq!(
            reform_cause("checkpoint step 4 (generation 1) failed verification on node a: size"),
            "bad_checkpoint"
        );
        assert_eq!(
            reform_cause("node b did not start within the lease TTL (10 s)"),
            "not_started"
        );
        assert_eq!(reform_cause("something new"), "other");
        for cause in ["node_lost", "node_left", "scale_up", "other"] {
            assert!(CAUSES.contains(&cause));
        }
    }
}
