//! Replicas on peers (`--ckpt-replicas 1`, issue 35 item 3): the protocol's decisions, pure —
//! which peer holds a node's replica ([`neighbour`]), which staged step a new world may resume
//! from memory given what the survivors hold ([`resume_point`]), what each survivor fetches
//! from whom ([`to_fetch`]), and which replicas make room for an incoming one ([`release`]) —
//! each a function of its inputs with a reason, tested on synthetic holdings.
//!
//! Wired so far: the flag (`--ckpt-replicas`), the transport between agents
//! ([`super::wire`], `agent/driver/replicas.rs`: each staged step goes to [`neighbour`], is
//! verified by digest on receipt and held within the receiver's budget by [`release`] and
//! [`make_room_for_own`]) and `status`'s `replicated`. Not wired yet: the ledger's record of
//! staged steps and the resume after a node loss ([`resume_point`], [`to_fetch`]).
//!
//! # The rules
//! * Each node sends its staged files of a step to its ring neighbour: the next node by node
//!   rank in the generation that saved it, the last node's to the first. With one replica, the
//!   loss of any one node leaves every file of a step on some survivor; two adjacent nodes lost
//!   at once (in a ring of 3, any two) take one node's only copies with them.
//! * A new world resumes from memory only a step the ledger knows as staged by every node of
//!   its generation (their commits agreed on the cursor), newer than the persisted step, and
//!   only when the survivors hold every rank's files of it — own staged copies and replicas,
//!   each verified by digest on receipt. The newest such step wins; otherwise the persisted
//!   step, with a reason naming the ranks no survivor holds. Every rank resumes what this one
//!   decision says (it is the ledger's, as today).
//! * A rank's files are fetched from the node that saved them when it survived, else from the
//!   survivor with the smallest node id that holds a replica: one deterministic source.
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

/// The replicas (oldest first) this node drops so that its own save of `incoming` bytes fits
/// the `budget` beside `own_held` bytes of its own copies: a node's own copy always wins over
/// a replica (the replica's sender still holds its own). Empty when it fits as is; every
/// replica when even that is not enough (the own save then goes its usual way, to disk).
pub fn make_room_for_own(
    replicas: &[(Key, u64)],
    budget: u64,
    own_held: u64,
    incoming: u64,
) -> Vec<Key> {
    let mut used = own_held + replicas.iter().map(|(_, b)| b).sum::<u64>();
    let mut order: Vec<&(Key, u64)> = replicas.iter().collect();
    order.sort_by_key(|(k, _)| *k);
    let mut out = Vec::new();
    for (k, b) in order {
        if used + incoming <= budget {
            break;
        }
        used -= b;
        out.push(*k);
    }
    out
}

/// A step staged by every node of its generation (the ledger's record): each rank's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedStep {
    /// `(step, generation)`.
    pub key: Key,
    /// The node that saved each rank's files, by global rank.
    pub saved_by: BTreeMap<u32, String>,
}

/// What a survivor holds in memory, verified: per step, the ranks whose files it has (its own
/// staged copies and the replicas it received).
pub type Holdings = BTreeMap<Key, BTreeSet<u32>>;

/// Where the new world resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// From memory: the step and, per rank, the survivor that serves its files.
    Memory {
        /// The step.
        key: Key,
        /// Per global rank of the step, the node to read its files from.
        sources: BTreeMap<u32, String>,
        /// Why, for the log.
        reason: String,
    },
    /// From the persisted step (the ledger's sealed one, as without memory).
    Persisted {
        /// Why, for the log.
        reason: String,
    },
}

