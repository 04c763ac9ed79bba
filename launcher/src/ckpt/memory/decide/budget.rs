//! The budget's rules (`--ckpt-memory`), pure: whether a save admitted once written stays in
//! memory ([`Table::admit`]) and whether a save about to be written has room ([`Table::room`]),
//! with what the budget holds besides the node's copies — the ranks' spares (measured, or the
//! room kept for them), the saves being written, fetched files, and other nodes' replicas —
//! and which copies on disk and which replicas make room, oldest first.

use super::{human_bytes, Key, Table};

/// Whether a save of `bytes` stays in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// It fits once these persisted copies are released (oldest first; may be empty) and as
    /// many bytes of other nodes' replicas (oldest first), and whether the ranks' spares for
    /// their next save fit beside it.
    Stage {
        /// Persisted copies to release first.
        release: Vec<Key>,
        /// Bytes of replicas held for other nodes to release, oldest first (0: none).
        replicas: u64,
        /// The ranks may prepare the spares their next save writes over (the room asked of
        /// [`Table::admit`] fits): otherwise they make none, and the next save allocates its
        /// memory as it writes.
        spares: bool,
    },
    /// It does not fit even with every persisted copy released: a direct save (the ranks wait
    /// for the disk). The warning line says why.
    Direct {
        /// One line: the save, what memory holds, the budget.
        reason: String,
    },
}

impl Table {
    /// The bytes the staging directory holds besides the copies (the ranks' spare files), as
    /// last measured: the budget counts them too.
    pub fn set_outside(&mut self, bytes: u64) {
        self.outside = bytes;
        self.kept = 0;
        self.reserved = 0;
    }

    /// Keeps `bytes` for the spares the ranks prepare after the save just admitted (granted by
    /// [`Admit::Stage::spares`]): a replica arriving before the next save does not take it.
    pub fn keep_for_spares(&mut self, bytes: u64) {
        self.kept = bytes;
    }

    /// The bytes of other nodes' replicas this node holds now.
    pub fn set_replicas(&mut self, bytes: u64) {
        self.replicas = bytes;
    }

    /// Bytes the budget holds besides the copies and the replicas: the ranks' spare files
    /// (as measured, or the room kept for them), fetched files, and the room kept for the
    /// saves being written.
    pub fn outside(&self) -> u64 {
        self.outside + self.kept + self.reserved
    }

    /// Whether a rank's save about to be written, `bytes` more than the spare it writes over,
    /// fits in memory now beside the copies not yet on disk; if so its room is kept until its
    /// step is admitted, and made now: the persisted copies to release (oldest first) and the
    /// bytes of replicas to release (oldest first), as [`Table::admit`] would. Otherwise the
    /// reason: the rank writes it straight to `--ckpt-dir`, and memory never holds more than
    /// the budget (a save admitted only once written would already be in memory).
    pub fn room(&mut self, bytes: u64) -> Result<(Vec<Key>, u64), String> {
        let pinned = self.pinned(None);
        let outside = self.outside();
        if pinned + outside + bytes > self.budget {
            return Err(format!(
                "does not fit --ckpt-memory {} now ({} not yet on disk, {} of spare files and saves being written)",
                human_bytes(self.budget),
                human_bytes(pinned),
                human_bytes(outside)
            ));
        }
        self.reserved += bytes;
        let mut used = self.held() + self.outside() + self.replicas;
        let release = self.release_until(&mut self.settled_oldest(None), &mut used, 0);
        let replicas = used.saturating_sub(self.budget);
        self.replicas -= replicas;
        Ok((release, replicas))
    }

    /// Whether a save of `bytes` for `key` stays in memory, with room for `spares` bytes more:
    /// the spares its ranks prepare for their next save (the next save writes over them, so
    /// they count in the budget from the moment they are made). The room is made by releasing
    /// this node's persisted copies, oldest first, then other nodes' replicas, oldest first;
    /// never a copy not yet on disk. Only persisted copies make room for the spares: a replica
    /// is another node's second copy, a spare only makes the next save faster.
    pub fn admit(&self, key: Key, bytes: u64, spares: u64) -> Admit {
        let pinned = self.pinned(Some(key));
        let outside = self.outside();
        if pinned + outside + bytes > self.budget {
            return Admit::Direct {
                reason: format!(
                    "checkpoint step {} ({}) does not fit --ckpt-memory {} ({} not yet on disk, {} of spare files): saving it straight to --ckpt-dir; the ranks wait for the disk for this save",
                    key.0,
                    human_bytes(bytes),
                    human_bytes(self.budget),
                    human_bytes(pinned),
                    human_bytes(outside)
                ),
            };
        }
        let mut settled = self.settled_oldest(Some(key));
        let mut used = self.held() + outside + self.replicas + bytes;
        let mut release = self.release_until(&mut settled, &mut used, 0);
        // What is still over the budget is in replicas: every other byte may go.
        let replicas = used.saturating_sub(self.budget);
        used -= replicas;
        let for_spares = self.release_until(&mut settled, &mut used, spares);
        let fits = used + spares <= self.budget;
        if fits {
            release.extend(for_spares);
        }
        Admit::Stage {
            release,
            replicas,
            spares: fits,
        }
    }

