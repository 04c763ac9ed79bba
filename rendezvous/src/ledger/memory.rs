//! The resume from the survivors' copies in memory (`--ckpt-memory` with `--ckpt-replicas 1`,
//! issue 35 item 3), pure: given the sealed resume point and what each joining node holds in
//! memory ([`HeldStep`], reported in its join), whether the new world resumes a newer step from
//! memory, which member serves each rank's files, and why — a function of its inputs with a
//! reason, tested on synthetic holdings.
//!
//! # The rules
//! * A step held in memory is a candidate when it is newer than the sealed resume point, not
//!   marked bad, and the joining nodes together hold every rank's files of it (ranks
//!   `0..world_size` of the generation that saved it), each file with a SHA-256. A node stages
//!   a step only after all its ranks committed it with one cursor, so every rank held means
//!   every node of that generation staged it: this is the "staged seal", read from the
//!   survivors themselves, so the decision never names a copy no survivor holds.
//! * The world size and the cursor come from the holders' own copies (a replica does not carry
//!   them); they must agree, and so must two copies of one file (size and digest). A step whose
//!   copies disagree is not resumed from memory.
//! * The newest candidate wins. A rank's files are served by the node that saved them when it
//!   is among the joining nodes, else by the joining node with the smallest id that holds them:
//!   one deterministic source.
//! * Otherwise the sealed resume point stands, with one line naming the newer steps held in
//!   memory and the ranks no survivor holds.
//!
//! The decision is made once, at formation, and carried in the plan
//! ([`crate::Plan::resume_memory`]): every rank of the new world resumes the same step.

use std::collections::{BTreeMap, BTreeSet};

use super::{manifest_id, Cursor, Manifest, ShardFile};
use crate::store::records::{HeldStep, MemoryResume};
use crate::Plan;

/// Where the new world resumes, as far as memory is concerned.
// One per formation, moved once into the plan: boxing the manifest would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// From memory: the step (as a manifest, not sealed) and who serves each rank.
    Memory {
        /// The step every rank resumes.
        manifest: Manifest,
        /// Per rank, the serving member.
        sources: MemoryResume,
        /// One line, for every agent's log.
        reason: String,
        /// When the saver's ranks went on after staging it (the earliest a holder reports):
        /// what the re-form keeps of the ending generation's work.
        staged_at_ms: Option<u64>,
    },
    /// The sealed resume point stands; `Some(line)` when a newer step was held in memory but
    /// could not be resumed (why), `None` when memory held nothing newer.
    Sealed(Option<String>),
}