/// Where a new world of `survivors` (node id → holdings) resumes: the newest of `staged` newer
/// than `persisted` whose every rank's files some survivor holds, else the persisted step.
pub fn resume_point(
    staged: &[StagedStep],
    persisted: Option<Key>,
    survivors: &BTreeMap<String, Holdings>,
) -> Resume {
    let mut candidates: Vec<&StagedStep> = staged
        .iter()
        .filter(|s| persisted.is_none_or(|p| s.key > p) && !s.saved_by.is_empty())
        .collect();
    candidates.sort_by_key(|s| std::cmp::Reverse(s.key));
    let mut why_not = Vec::new();
    for s in candidates {
        match sources(s, survivors) {
            Ok(sources) => {
                let fetched = sources
                    .iter()
                    .filter(|(r, n)| s.saved_by.get(r) != Some(n))
                    .count();
                let reason = format!(
                    "step {} (generation {}) is held in memory by the survivors: {} rank(s) from their own node, {} from a replica",
                    s.key.0,
                    s.key.1,
                    sources.len() - fetched,
                    fetched
                );
                return Resume::Memory {
                    key: s.key,
                    sources,
                    reason,
                };
            }
            Err(missing) => why_not.push(format!(
                "step {} (generation {}): rank(s) {} held by no survivor",
                s.key.0,
                s.key.1,
                missing
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    let persisted = persisted.map_or("nothing persisted yet".to_string(), |(s, g)| {
        format!("the persisted step {s} (generation {g})")
    });
    let reason = if why_not.is_empty() {
        format!("no staged step newer than {persisted}: resuming {persisted}")
    } else {
        format!("{}: resuming {persisted}", why_not.join("; "))
    };
    Resume::Persisted { reason }
}

/// Per rank of `s`, the survivor to read its files from (its own node when it survived, else
/// the smallest node id holding a replica), or the ranks no survivor holds.
fn sources(
    s: &StagedStep,
    survivors: &BTreeMap<String, Holdings>,
) -> Result<BTreeMap<u32, String>, Vec<u32>> {
    let mut out = BTreeMap::new();
    let mut missing = Vec::new();
    for (rank, saver) in &s.saved_by {
        let holds = |n: &String| {
            survivors
                .get(n)
                .and_then(|h| h.get(&s.key))
                .is_some_and(|r| r.contains(rank))
        };
        let from = if holds(saver) {
            Some(saver.clone())
        } else {
            survivors.keys().find(|n| holds(n)).cloned()
        };
        match from {
            Some(n) => {
                out.insert(*rank, n);
            }
            None => missing.push(*rank),
        }
    }
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(missing)
    }
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

/// Whether a replica of `incoming` bytes fits a receiver's `budget` holding `held`: replicas
/// and persisted own copies of steps older than `key` are released oldest first until it
/// fits; own copies not yet persisted never are.
pub fn release(held: &[Held], budget: u64, key: Key, incoming: u64) -> Fit {
    let used: u64 = held.iter().map(|h| h.bytes).sum();
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

    /// Step `key` of a ring of `n` nodes, 2 ranks each (node i has ranks 2i, 2i+1).
    fn staged(key: Key, n: usize) -> StagedStep {
        StagedStep {
            key,
            saved_by: (0..2 * n as u32)
                .map(|r| (r, format!("n{}", r / 2)))
                .collect(),
        }
    }

    /// What each node of a ring of `n` holds after `--ckpt-replicas 1` for `keys`: its own two
    /// ranks and its ring predecessor's.
    fn ring(n: usize, keys: &[Key]) -> BTreeMap<String, Holdings> {
        let all = nodes(n);
        all.iter()
            .map(|me| {
                let mut ranks = BTreeSet::new();
                for node in &all {
                    if node == me || neighbour(&all, node) == Some(me.as_str()) {
                        let i: u32 = node[1..].parse().unwrap();
                        ranks.extend([2 * i, 2 * i + 1]);
                    }
                }
                let h = keys.iter().map(|k| (*k, ranks.clone())).collect();
                (me.clone(), h)
            })
            .collect()
    }

    fn lose(mut s: BTreeMap<String, Holdings>, gone: &[&str]) -> BTreeMap<String, Holdings> {
        for g in gone {
            s.remove(*g);
        }
        s
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
    fn one_node_lost_resumes_the_staged_step_from_memory() {
        let survivors = lose(ring(3, &[(6, 1), (8, 1)]), &["n1"]);
        let r = resume_point(
            &[staged((6, 1), 3), staged((8, 1), 3)],
            Some((4, 1)),
            &survivors,
        );
        let Resume::Memory {
            key,
            sources,
            reason,
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(key, (8, 1), "the newest staged step");
        // n1's ranks come from n2, which holds n1's replica; the others from their own node.
        let want: BTreeMap<u32, String> = [(0, "n0"), (1, "n0"), (2, "n2"), (3, "n2")]
            .into_iter()
            .chain([(4, "n2"), (5, "n2")])
            .map(|(r, n)| (r, n.to_string()))
            .collect();
        assert_eq!(sources, want);
        assert!(
            reason.contains("4 rank(s) from their own node, 2 from a replica"),
            "{reason}"
        );
        assert_eq!(
            to_fetch("n0", &sources, survivors["n0"].get(&key)),
            vec![(2, "n2".into()), (3, "n2".into())],
            "n0 holds n2's replica already"
        );
        assert_eq!(
            to_fetch("n2", &sources, survivors["n2"].get(&key)),
            vec![(0, "n0".into()), (1, "n0".into())]
        );
    }

    #[test]
    fn two_nodes_lost_at_once_fall_back_to_the_persisted_step() {
        let survivors = lose(ring(3, &[(8, 1)]), &["n0", "n1"]);
        let r = resume_point(&[staged((8, 1), 3)], Some((4, 1)), &survivors);
        let Resume::Persisted { reason } = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            reason,
            "step 8 (generation 1): rank(s) 0, 1 held by no survivor: resuming the persisted step 4 (generation 1)"
        );
        // In a ring of 4, two losses that are not neighbours leave every file on a survivor.
        let apart = lose(ring(4, &[(8, 1)]), &["n0", "n2"]);
        assert!(matches!(
            resume_point(&[staged((8, 1), 4)], Some((4, 1)), &apart),
            Resume::Memory { key: (8, 1), .. }
        ));
    }

    #[test]
    fn an_older_complete_step_wins_over_a_newer_incomplete_one_and_persisted_wins_ties() {
        let mut survivors = lose(ring(3, &[(6, 1), (8, 1)]), &["n1"]);
        // n2 never received n1's replica of step 8.
        survivors
            .get_mut("n2")
            .unwrap()
            .get_mut(&(8, 1))
            .unwrap()
            .retain(|r| *r >= 4);
        let steps = [staged((6, 1), 3), staged((8, 1), 3)];
        let r = resume_point(&steps, Some((4, 1)), &survivors);
        assert!(matches!(r, Resume::Memory { key: (6, 1), .. }), "{r:?}");
        let r = resume_point(&steps, Some((8, 1)), &survivors);
        assert_eq!(
            r,
            Resume::Persisted {
                reason: "no staged step newer than the persisted step 8 (generation 1): resuming the persisted step 8 (generation 1)".into()
            },
            "a step on disk is never resumed from memory by this rule"
        );
        assert!(matches!(
            resume_point(&[], None, &survivors),
            Resume::Persisted { reason } if reason.contains("nothing persisted yet")
        ));
    }

    #[test]
    fn an_own_save_drops_replicas_oldest_first_and_only_as_many_as_needed() {
        let replicas = [((4, 1), 30), ((2, 1), 30), ((6, 1), 30)];
        assert_eq!(
            make_room_for_own(&replicas, 200, 40, 30),
            Vec::<Key>::new(),
            "fits"
        );
        assert_eq!(make_room_for_own(&replicas, 150, 40, 30), vec![(2, 1)]);
        assert_eq!(
            make_room_for_own(&replicas, 150, 40, 61),
            vec![(2, 1), (4, 1)],
            "the oldest step first"
        );
        assert_eq!(
            make_room_for_own(&replicas, 50, 40, 30),
            vec![(2, 1), (4, 1), (6, 1)],
            "every replica, and still not enough: the own save goes its usual way"
        );
        assert!(make_room_for_own(&[], 10, 40, 30).is_empty());
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
            release(&held, 200, (6, 1), 30),
            Fit::Take { release: vec![] },
            "it fits as is"
        );
        assert_eq!(
            release(&held, 120, (6, 1), 30),
            Fit::Take {
                release: vec![(2, 1)]
            },
            "the oldest replica first"
        );
        assert_eq!(
            release(&held, 120, (6, 1), 90),
            Fit::Take {
                release: vec![(2, 1), (2, 1), (4, 1)]
            },
            "then the persisted own copy, then the next replica"
        );
        let Fit::Refuse { reason } = release(&held, 120, (6, 1), 121) else {
            panic!()
        };
        assert!(
            reason.starts_with("a replica of step 6 (121 B) does not fit the budget of 120 B"),
            "{reason}"
        );
        assert!(
            matches!(release(&held, 120, (3, 1), 61), Fit::Refuse { .. }),
            "only older steps make room"
        );
    }
}