    /// Bytes of the copies not yet settled (not on disk, or their commit not answered), but
    /// `except`'s: they never make room.
    fn pinned(&self, except: Option<Key>) -> u64 {
        self.copies
            .iter()
            .filter(|(k, c)| Some(**k) != except && !Self::settled(c))
            .map(|(_, c)| c.bytes)
            .sum()
    }

    /// The settled copies but `except`'s, oldest first, with their bytes: what may make room.
    fn settled_oldest(&self, except: Option<Key>) -> impl Iterator<Item = (Key, u64)> + '_ {
        self.copies
            .iter()
            .filter(move |(k, c)| Some(**k) != except && Self::settled(c))
            .map(|(k, c)| (*k, c.bytes))
    }

    /// Takes copies from `settled` while `used` and `more` are over the budget, taking their
    /// bytes off `used`; the copies taken.
    fn release_until(
        &self,
        settled: &mut impl Iterator<Item = (Key, u64)>,
        used: &mut u64,
        more: u64,
    ) -> Vec<Key> {
        let mut out = Vec::new();
        while *used + more > self.budget {
            let Some((k, b)) = settled.next() else { break };
            *used -= b;
            out.push(k);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const MIB: u64 = 1 << 20;

    fn t0() -> Instant {
        Instant::now()
    }

    /// Staged, releasing `release`, no replica, the ranks' spares fitting.
    fn stage(release: Vec<Key>) -> Admit {
        Admit::Stage {
            release,
            replicas: 0,
            spares: true,
        }
    }

    /// A table of `budget` MiB holding these copies of `mib` MiB each, on disk and answered.
    fn settled(budget: u64, steps: &[(u64, u64)]) -> Table {
        let now = t0();
        let mut t = Table::new(budget * MIB);
        for (step, mib) in steps {
            t.add((*step, 1), mib * MIB, false, now);
            t.persisted((*step, 1), now);
            t.answered((*step, 1));
        }
        t
    }

    #[test]
    fn a_save_that_fits_stays_in_memory_releasing_persisted_copies_oldest_first() {
        let now = t0();
        let mut t = Table::new(100 * MIB);
        t.add((1, 1), 40 * MIB, false, now);
        t.add((2, 1), 40 * MIB, false, now);
        assert_eq!(t.admit((3, 1), 20 * MIB, 0), stage(vec![]));
        // Neither is on disk: a third of 40 MiB cannot go in memory.
        assert!(matches!(t.admit((3, 1), 40 * MIB, 0), Admit::Direct { .. }));
        t.start((1, 1), now);
        t.persisted((1, 1), now + Duration::from_secs(1));
        t.start((2, 1), now);
        t.persisted((2, 1), now + Duration::from_secs(2));
        assert!(
            matches!(t.admit((3, 1), 40 * MIB, 0), Admit::Direct { .. }),
            "on disk, but their commits not answered yet"
        );
        t.answered((1, 1));
        t.answered((2, 1));
        assert_eq!(
            t.admit((3, 1), 40 * MIB, 0),
            stage(vec![(1, 1)]),
            "the oldest persisted copy makes room"
        );
        assert_eq!(t.admit((3, 1), 90 * MIB, 0), stage(vec![(1, 1), (2, 1)]));
        let Admit::Direct { reason } = t.admit((3, 1), 101 * MIB, 0) else {
            panic!("larger than the budget")
        };
        assert!(
            reason.contains("does not fit --ckpt-memory 100 MiB"),
            "{reason}"
        );
    }

    #[test]
    fn the_ranks_spare_files_count_in_the_budget() {
        let now = t0();
        let mut t = Table::new(100 * MIB);
        t.add((1, 1), 40 * MIB, false, now);
        t.persisted((1, 1), now);
        t.answered((1, 1));
        assert_eq!(t.admit((2, 1), 40 * MIB, 0), stage(vec![]));
        // Two ranks' spares of 20 MiB: step 1's copy goes to make room.
        t.set_outside(40 * MIB);
        assert_eq!(t.admit((2, 1), 40 * MIB, 0), stage(vec![(1, 1)]));
        t.set_outside(70 * MIB);
        let Admit::Direct { reason } = t.admit((2, 1), 40 * MIB, 0) else {
            panic!("40 MiB beside 70 MiB of spares is more than 100 MiB")
        };
        assert!(reason.contains("70 MiB of spare files"), "{reason}");
        assert_eq!(t.report(now)["outside"], 70 * MIB);
    }

    #[test]
    fn replicas_count_in_the_budget_and_go_after_this_nodes_copies_on_disk() {
        // 100 MiB: step 1 on disk (30), replicas 40; a save of 50 needs 20 more.
        let mut t = settled(100, &[(1, 30)]);
        t.set_replicas(40 * MIB);
        assert_eq!(t.admit((2, 1), 20 * MIB, 0), stage(vec![]), "fits as is");
        assert_eq!(
            t.admit((2, 1), 50 * MIB, 0),
            stage(vec![(1, 1)]),
            "the copy on disk goes first, and that is enough"
        );
        assert_eq!(
            t.admit((2, 1), 80 * MIB, 0),
            Admit::Stage {
                release: vec![(1, 1)],
                replicas: 20 * MIB,
                spares: true,
            },
            "then 20 MiB of replicas"
        );
        // Replicas never make a save go to disk: every byte of them may go.
        assert_eq!(
            t.admit((2, 1), 100 * MIB, 0),
            Admit::Stage {
                release: vec![(1, 1)],
                replicas: 40 * MIB,
                spares: true,
            }
        );
        // A copy not yet on disk is not released for the save, replicas are.
        let now = t0();
        t.add((2, 1), 30 * MIB, false, now);
        assert_eq!(
            t.admit((3, 1), 40 * MIB, 0),
            Admit::Stage {
                release: vec![(1, 1)],
                replicas: 10 * MIB,
                spares: true,
            }
        );
    }

    #[test]
    fn the_spares_of_the_next_save_fit_beside_the_save_or_are_not_made() {
        // 100 MiB: steps 1 and 2 on disk, 30 MiB each.
        let t = settled(100, &[(1, 30), (2, 30)]);
        assert_eq!(t.admit((3, 1), 30 * MIB, 10 * MIB), stage(vec![]));
        assert_eq!(
            t.admit((3, 1), 30 * MIB, 30 * MIB),
            stage(vec![(1, 1)]),
            "a copy on disk makes room for the spares (its files become them)"
        );
        assert_eq!(
            t.admit((3, 1), 30 * MIB, 71 * MIB),
            Admit::Stage {
                release: vec![],
                replicas: 0,
                spares: false,
            },
            "no room for the spares even with every copy on disk gone: none is released for them"
        );
        // Replicas are not released for spares.
        let mut t = settled(100, &[(1, 30)]);
        t.set_replicas(40 * MIB);
        assert_eq!(
            t.admit((2, 1), 30 * MIB, 31 * MIB),
            Admit::Stage {
                release: vec![],
                replicas: 0,
                spares: false,
            }
        );
        assert_eq!(t.admit((2, 1), 20 * MIB, 40 * MIB), stage(vec![(1, 1)]));
        // The room kept for them counts until the next save measures the spares.
        let mut t = settled(100, &[]);
        t.keep_for_spares(60 * MIB);
        assert_eq!(t.outside(), 60 * MIB);
        assert!(matches!(t.admit((1, 1), 50 * MIB, 0), Admit::Direct { .. }));
        t.set_outside(20 * MIB);
        assert_eq!(t.outside(), 20 * MIB, "measured: what the ranks took");
        assert_eq!(t.admit((1, 1), 50 * MIB, 30 * MIB), stage(vec![]));
    }

    #[test]
    fn a_save_about_to_be_written_gets_room_beside_the_copies_not_yet_on_disk_or_goes_to_disk() {
        let now = t0();
        let mut t = settled(100, &[(1, 40)]);
        t.add((2, 1), 40 * MIB, false, now);
        t.set_replicas(10 * MIB);
        // Step 1 (on disk) and the replicas may go: 60 MiB for the saves, made as they are
        // asked for.
        assert_eq!(t.room(10 * MIB), Ok((vec![], 0)), "fits as is");
        assert_eq!(t.room(20 * MIB), Ok((vec![(1, 1)], 0)), "step 1 goes");
        t.release((1, 1));
        assert_eq!(
            t.room(30 * MIB),
            Ok((vec![], 10 * MIB)),
            "then the replicas"
        );
        let e = t.room(MIB).unwrap_err();
        assert!(
            e.contains("does not fit --ckpt-memory 100 MiB now (40 MiB not yet on disk, 60 MiB of spare files and saves being written)"),
            "{e}"
        );
        assert!(
            matches!(t.admit((3, 1), 61 * MIB, 0), Admit::Direct { .. }),
            "the room kept counts until the step is admitted"
        );
        // The step arrives: what it took is measured, and its own bytes are admitted.
        t.set_outside(0);
        t.set_replicas(0);
        assert_eq!(t.admit((3, 1), 60 * MIB, 0), stage(vec![]));
    }
}
