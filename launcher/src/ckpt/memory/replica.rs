//! Replicas on peers (`--ckpt-replicas 1`, issue 35 item 3): the protocol's decisions, pure —
//! which peer holds a node's replica ([`neighbour`]), what each survivor fetches from whom for
//! a resume from memory ([`to_fetch`]), and which replicas make room for an incoming one
//! ([`release`]) — each a function of its inputs with a reason, tested on synthetic holdings.
//!
//! Wired: the flag (`--ckpt-replicas`), the transport between agents ([`super::wire`],
//! `agent/driver/replicas.rs`: each staged step goes to [`neighbour`], is verified by digest
//! on receipt and held within the receiver's budget by [`release`] and
//! [`oldest_for`]), `status`'s `replicated`, and the resume after a node loss: every
//! agent reports what it holds in its join, the formation decides
//! (`drun_rendezvous::ledger::memory`, where the rule of which step and which source lives),
//! and each agent fetches what [`to_fetch`] names before its workers start.
//!
//! # The rules
//! * Each node sends its staged files of a step to its ring neighbour: the next node by node
//!   rank in the generation that saved it, the last node's to the first. With one replica, the
//!   loss of any one node leaves every file of a step on some survivor; two adjacent nodes lost
//!   at once (in a ring of 3, any two) take one node's only copies with them.
//! * A rank's files are fetched from the member the plan names for it; a node fetches only the
//!   ranks it does not hold already.
//! * A replica that does not fit the receiver's budget releases replicas of older steps first;
//!   the receiver's own staged copies not yet persisted are never released for a replica (the
//!   replica is refused instead, and the sender's node keeps its own copy).

use std::collections::{BTreeMap, BTreeSet};

use super::decide::Key;

/// The node that holds `me`'s replicas: the next of `nodes` (the generation's nodes in node-rank
/// order), the last one's the first; `None` when `me` is not among them or is alone.
pub fn neighbour<'a>(nodes: &'a [String], me: &str) -> Option<&'a str> {
    let i = nodes.iter().position(|n| n == me)?;
    let next = &nodes[(i + 1) % nodes.len()];
    (next != me).then_some(next.as_str())
}

/// The node whose replicas `me` holds: the one before it in the ring (whose [`neighbour`] is
/// `me`); the only node a replica is accepted from.
pub fn predecessor<'a>(nodes: &'a [String], me: &str) -> Option<&'a str> {
    let i = nodes.iter().position(|n| n == me)?;
    let prev = &nodes[(i + nodes.len() - 1) % nodes.len()];
    (prev != me).then_some(prev.as_str())
}

/// The replicas (oldest first) this node drops to free at least `bytes` for its own save, as
/// the staging table's admission asked ([`super::decide::Admit::Stage`]): a node's own copy
/// always wins over a replica (the replica's sender still holds its own). Every replica when
/// they hold less.
pub fn oldest_for(replicas: &[(Key, u64)], bytes: u64) -> Vec<Key> {
    let mut order: Vec<&(Key, u64)> = replicas.iter().collect();
    order.sort_by_key(|(k, _)| *k);
    let mut freed = 0;
    let mut out = Vec::new();
    for (k, b) in order {
        if freed >= bytes {
            break;
        }
        freed += b;
        out.push(*k);
    }
    out
}

/// The ranks `me` must fetch, and from whom, to hold every file of the step `sources` names:
/// those served by another node that `me` does not hold already.
pub fn to_fetch(
    me: &str,
    sources: &BTreeMap<u32, String>,
    mine: Option<&BTreeSet<u32>>,
) -> Vec<(u32, String)> {
    sources
        .iter()
        .filter(|(r, n)| n.as_str() != me && !mine.is_some_and(|m| m.contains(r)))
        .map(|(r, n)| (*r, n.clone()))
        .collect()
}

/// One copy a receiver holds in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The step.
    pub key: Key,
    /// Bytes.
    pub bytes: u64,
    /// A replica of another node's files (else this node's own staged copy).
    pub replica: bool,
    /// On disk already (an own copy that may go; a replica's sender persists its own).
    pub persisted: bool,
}

/// Whether an incoming replica fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// It fits after releasing these copies (oldest first; none when it fits as is).
    Take {
        /// Copies to release first.
        release: Vec<Key>,
    },
    /// It does not fit even after releasing every replica and persisted own copy: refuse it.
    Refuse {
        /// Why, for the log.
        reason: String,
    },
}

