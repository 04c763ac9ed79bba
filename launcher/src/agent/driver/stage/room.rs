//! The budget's room for what the ranks write (`--ckpt-memory`): a staged save admitted with
//! room for the spares its ranks prepare next, and the room a rank asks before it writes a
//! save, so that memory never holds more than the budget (a save admitted only once written
//! would already be in memory).

use std::collections::BTreeMap;

use super::{Key, Stage};
use crate::ckpt::memory::decide::Admit;
use crate::ckpt::memory::human_bytes;
use crate::ckpt::memory::spare::{spare_room, SPARE_PREFIX};
use crate::ckpt::node::NodeLedger;

impl Stage {
    /// The ranks' spare files in the staging directory (`.spare-rank<R>`, allocated ahead by
    /// each rank for its next save): rank → bytes, as much as the kernel allocated so far.
    pub(super) fn spares(&self) -> BTreeMap<u32, u64> {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir(self.dir())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let rank = e
                            .file_name()
                            .to_str()?
                            .strip_prefix(SPARE_PREFIX)?
                            .parse()
                            .ok()?;
                        let m = e.metadata().ok()?;
                        Some((rank, m.len().max(m.blocks() * 512)))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Admits this node's staged save of `key` (each file's rank and bytes) to the budget, with
    /// room for the spares its ranks prepare next ([`crate::ckpt::memory::decide::Table::admit`]): the copies on disk and
    /// the replicas to release for it go, and its ranks are answered at once (told whether to
    /// make spares). `false`: it does not fit, one line says so, and it goes to disk while the
    /// ranks wait for their answer.
    pub(super) fn admit(
        &mut self,
        key: Key,
        by_rank: &[(u32, u64)],
        ledger: &mut NodeLedger,
    ) -> bool {
        let bytes = by_rank.iter().map(|(_, b)| b).sum();
        let spares = self.spares();
        self.table
            .set_outside(spares.values().sum::<u64>() + self.fetched_bytes());
        self.table.set_replicas(self.replica_bytes());
        let rooms = spare_room(by_rank, &spares);
        let room = rooms.values().sum();
        match self.table.admit(key, bytes, room) {
            Admit::Stage {
                release,
                replicas,
                spares: fits,
            } => {
                if let (Some(r), true) = (&self.replicas, replicas > 0) {
                    r.free(replicas);
                }
                for k in release {
                    if fits {
                        self.release(k);
                    } else {
                        self.release_as(k, Err("no room for the ranks' spares"));
                    }
                }
                self.table.keep_for_spares(if fits { room } else { 0 });
                self.granted = if fits { rooms } else { BTreeMap::new() };
                ledger.answer_staged(key.0, fits);
                true
            }
            Admit::Direct { reason } => {
                crate::say!("drun: warning: {reason}");
                ledger.no_spares(key.0);
                self.granted.clear();
                false
            }
        }
    }

    /// Once the replicas released for a save's room ended arriving (their bytes so far
    /// removed): the rank writes its save after that. `None` when none is arriving.
    pub(in crate::agent::driver) fn room_made(
        &self,
    ) -> Option<impl std::future::Future<Output = ()>> {
        self.replicas.as_ref()?.until_settled()
    }

    /// Whether rank `rank`'s save of about `bytes` (its last one's size), about to be
    /// written, stays in memory: the part beyond the spare it writes over must fit now beside
    /// the copies not yet on disk ([`crate::ckpt::memory::decide::Table::room`]), and is kept
    /// for it until its step is admitted. Otherwise one line, once until a save finds room
    /// again, and the rank writes it straight to `--ckpt-dir`.
    pub(in crate::agent::driver) fn room(&mut self, rank: u32, bytes: u64) -> bool {
        let spare = self
            .granted
            .get(&rank)
            .copied()
            .unwrap_or(0)
            .max(self.spares().get(&rank).copied().unwrap_or(0));
        self.table.set_replicas(self.replica_bytes());
        match self.table.room(bytes.saturating_sub(spare)) {
            Ok((release, replicas)) => {
                if let (Some(r), true) = (&self.replicas, replicas > 0) {
                    r.free(replicas);
                }
                for k in release {
                    self.free_now(k, "its room is wanted for a save");
                }
                self.room_said = false;
                self.sync_own();
                true
            }
            Err(why) => {
                if !std::mem::replace(&mut self.room_said, true) {
                    crate::say!(
                        "drun: warning: rank {rank}'s next checkpoint save (about {}, as its last) {why}: it goes straight to --ckpt-dir, and the rank waits for the disk for it; saves stay in memory again once the persister caught up (a larger --ckpt-memory keeps more)",
                        human_bytes(bytes)
                    );
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_rank_writing_over_its_spare_needs_room_only_for_what_goes_beyond_it() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let (mut s, _done) = Stage::open_in(shm.path(), 10 * MIB, ckpt.path()).unwrap();
        // Rank 0 has a spare of 6 MiB, rank 1 none.
        std::fs::write(s.dir().join(".spare-rank0"), vec![0u8; 6 << 20]).unwrap();
        assert_eq!(s.spares(), BTreeMap::from([(0, 6 * MIB)]));
        s.table.set_outside(6 * MIB);
        assert!(s.room(0, 8 * MIB), "2 MiB beyond its spare");
        assert!(!s.room(1, 3 * MIB), "6 + 2 + 3 is more than 10 MiB");
        assert!(s.room(1, 2 * MIB));
        assert!(!s.room(1, MIB), "the room kept counts");
        // A rank granted a spare it has not made yet writes over it too: its room is kept.
        std::fs::remove_file(s.dir().join(".spare-rank0")).unwrap();
        s.table.set_outside(0);
        s.table.keep_for_spares(9 * MIB);
        s.granted = BTreeMap::from([(2, 9 * MIB)]);
        assert!(s.room(2, 9 * MIB));
        assert!(
            !s.room(3, 2 * MIB),
            "beside the 9 MiB kept for rank 2's spare"
        );
        assert!(s.room(3, MIB));
    }
}
