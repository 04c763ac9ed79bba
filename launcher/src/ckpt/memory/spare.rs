//! A released staged copy becomes its ranks' spare staging files, pure: which of its files
//! each rank takes as the spare its next save writes through ([`fates`]), and why the others
//! are removed.
//!
//! A rank writes a staged save through a spare file it mapped ahead (`.spare-rank<R>` in the
//! staging directory, `python/drun/_stage.py`). A fresh spare costs the node its pages: the
//! kernel allocates and zeroes a GiB of tmpfs pages (0.7 s of CPU per GiB measured alone, and
//! 2.5 s per GiB in the rank beside the training, where filling the mapping also holds back
//! the training thread's own memory calls), and the agent frees as much when it releases an
//! older step. A released copy's file of the same rank is the same size: renamed to the rank's
//! spare name it keeps its pages, and the rank only maps them (0.1 s per GiB). Its old bytes
//! are overwritten by the next save, which truncates the file to what it wrote.
//!
//! A file is reused only when nothing reads it any more: its copy is on disk (the persister is
//! done with it), no replica of it is on its way, and it is of the generation the node runs
//! (the rank that wrote it is still this node's). A rank that already has a spare keeps it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// The name of rank `rank`'s spare in the staging directory (`python/drun/_stage.py`'s
/// `Spares.path`).
pub fn spare_name(rank: u32) -> String {
    format!("{SPARE_PREFIX}{rank}")
}

/// What every spare file's name starts with.
pub const SPARE_PREFIX: &str = ".spare-rank";

/// The free tmpfs a rank asks beside a spare of `bytes` before it maps it (`_stage.py`'s
/// `leaves_room` for the size it asks, `bytes + bytes/64 + 1 MiB`): room for as much again, so
/// that a spare never takes the room the next save needs.
pub fn room_for(bytes: u64) -> u64 {
    2 * spare_size(bytes)
}

/// The size of the spare a rank prepares after a staged save whose largest file was `bytes`
/// (`_stage.py`'s `want`: a state that grows a little still fits).
pub fn spare_size(bytes: u64) -> u64 {
    bytes + bytes / 64 + (1 << 20)
}

/// The room, bytes, each rank's spare takes once the ranks prepare them after a staged save,
/// beyond what it holds already: per rank of `files` (rank, bytes of each staged file of the
/// save), the [`spare_size`] of its largest file less the spare it has (`held`, rank → bytes).
pub fn spare_room(files: &[(u32, u64)], held: &BTreeMap<u32, u64>) -> BTreeMap<u32, u64> {
    let mut largest: BTreeMap<u32, u64> = BTreeMap::new();
    for (rank, bytes) in files {
        let l = largest.entry(*rank).or_default();
        *l = (*l).max(*bytes);
    }
    largest
        .into_iter()
        .map(|(rank, bytes)| {
            let have = held.get(&rank).copied().unwrap_or(0);
            (rank, spare_size(bytes).saturating_sub(have))
        })
        .collect()
}

/// One file of a released copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Where it is staged.
    pub staged: PathBuf,
    /// The global rank that wrote it.
    pub rank: u32,
    /// Its size, bytes.
    pub bytes: u64,
}

/// What becomes of a released file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Renamed to `rank`'s spare ([`spare_name`]).
    Spare {
        /// The rank whose spare it becomes.
        rank: u32,
    },
    /// Removed (its pages freed), and why it is not reused.
    Remove {
        /// One phrase.
        why: &'static str,
    },
}

