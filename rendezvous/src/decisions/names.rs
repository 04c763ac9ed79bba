//! Node lists in the lines people read: every node up to [`NAMED_NODES`], beyond that the first
//! few and a count, so no line grows with the group.
//!
//! A round's reasons travel far: the decider's progress line is published to the store and
//! relayed to every waiting agent, and the "formed because" line goes into the plan every
//! session holds and every agent receives. Naming all 10,000 nodes of a large group made each of
//! those lines 110 KB: a gigabyte relayed per progress line, and one copy per session in the
//! server's memory (measured: 407 KiB per agent at 10,000 with `cargo bench --bench scale`).

/// Groups of at most this many nodes are named in full (as their plans reach every agent whole,
/// [`crate::decisions::plan::FULL_PLAN_NODES`]).
pub const NAMED_NODES: usize = 64;

/// How many nodes a longer list names before its count.
pub const NAMED_FIRST: usize = 8;

/// `a, b, c` for a list of at most [`NAMED_NODES`] nodes, else the first [`NAMED_FIRST`] and
/// how many more: `a, b, …, h and 9992 more`. The line's length is bounded whatever the group.
///
/// ```
/// use drun_rendezvous::decisions::names::node_list;
/// assert_eq!(node_list(&["a", "b"]), "a, b");
/// let many: Vec<String> = (0..1000).map(|i| format!("n{i:03}")).collect();
/// assert_eq!(
///     node_list(&many),
///     "n000, n001, n002, n003, n004, n005, n006, n007 and 992 more"
/// );
/// ```
pub fn node_list<S: AsRef<str>>(nodes: &[S]) -> String {
    let named = if nodes.len() <= NAMED_NODES {
        nodes.len()
    } else {
        NAMED_FIRST
    };
    let mut out = nodes[..named]
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<&str>>()
        .join(", ");
    if named < nodes.len() {
        out.push_str(&format!(" and {} more", nodes.len() - named));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_group_is_named_in_full() {
        let ids: Vec<String> = (0..NAMED_NODES).map(|i| format!("n{i}")).collect();
        assert_eq!(node_list(&ids), ids.join(", "));
        assert_eq!(node_list::<&str>(&[]), "");
    }

    #[test]
    fn a_large_group_is_named_by_its_first_nodes_and_a_count_in_a_bounded_line() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("sim-{i:05}")).collect();
        let line = node_list(&ids);
        assert!(line.starts_with("sim-00000, sim-00001,"), "{line}");
        assert!(line.ends_with("sim-00007 and 9992 more"), "{line}");
        assert!(line.len() < 200, "{} bytes", line.len());
        let one_more: Vec<String> = (0..=NAMED_NODES).map(|i| format!("n{i}")).collect();
        assert!(
            node_list(&one_more).ends_with(&format!("and {} more", NAMED_NODES + 1 - NAMED_FIRST))
        );
    }
}
