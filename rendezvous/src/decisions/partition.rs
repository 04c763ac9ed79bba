//! Which nodes of a generation leave when some of them cannot reach each other: a pure function
//! of the members' peer reports (`reports/peers/<node>`, see `crate::store::reports`), with its reason.
//!
//! A pair is broken when both sides say the other does not answer its probes (a probe is a
//! round trip, so a partition silences both sides; one side alone is a stalled or dead agent,
//! which the leases handle). The generation keeps the largest set of nodes that
//! all reach each other; among sets of that size, the one whose node ranks come first (towards
//! node rank 0, which hosts the workers' store); every other node leaves, and stands by until it
//! reaches the others again. Exact up to [`EXACT_UP_TO`] nodes; beyond, the node with the most
//! broken pairs leaves first (ties: the highest rank) until no pair is broken. When the set kept
//! would be smaller than the run's minimum, the run ends, naming the broken pairs.

use std::collections::BTreeSet;

/// Up to this many nodes the largest set is found exactly (2^n subsets).
pub const EXACT_UP_TO: u32 = 16;

/// The decision, with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every pair reaches each other.
    Whole,
    /// `leave` go; `keep` (≥ the minimum) re-form.
    Split {
        /// Node ranks kept.
        keep: Vec<u32>,
        /// Node ranks that leave.
        leave: Vec<u32>,
        /// One line for the logs, `status` and the re-form.
        reason: String,
    },
    /// No set of the minimum size reaches itself: the run ends.
    End {
        /// One line naming the broken pairs.
        reason: String,
    },
}

/// The broken pairs `(low, high)` from each node's `(node rank, silent node ranks)` report: a
/// pair is broken when *both* sides say the other does not answer. A probe is a round trip, so
/// a real partition (either way) silences both sides; one side alone is an agent that was
/// stalled (a starved process answers nothing for a while) or is gone altogether, which the
/// leases handle.
pub fn broken_pairs(reports: impl IntoIterator<Item = (u32, Vec<u32>)>) -> BTreeSet<(u32, u32)> {
    let said: BTreeSet<(u32, u32)> = reports
        .into_iter()
        .flat_map(|(from, silent)| {
            silent
                .into_iter()
                .filter(move |to| *to != from)
                .map(move |to| (from, to))
        })
        .collect();
    said.iter()
        .filter(|(a, b)| a < b && said.contains(&(*b, *a)))
        .copied()
        .collect()
}

fn pairs_line(broken: &BTreeSet<(u32, u32)>) -> String {
    let v: Vec<String> = broken
        .iter()
        .map(|(a, b)| format!("node {a} ↔ node {b}"))
        .collect();
    v.join(", ")
}

fn ranks_line(r: &[u32]) -> String {
    let v: Vec<String> = r.iter().map(u32::to_string).collect();
    v.join(", ")
}

/// The largest set of `0..nodes` without a broken pair inside, ties towards the lower ranks.
fn largest_reaching_set(nodes: u32, broken: &BTreeSet<(u32, u32)>) -> Vec<u32> {
    if nodes <= EXACT_UP_TO {
        let ok = |mask: u32| {
            broken.iter().all(|(a, b)| {
                a >= &nodes || b >= &nodes || mask & (1 << a) == 0 || mask & (1 << b) == 0
            })
        };
        let ranks = |mask: u32| {
            (0..nodes)
                .filter(|r| mask & (1 << r) != 0)
                .collect::<Vec<_>>()
        };
        let mut best: Option<Vec<u32>> = None;
        for mask in 0..(1u32 << nodes) {
            if !ok(mask) {
                continue;
            }
            let set = ranks(mask);
            let better = match &best {
                None => true,
                Some(b) => set.len() > b.len() || (set.len() == b.len() && set < *b),
            };
            if better {
                best = Some(set);
            }
        }
        return best.unwrap_or_default();
    }
    let mut keep: BTreeSet<u32> = (0..nodes).collect();
    loop {
        let degree = |r: u32| {
            broken
                .iter()
                .filter(|(a, b)| (*a == r && keep.contains(b)) || (*b == r && keep.contains(a)))
                .count()
        };
        let worst = keep
            .iter()
            .map(|r| (degree(*r), *r))
            .filter(|(d, _)| *d > 0)
            .max();
        match worst {
            Some((_, r)) => {
                keep.remove(&r);
            }
            None => return keep.into_iter().collect(),
        }
    }
}