/// Whether a replica of `incoming` bytes fits a receiver's `budget` holding `held` and
/// `outside` bytes besides (the ranks' spares, or the room kept for them, and fetched files):
/// replicas and persisted own copies of steps older than `key` are released oldest first until
/// it fits; own copies not yet persisted never are.
pub fn release(held: &[Held], outside: u64, budget: u64, key: Key, incoming: u64) -> Fit {
    let used: u64 = outside + held.iter().map(|h| h.bytes).sum::<u64>();
    let mut free = budget.saturating_sub(used);
    let mut order: Vec<&Held> = held
        .iter()
        .filter(|h| (h.replica || h.persisted) && h.key < key)
        .collect();
    order.sort_by_key(|h| (h.key, !h.replica));
    let mut out = Vec::new();
    for h in order {
        if free >= incoming {
            break;
        }
        free += h.bytes;
        out.push(h.key);
    }
    if free >= incoming {
        Fit::Take { release: out }
    } else {
        Fit::Refuse {
            reason: format!(
                "a replica of step {} ({}) does not fit the budget of {} beside this node's own copies not yet persisted",
                key.0,
                super::human_bytes(incoming),
                super::human_bytes(budget)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn the_neighbour_is_the_next_node_of_the_ring() {
        let n = nodes(3);
        assert_eq!(neighbour(&n, "n0"), Some("n1"));
        assert_eq!(neighbour(&n, "n2"), Some("n0"));
        assert_eq!(predecessor(&n, "n0"), Some("n2"), "n0 holds n2's replicas");
        assert_eq!(predecessor(&n, "n1"), Some("n0"));
        assert_eq!(predecessor(&nodes(1), "n0"), None);
        assert_eq!(predecessor(&n, "x"), None);
        for me in &n {
            let next = neighbour(&n, me).unwrap();
            assert_eq!(predecessor(&n, next), Some(me.as_str()), "the two agree");
        }
        assert_eq!(neighbour(&n, "x"), None);
        assert_eq!(neighbour(&nodes(1), "n0"), None, "alone: no replica");
    }

    #[test]
    fn a_survivor_fetches_only_the_ranks_it_does_not_hold_from_their_source() {
        let sources: BTreeMap<u32, String> = [(0, "n0"), (1, "n0"), (2, "n2"), (3, "n2")]
            .into_iter()
            .chain([(4, "n2"), (5, "n2")])
            .map(|(r, n)| (r, n.to_string()))
            .collect();
        // n0 holds its own ranks and n2's replica (4, 5): it fetches n1's ranks from n2.
        let n0: BTreeSet<u32> = [0, 1, 4, 5].into();
        assert_eq!(
            to_fetch("n0", &sources, Some(&n0)),
            vec![(2, "n2".into()), (3, "n2".into())]
        );
        // n2 serves 2..=5 itself: it fetches n0's.
        assert_eq!(
            to_fetch("n2", &sources, None),
            vec![(0, "n0".into()), (1, "n0".into())]
        );
        // A newcomer holds nothing: everything, each from its source.
        assert_eq!(to_fetch("n9", &sources, None).len(), 6);
    }

    #[test]
    fn an_own_save_drops_replicas_oldest_first_and_only_as_many_as_needed() {
        let replicas = [((4, 1), 30), ((2, 1), 30), ((6, 1), 30)];
        assert_eq!(oldest_for(&replicas, 0), Vec::<Key>::new(), "fits");
        assert_eq!(oldest_for(&replicas, 1), vec![(2, 1)]);
        assert_eq!(oldest_for(&replicas, 30), vec![(2, 1)]);
        assert_eq!(
            oldest_for(&replicas, 31),
            vec![(2, 1), (4, 1)],
            "the oldest step first"
        );
        assert_eq!(
            oldest_for(&replicas, 100),
            vec![(2, 1), (4, 1), (6, 1)],
            "every replica"
        );
        assert!(oldest_for(&[], 10).is_empty());
    }

    #[test]
    fn a_replica_releases_older_replicas_first_and_never_an_unpersisted_own_copy() {
        let h = |step, bytes, replica, persisted| Held {
            key: (step, 1),
            bytes,
            replica,
            persisted,
        };
        let held = [
            h(2, 30, false, true),
            h(2, 30, true, false),
            h(4, 30, false, false),
            h(4, 30, true, false),
        ];
        assert_eq!(
            release(&held, 0, 200, (6, 1), 30),
            Fit::Take { release: vec![] },
            "it fits as is"
        );
        assert_eq!(
            release(&held, 0, 120, (6, 1), 30),
            Fit::Take {
                release: vec![(2, 1)]
            },
            "the oldest replica first"
        );
        assert_eq!(
            release(&held, 0, 120, (6, 1), 90),
            Fit::Take {
                release: vec![(2, 1), (2, 1), (4, 1)]
            },
            "then the persisted own copy, then the next replica"
        );
        let Fit::Refuse { reason } = release(&held, 0, 120, (6, 1), 121) else {
            panic!()
        };
        assert!(
            reason.starts_with("a replica of step 6 (121 B) does not fit the budget of 120 B"),
            "{reason}"
        );
        assert!(
            matches!(release(&held, 0, 120, (3, 1), 61), Fit::Refuse { .. }),
            "only older steps make room"
        );
        // The ranks' spares (and the room kept for them) count too.
        assert_eq!(
            release(&held, 50, 200, (6, 1), 30),
            Fit::Take { release: vec![] }
        );
        assert_eq!(
            release(&held, 51, 200, (6, 1), 30),
            Fit::Take {
                release: vec![(2, 1)]
            }
        );
        assert!(matches!(
            release(&held, 0, 200, (6, 1), 100),
            Fit::Take { .. }
        ));
        assert!(matches!(
            release(&held, 111, 200, (6, 1), 100),
            Fit::Refuse { .. }
        ));
    }
}