/// The fate of each of `released` (in its order), the files of one copy released from memory.
/// `reusable`: `Err(why)` when nothing of the copy may be reused (see the module's rules);
/// `spares`: the ranks that have a spare already; `free`: the staging tmpfs's free bytes.
/// Each rank takes its largest file, when the tmpfs keeps [`room_for`] it free.
pub fn fates(
    released: &[Released],
    reusable: Result<(), &'static str>,
    spares: &BTreeSet<u32>,
    free: u64,
) -> Vec<Fate> {
    let mut taken: BTreeSet<u32> = BTreeSet::new();
    let mut order: Vec<usize> = (0..released.len()).collect();
    // Each rank's largest file first, ties by position.
    order.sort_by_key(|&i| (released[i].rank, std::cmp::Reverse(released[i].bytes), i));
    let mut out = vec![
        Fate::Remove {
            why: "not its rank's largest file"
        };
        released.len()
    ];
    for i in order {
        let f = &released[i];
        out[i] = if let Err(why) = reusable {
            Fate::Remove { why }
        } else if spares.contains(&f.rank) {
            Fate::Remove {
                why: "its rank has a spare already",
            }
        } else if taken.contains(&f.rank) {
            continue;
        } else if free < room_for(f.bytes) {
            taken.insert(f.rank);
            Fate::Remove {
                why: "the tmpfs would not keep room for the next save beside it",
            }
        } else {
            taken.insert(f.rank);
            Fate::Spare { rank: f.rank }
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn file(name: &str, rank: u32, bytes: u64) -> Released {
        Released {
            staged: PathBuf::from(name),
            rank,
            bytes,
        }
    }

    #[test]
    fn each_rank_takes_its_largest_file_and_the_rest_is_removed() {
        // A DCP step: each rank's data file and a small one; rank 0 also the metadata.
        let released = [
            file("0.meta", 0, MIB),
            file("0.distcp", 0, 900 * MIB),
            file("1.distcp", 1, 800 * MIB),
            file("1.small", 1, 2 * MIB),
        ];
        let f = fates(&released, Ok(()), &BTreeSet::new(), 8 << 30);
        assert_eq!(
            f,
            vec![
                Fate::Remove {
                    why: "not its rank's largest file"
                },
                Fate::Spare { rank: 0 },
                Fate::Spare { rank: 1 },
                Fate::Remove {
                    why: "not its rank's largest file"
                },
            ]
        );
    }

    #[test]
    fn a_copy_still_read_or_of_another_generation_is_removed_whole() {
        let released = [file("a", 0, MIB), file("b", 1, MIB)];
        let f = fates(&released, Err("not on disk"), &BTreeSet::new(), u64::MAX);
        assert!(
            f.iter().all(|x| *x == Fate::Remove { why: "not on disk" }),
            "{f:?}"
        );
    }

    #[test]
    fn a_rank_with_a_spare_keeps_it_and_a_full_tmpfs_frees_the_pages() {
        let released = [file("a", 0, 100 * MIB), file("b", 1, 100 * MIB)];
        let has = BTreeSet::from([1]);
        let f = fates(&released, Ok(()), &has, u64::MAX);
        assert_eq!(f[0], Fate::Spare { rank: 0 });
        assert!(matches!(f[1], Fate::Remove { why } if why.contains("spare already")));
        // Room for the spare and as much again: reused; a byte less: removed.
        let need = room_for(100 * MIB);
        assert_eq!(
            fates(&released[..1], Ok(()), &BTreeSet::new(), need)[0],
            Fate::Spare { rank: 0 }
        );
        assert!(matches!(
            fates(&released[..1], Ok(()), &BTreeSet::new(), need - 1)[0],
            Fate::Remove { why } if why.contains("room")
        ));
    }

    #[test]
    fn the_room_asked_is_the_ranks_own_rule() {
        // _stage.py: want = size + size // 64 + 1 MiB; leaves_room: free >= 2 * want.
        assert_eq!(room_for(64 * MIB), 2 * (64 * MIB + MIB + MIB));
        assert_eq!(spare_name(3), ".spare-rank3");
    }

    #[test]
    fn the_spares_room_is_each_ranks_largest_file_less_the_spare_it_has() {
        let files = [(0, 64 * MIB), (0, 2 * MIB), (1, 64 * MIB)];
        let one = 66 * MIB;
        assert_eq!(
            spare_room(&files, &BTreeMap::new()),
            BTreeMap::from([(0, one), (1, one)])
        );
        let held = BTreeMap::from([(1, 60 * MIB), (5, 100 * MIB)]);
        assert_eq!(
            spare_room(&files, &held),
            BTreeMap::from([(0, one), (1, 6 * MIB)]),
            "rank 1 grows its spare; rank 5 saved nothing"
        );
        let held = BTreeMap::from([(0, 80 * MIB), (1, 80 * MIB)]);
        assert_eq!(
            spare_room(&files, &held),
            BTreeMap::from([(0, 0), (1, 0)]),
            "each has one large enough"
        );
    }
}