/// The decision for a generation of `nodes` nodes whose run needs `min_nodes`.
pub fn decide(nodes: u32, broken: &BTreeSet<(u32, u32)>, min_nodes: u32) -> Decision {
    let broken: BTreeSet<(u32, u32)> = broken
        .iter()
        .copied()
        .filter(|(a, b)| a < b && *b < nodes)
        .collect();
    if broken.is_empty() {
        return Decision::Whole;
    }
    let keep = largest_reaching_set(nodes, &broken);
    let leave: Vec<u32> = (0..nodes).filter(|r| !keep.contains(r)).collect();
    if (keep.len() as u32) < min_nodes {
        return Decision::End {
            reason: format!(
                "the nodes cannot all reach each other ({}): no {min_nodes} of them (the run's minimum) all reach each other, so the run cannot go on; fix the network between them and start it again",
                pairs_line(&broken)
            ),
        };
    }
    let reason = format!(
        "{} cannot reach each other: node {} leave{} until {} reach{} the others again, node ranks {} go on (the largest set that all reach each other, ties towards node rank 0)",
        pairs_line(&broken),
        ranks_line(&leave),
        if leave.len() == 1 { "s" } else { "" },
        if leave.len() == 1 { "it" } else { "they" },
        if leave.len() == 1 { "es" } else { "" },
        ranks_line(&keep),
    );
    Decision::Split {
        keep,
        leave,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(u32, u32)]) -> BTreeSet<(u32, u32)> {
        p.iter().copied().collect()
    }

    #[test]
    fn a_pair_is_broken_when_both_sides_say_so() {
        let b = broken_pairs([(1, vec![2]), (2, vec![1]), (0, vec![])]);
        assert_eq!(b, pairs(&[(1, 2)]));
        assert_eq!(
            broken_pairs([(1, vec![2]), (2, vec![])]),
            pairs(&[]),
            "one side alone: a stalled or dead agent, not a partition"
        );
        assert_eq!(
            broken_pairs([(3, vec![3])]),
            pairs(&[]),
            "itself is no pair"
        );
    }

    #[test]
    fn a_whole_generation_stays_whole() {
        assert_eq!(decide(4, &pairs(&[]), 2), Decision::Whole);
    }

    #[test]
    fn one_broken_pair_costs_its_higher_node_and_the_reason_says_so() {
        let d = decide(3, &pairs(&[(1, 2)]), 2);
        let Decision::Split {
            keep,
            leave,
            reason,
        } = d
        else {
            panic!("{d:?}")
        };
        assert_eq!((keep, leave), (vec![0, 1], vec![2]));
        assert_eq!(
            reason,
            "node 1 ↔ node 2 cannot reach each other: node 2 leaves until it reaches the others again, node ranks 0, 1 go on (the largest set that all reach each other, ties towards node rank 0)"
        );
    }

    #[test]
    fn a_node_cut_from_several_leaves_alone_and_node_rank_0_can_leave_too() {
        // Node 0 reaches nobody but node 3: {1, 2, 3} all reach each other.
        let d = decide(4, &pairs(&[(0, 1), (0, 2)]), 2);
        assert!(
            matches!(&d, Decision::Split { keep, leave, .. } if keep == &[1, 2, 3] && leave == &[0]),
            "{d:?}"
        );
    }

    #[test]
    fn two_halves_keep_the_half_with_node_rank_0() {
        // {0,1} and {2,3} reach within but not across.
        let d = decide(4, &pairs(&[(0, 2), (0, 3), (1, 2), (1, 3)]), 2);
        assert!(
            matches!(&d, Decision::Split { keep, leave, .. } if keep == &[0, 1] && leave == &[2, 3]),
            "{d:?}"
        );
    }

    #[test]
    fn below_the_minimum_the_run_ends_naming_the_broken_pairs() {
        let d = decide(3, &pairs(&[(1, 2)]), 3);
        let Decision::End { reason } = d else {
            panic!("{d:?}")
        };
        assert!(
            reason.starts_with(
                "the nodes cannot all reach each other (node 1 ↔ node 2): no 3 of them"
            ),
            "{reason}"
        );
    }

    #[test]
    fn pairs_outside_the_generation_are_ignored() {
        assert_eq!(decide(3, &pairs(&[(1, 7)]), 2), Decision::Whole);
    }

    #[test]
    fn beyond_the_exact_size_the_most_cut_off_node_leaves_first() {
        // 40 nodes; node 39 reaches nobody below 5, node 20 cannot reach node 21.
        let mut p: Vec<(u32, u32)> = (0..5).map(|r| (r, 39)).collect();
        p.push((20, 21));
        let d = decide(40, &pairs(&p), 2);
        let Decision::Split { keep, leave, .. } = d else {
            panic!("{d:?}")
        };
        assert_eq!(leave, vec![21, 39]);
        assert_eq!(keep.len(), 38);
    }
}