/// Where a new world of the joining nodes `held` (node id → what it holds) resumes, given the
/// sealed resume point `sealed` and the manifests marked `bad`; `now_ms` stamps the manifest.
/// `ending` (the plan of the generation that ends, when known) names, in the line, the nodes
/// whose ranks no survivor holds and their replica holders.
pub fn choose(
    run_id: &str,
    sealed: Option<&Manifest>,
    bad: &BTreeMap<String, String>,
    held: &BTreeMap<&str, &[HeldStep]>,
    ending: Option<&Plan>,
    now_ms: u64,
) -> Choice {
    let floor = sealed.map(|m| (m.step, m.generation));
    let keys: BTreeSet<(u64, u64)> = held
        .values()
        .flat_map(|h| h.iter().map(|s| (s.step, s.generation)))
        .filter(|k| floor.is_none_or(|f| *k > f))
        .filter(|(s, g)| !bad.contains_key(&manifest_id(*s, *g)))
        .collect();
    let mut why_not = Vec::new();
    let mut keys_tried = Vec::new();
    for key in keys.into_iter().rev() {
        keys_tried.push(key);
        match complete(run_id, key, held, ending, now_ms) {
            Ok((manifest, sources)) => {
                let served: BTreeSet<&str> = sources.sources.values().map(String::as_str).collect();
                let reason = format!(
                    "resuming step {} (generation {}) from the survivors' copies in memory, newer than {}: {} rank(s) served by {}",
                    key.0,
                    key.1,
                    describe(sealed),
                    sources.sources.len(),
                    served.into_iter().collect::<Vec<_>>().join(", ")
                );
                let staged_at_ms = held
                    .values()
                    .flat_map(|h| h.iter())
                    .filter(|s| (s.step, s.generation) == key)
                    .filter_map(|s| s.staged_at_ms)
                    .min();
                return Choice::Memory {
                    manifest,
                    sources,
                    reason,
                    staged_at_ms,
                };
            }
            Err(why) => why_not.push(format!("step {} (generation {}): {why}", key.0, key.1)),
        }
    }
    if why_not.is_empty() {
        return Choice::Sealed(None);
    }
    // The newest step's reason; the older ones failed too (a node's copies of every step go
    // with it), named by step only.
    let older = if why_not.len() > 1 {
        format!(
            " (nor from the older staged step(s) {})",
            keys_tried[1..]
                .iter()
                .map(|(s, _)| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        String::new()
    };
    Choice::Sealed(Some(format!(
        "not resuming from memory: {}{older}: resuming {}",
        why_not[0],
        describe(sealed)
    )))
}

fn describe(sealed: Option<&Manifest>) -> String {
    sealed.map_or("from the start (nothing persisted)".to_string(), |m| {
        format!(
            "the persisted step {} (generation {})",
            m.step, m.generation
        )
    })
}

/// Why the survivors' copies of a step are not a resume point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Incomplete {
    /// Two copies name another value of what every copy of the step must agree on.
    #[error("the survivors' copies disagree on the {what} ({first}, {other})")]
    Disagree {
        /// What (`world size`, `cursor`).
        what: &'static str,
        /// The first copy's value (`Debug`).
        first: String,
        /// Another copy's (`Debug`).
        other: String,
    },
    /// No copy carries the world size that saved it.
    #[error("no survivor saved it (the world size that saved it is unknown)")]
    NoWorldSize,
    /// No copy carries its data cursor.
    #[error("no survivor saved it (its data cursor is unknown)")]
    NoCursor,
    /// A file held without its digest.
    #[error("{0} has no digest")]
    NoDigest(String),
    /// Two copies of a file differ (size, digest or rank).
    #[error("the copies of {0} differ")]
    Differ(String),
    /// Ranks no survivor holds.
    #[error("rank(s) {} held by no survivor", ranges(.0))]
    Unheld(Vec<u32>),
    /// Ranks held only by nodes the ending generation lost.
    #[error("rank(s) {} were held only by {}", ranges(.missing), .lost.join("; "))]
    Lost {
        /// The ranks.
        missing: Vec<u32>,
        /// The nodes that held them.
        lost: Vec<String>,
    },
    /// A file names a rank the world that saved it did not have.
    #[error("{path} names rank {rank}, beyond its world size {world_size}")]
    BeyondWorld {
        /// The file.
        path: String,
        /// Its rank.
        rank: u32,
        /// The world size that saved the step.
        world_size: u32,
    },
}

/// The manifest and sources of step `key` when the holders hold every rank's files of it,
/// consistently; else why not.
fn complete(
    run_id: &str,
    key: (u64, u64),
    held: &BTreeMap<&str, &[HeldStep]>,
    ending: Option<&Plan>,
    now_ms: u64,
) -> Result<(Manifest, MemoryResume), Incomplete> {
    let copies: Vec<(&str, &HeldStep)> = held
        .iter()
        .flat_map(|(n, h)| {
            h.iter()
                .filter(move |s| (s.step, s.generation) == key)
                .map(move |s| (*n, s))
        })
        .collect();
    let world_size = agreed(
        copies.iter().filter_map(|(_, s)| s.world_size),
        "world size",
    )?
    .ok_or(Incomplete::NoWorldSize)?;
    let cursor: Cursor = agreed(
        copies.iter().filter_map(|(_, s)| s.cursor.clone()),
        "cursor",
    )?
    .ok_or(Incomplete::NoCursor)?;
    // Per path, the one content every copy agrees on.
    let mut by_path: BTreeMap<&str, &ShardFile> = BTreeMap::new();
    for f in copies.iter().flat_map(|(_, s)| &s.files) {
        if f.digest.is_empty() {
            return Err(Incomplete::NoDigest(f.path.clone()));
        }
        if let Some(other) = by_path.insert(&f.path, f) {
            if (other.bytes, &other.digest, other.rank) != (f.bytes, &f.digest, f.rank) {
                return Err(Incomplete::Differ(f.path.clone()));
            }
        }
    }
    let mut sources = BTreeMap::new();
    let mut missing = Vec::new();
    for rank in 0..world_size {
        let holds = |s: &HeldStep| s.files.iter().any(|f| f.rank == rank);
        let own = copies
            .iter()
            .find(|(n, s)| s.saved_by == *n && holds(s))
            .map(|(n, _)| *n);
        let any = copies.iter().find(|(_, s)| holds(s)).map(|(n, _)| *n);
        match own.or(any) {
            Some(n) => {
                sources.insert(rank, n.to_string());
            }
            None => missing.push(rank),
        }
    }
    if !missing.is_empty() {
        let lost = ending
            .filter(|p| p.generation == key.1 && p.complete())
            .map(|p| lost_holders(p, &missing, held))
            .unwrap_or_default();
        return Err(if lost.is_empty() {
            Incomplete::Unheld(missing)
        } else {
            Incomplete::Lost { missing, lost }
        });
    }
    let mut files: Vec<ShardFile> = by_path.into_values().cloned().collect();
    files.sort_by(|a, b| (a.rank, &a.path).cmp(&(b.rank, &b.path)));
    if let Some(f) = files.iter().find(|f| f.rank >= world_size) {
        return Err(Incomplete::BeyondWorld {
            path: f.path.clone(),
            rank: f.rank,
            world_size,
        });
    }
    Ok((
        Manifest {
            run_id: run_id.to_string(),
            step: key.0,
            generation: key.1,
            world_size,
            cursor,
            files,
            sealed_at_ms: now_ms,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        },
        MemoryResume { sources },
    ))
}

/// For each member of `plan` saving one of `missing`: "n1 and its replica holder n2, both
/// lost", or, when the holder is among the joining nodes `held` (it never got the replica, or
/// released it), "n1, lost (its replica holder n2 has no copy of the step)".
fn lost_holders(plan: &Plan, missing: &[u32], held: &BTreeMap<&str, &[HeldStep]>) -> Vec<String> {
    let n = plan.members.len();
    (0..n)
        .filter(|&i| {
            let m = &plan.members[i];
            missing
                .iter()
                .any(|r| (m.base_rank..m.base_rank + m.slots).contains(r))
        })
        .map(|i| {
            let next = &plan.members[(i + 1) % n].node_id;
            let me = &plan.members[i].node_id;
            if held.contains_key(me.as_str()) {
                format!("{me}, which no longer holds the step")
            } else if n == 1 {
                format!("{me}, lost")
            } else if held.contains_key(next.as_str()) {
                format!("{me}, lost (its replica holder {next} has no copy of the step)")
            } else {
                format!("{me} and its replica holder {next}, both lost")
            }
        })
        .collect()
}

/// The one value every item agrees on (`None` for none), or the disagreement.
fn agreed<T: PartialEq + std::fmt::Debug>(
    mut items: impl Iterator<Item = T>,
    what: &'static str,
) -> Result<Option<T>, Incomplete> {
    let Some(first) = items.next() else {
        return Ok(None);
    };
    match items.find(|x| *x != first) {
        Some(other) => Err(Incomplete::Disagree {
            what,
            first: format!("{first:?}"),
            other: format!("{other:?}"),
        }),
        None => Ok(Some(first)),
    }
}

/// `0–3, 6` for `[0, 1, 2, 3, 6]` (ascending).
pub fn ranges(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}–{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Candidate;

    fn cursor(step: u64) -> Cursor {
        Cursor {
            consumed_in_epoch: step * 8,
            consumed_total: step * 8,
            global_batch: 8,
            ..Default::default()
        }
    }

    fn file(rank: u32, step: u64) -> ShardFile {
        ShardFile {
            rank,
            path: format!("/ck/r/step-{step}/rank{rank}.pt"),
            bytes: 100 + u64::from(rank),
            digest: format!("{rank:064x}"),
        }
    }

    /// Node `i` of a ring of `n` (2 ranks each: 2i, 2i+1) after `--ckpt-replicas 1` at
    /// `steps` of generation 1: its own copy and its predecessor's replica of each.
    fn ring_node(i: u32, n: u32, steps: &[u64]) -> Vec<HeldStep> {
        let pred = (i + n - 1) % n;
        steps
            .iter()
            .flat_map(|&step| {
                [
                    HeldStep {
                        step,
                        generation: 1,
                        saved_by: format!("n{i}"),
                        world_size: Some(2 * n),
                        cursor: Some(cursor(step)),
                        files: vec![file(2 * i, step), file(2 * i + 1, step)],
                        staged_at_ms: None,
                    },
                    HeldStep {
                        step,
                        generation: 1,
                        saved_by: format!("n{pred}"),
                        world_size: None,
                        cursor: None,
                        files: vec![file(2 * pred, step), file(2 * pred + 1, step)],
                        staged_at_ms: None,
                    },
                ]
            })
            .collect()
    }

    fn ring(n: u32, steps: &[u64], lost: &[u32]) -> BTreeMap<String, Vec<HeldStep>> {
        (0..n)
            .filter(|i| !lost.contains(i))
            .map(|i| (format!("n{i}"), ring_node(i, n, steps)))
            .collect()
    }

    fn view(h: &BTreeMap<String, Vec<HeldStep>>) -> BTreeMap<&str, &[HeldStep]> {
        h.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect()
    }

    fn sealed(step: u64) -> Manifest {
        Manifest::bare("r", step, 1, 0)
    }

    #[test]
    fn one_node_lost_resumes_the_newest_staged_step_from_memory() {
        let h = ring(3, &[10, 12], &[1]);
        let none = BTreeMap::new();
        let c = choose("r", Some(&sealed(8)), &none, &view(&h), None, 77);
        let Choice::Memory {
            manifest,
            sources,
            reason,
            ..
        } = c
        else {
            panic!("{c:?}")
        };
        assert_eq!((manifest.step, manifest.generation), (12, 1));
        assert_eq!(manifest.world_size, 6);
        assert_eq!(manifest.cursor, cursor(12));
        assert_eq!(manifest.sealed_at_ms, 77);
        let ranks: Vec<u32> = manifest.files.iter().map(|f| f.rank).collect();
        assert_eq!(ranks, [0, 1, 2, 3, 4, 5], "every rank's file, by rank");
        // n1's ranks come from n2, which holds n1's replica; the others from their saver.
        let want: BTreeMap<u32, String> = [(0, "n0"), (1, "n0"), (2, "n2"), (3, "n2")]
            .into_iter()
            .chain([(4, "n2"), (5, "n2")])
            .map(|(r, n)| (r, n.to_string()))
            .collect();
        assert_eq!(sources.sources, want);
        assert_eq!(
            reason,
            "resuming step 12 (generation 1) from the survivors' copies in memory, newer than the persisted step 8 (generation 1): 6 rank(s) served by n0, n2"
        );
    }

    #[test]
    fn two_adjacent_nodes_lost_fall_back_to_the_persisted_step_with_the_line() {
        let h = ring(3, &[12], &[1, 2]);
        let nodes: Vec<Candidate> = (0..3)
            .map(|i| Candidate::local(&format!("n{i}"), 2))
            .collect();
        let ending = crate::assign("r", 1, &nodes, 0, 0).unwrap();
        let c = choose(
            "r",
            Some(&sealed(10)),
            &BTreeMap::new(),
            &view(&h),
            Some(&ending),
            0,
        );
        assert_eq!(
            c,
            Choice::Sealed(Some(
                "not resuming from memory: step 12 (generation 1): rank(s) 2–3 were held only by n1 and its replica holder n2, both lost: resuming the persisted step 10 (generation 1)".into()
            ))
        );
        // Without the ending plan (another generation saved it) the line names the ranks.
        let Choice::Sealed(Some(line)) = choose("r", None, &BTreeMap::new(), &view(&h), None, 0)
        else {
            panic!()
        };
        assert!(line.contains("rank(s) 2–3 held by no survivor"), "{line}");
        assert!(
            line.ends_with("resuming from the start (nothing persisted)"),
            "{line}"
        );
        // In a ring of 4, two losses that are not neighbours leave every file on a survivor.
        let apart = ring(4, &[12], &[0, 2]);
        assert!(matches!(
            choose("r", Some(&sealed(10)), &BTreeMap::new(), &view(&apart), None, 0),
            Choice::Memory { ref manifest, .. } if manifest.step == 12
        ));
    }

    #[test]
    fn the_line_names_the_newest_step_and_the_older_ones_by_step() {
        let h = ring(3, &[10, 12], &[1, 2]);
        let Choice::Sealed(Some(line)) =
            choose("r", Some(&sealed(8)), &BTreeMap::new(), &view(&h), None, 0)
        else {
            panic!()
        };
        assert_eq!(
            line,
            "not resuming from memory: step 12 (generation 1): rank(s) 2–3 held by no survivor (nor from the older staged step(s) 10): resuming the persisted step 8 (generation 1)"
        );
    }

    #[test]
    fn only_steps_newer_than_the_sealed_one_and_not_bad_count() {
        let h = ring(3, &[10, 12], &[]);
        assert_eq!(
            choose("r", Some(&sealed(12)), &BTreeMap::new(), &view(&h), None, 0),
            Choice::Sealed(None),
            "a sealed step is never resumed from memory"
        );
        let bad = BTreeMap::from([(manifest_id(12, 1), "torn".to_string())]);
        let c = choose("r", Some(&sealed(8)), &bad, &view(&h), None, 0);
        assert!(
            matches!(c, Choice::Memory { ref manifest, .. } if manifest.step == 10),
            "{c:?}"
        );
        assert_eq!(
            choose("r", None, &BTreeMap::new(), &BTreeMap::new(), None, 0),
            Choice::Sealed(None),
            "nothing held (an older agent)"
        );
    }

    #[test]
    fn an_older_complete_step_wins_over_a_newer_incomplete_one() {
        let mut h = ring(3, &[10, 12], &[1]);
        // n2 never received n1's replica of step 12.
        h.get_mut("n2")
            .unwrap()
            .retain(|s| !(s.step == 12 && s.saved_by == "n1"));
        let c = choose("r", Some(&sealed(8)), &BTreeMap::new(), &view(&h), None, 0);
        assert!(
            matches!(c, Choice::Memory { ref manifest, .. } if manifest.step == 10),
            "{c:?}"
        );
    }

    #[test]
    fn copies_that_disagree_or_lack_a_digest_are_not_resumed() {
        let base = ring(3, &[12], &[1]);
        let refuse = |h: &BTreeMap<String, Vec<HeldStep>>| match choose(
            "r",
            Some(&sealed(8)),
            &BTreeMap::new(),
            &view(h),
            None,
            0,
        ) {
            Choice::Sealed(Some(line)) => line,
            c => panic!("{c:?}"),
        };
        let mut h = base.clone();
        h.get_mut("n0").unwrap()[0].cursor = Some(cursor(11));
        assert!(
            refuse(&h).contains("disagree on the cursor"),
            "{}",
            refuse(&h)
        );
        // n0's replica of n2's rank 4 is not n2's own copy.
        let mut h = base.clone();
        h.get_mut("n0").unwrap()[1].files[0].digest = "f".repeat(64);
        assert!(
            refuse(&h).contains("the copies of /ck/r/step-12/rank4.pt differ"),
            "{}",
            refuse(&h)
        );
        let mut h = base.clone();
        h.get_mut("n0").unwrap()[0].files[1].digest.clear();
        assert!(
            refuse(&h).contains("rank1.pt has no digest"),
            "{}",
            refuse(&h)
        );
        // Only replicas held (no survivor saved it): its world size is unknown.
        let mut h = base;
        for s in h.values_mut().flatten() {
            s.world_size = None;
        }
        assert!(
            refuse(&h).contains("no survivor saved it"),
            "{}",
            refuse(&h)
        );
    }

    #[test]
    fn rank_lists_read_as_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 3, 6]), "0–3, 6");
        assert_eq!(ranges(&[4]), "4");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[1, 3, 4]), "1, 3–4");
    }
}
