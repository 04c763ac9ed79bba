//! The stage's side of spares from released copies ([`crate::ckpt::memory::spare`]): whether a
//! released copy's files may be reused, and renaming each rank's to its spare name.

use std::collections::BTreeSet;
use std::path::Path;

use drun_rendezvous::HeldStep;

use super::{Key, Stage};
use crate::ckpt::memory::spare::{fates, spare_name, Fate, Released, SPARE_PREFIX};
use crate::ckpt::memory::staged_path;

impl Stage {
    /// Whether `key`'s files may become spares once it is released: on disk (the persister is
    /// done with them), no replica of it on its way, of the generation this node runs.
    pub(super) fn reusable(&self, key: Key) -> Result<(), &'static str> {
        let persisted = self
            .table
            .copies()
            .any(|(k, c)| *k == key && c.state.is_persisted());
        if !persisted {
            return Err("not on disk");
        }
        if key.1 != self.followed {
            return Err("saved by an earlier generation");
        }
        if let Some(r) = &self.replicas {
            if r.sent_state(key) == Some(None) {
                return Err("its replica is being sent");
            }
        }
        Ok(())
    }

    /// Renames each rank's largest file of `held` (a released own copy: its files, ranks and
    /// sizes) to that rank's spare, where [`fates`] says so; the rest is left for the caller to
    /// remove. A spare that appeared meanwhile is never replaced.
    pub(super) fn recycle(&self, held: &HeldStep, reusable: Result<(), &'static str>) {
        let released: Vec<Released> = held
            .files
            .iter()
            .filter_map(|f| {
                Some(Released {
                    staged: staged_path(self.dir(), &self.ckpt_dir, Path::new(&f.path))?,
                    rank: f.rank,
                    bytes: f.bytes,
                })
            })
            .collect();
        if released.is_empty() {
            return;
        }
        let spares: BTreeSet<u32> = std::fs::read_dir(self.dir())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_prefix(SPARE_PREFIX)?
                            .parse()
                            .ok()
                    })
                    .collect()
            })
            .unwrap_or_default();
        let free = crate::ckpt::memory::free_bytes(self.dir()).unwrap_or(0);
        for (f, fate) in released
            .iter()
            .zip(fates(&released, reusable, &spares, free))
        {
            match fate {
                Fate::Spare { rank } => {
                    let to = self.dir().join(spare_name(rank));
                    match rename_noreplace(&f.staged, &to) {
                        Ok(()) => tracing::debug!(
                            rank,
                            bytes = f.bytes,
                            "a released checkpoint file is rank {rank}'s spare"
                        ),
                        Err(e) => {
                            tracing::debug!(rank, "a released file is not a spare: {e}")
                        }
                    }
                }
                Fate::Remove { why } => {
                    tracing::trace!(file = %f.staged.display(), "a released file is removed: {why}")
                }
            }
        }
    }
}

/// Renames `from` to `to` unless `to` exists (`renameat2` with `RENAME_NOREPLACE`).
fn rename_noreplace(from: &Path, to: &Path) -> nix::Result<()> {
    nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        from,
        nix::fcntl::AT_FDCWD,
        to,
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ckpt::memory::decide::CopyState;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;

    /// A stage with `key`'s copy of rank 0's and rank 1's files staged (of `bytes` each),
    /// persisted or not.
    fn stage_with(
        shm: &std::path::Path,
        ckpt: &std::path::Path,
        key: Key,
        bytes: usize,
        persisted: bool,
    ) -> (Stage, Vec<PathBuf>) {
        let (mut s, _done) = Stage::open_in(shm, 1 << 30, ckpt).expect("a stage");
        s.followed = key.1;
        let mut files = Vec::new();
        let mut held = HeldStep {
            step: key.0,
            generation: key.1,
            saved_by: "node".into(),
            world_size: Some(2),
            cursor: None,
            files: Vec::new(),
            staged_at_ms: None,
        };
        for rank in 0..2u32 {
            let rel = format!("step-{}/rank{rank}.pt", key.0);
            let p = s.dir().join(&rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![rank as u8 + 1; bytes]).unwrap();
            held.files.push(drun_rendezvous::ShardFile {
                rank,
                path: ckpt.join(&rel).display().to_string(),
                bytes: bytes as u64,
                digest: String::new(),
            });
            files.push(p);
        }
        s.files.insert(key, files.clone());
        s.own_held.insert(key, held);
        s.table
            .add(key, 2 * bytes as u64, false, std::time::Instant::now());
        if persisted {
            s.table.persisted(key, std::time::Instant::now());
        }
        (s, files)
    }

    fn gone_within_seconds(p: &std::path::Path) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if !p.exists() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn a_released_copy_on_disk_becomes_its_ranks_spares_with_its_pages() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let (mut s, files) = stage_with(shm.path(), ckpt.path(), (6, 1), 8192, true);
        let inode = std::fs::metadata(&files[1]).unwrap().ino();
        // Rank 0 has a spare already: it keeps it, and its file of the step is removed.
        let own = s.dir().join(spare_name(0));
        std::fs::write(&own, b"rank 0's own spare").unwrap();
        s.release((6, 1));
        let spare = s.dir().join(spare_name(1));
        assert_eq!(
            std::fs::metadata(&spare).unwrap().ino(),
            inode,
            "rank 1's file is its spare, the same pages"
        );
        assert_eq!(std::fs::read(&own).unwrap(), b"rank 0's own spare");
        assert!(gone_within_seconds(&files[0]), "rank 0's file removed");
        assert!(
            gone_within_seconds(files[0].parent().unwrap()),
            "the step's directory removed once empty"
        );
        assert!(s.own_held.is_empty(), "nothing of the step is remembered");
    }

    #[test]
    fn a_copy_not_on_disk_or_of_an_earlier_generation_is_removed_not_reused() {
        for (persisted, followed) in [(false, 1), (true, 2)] {
            let shm = tempfile::tempdir().unwrap();
            let ckpt = tempfile::tempdir().unwrap();
            let (mut s, files) = stage_with(shm.path(), ckpt.path(), (6, 1), 4096, persisted);
            s.followed = followed;
            let why = s.reusable((6, 1));
            assert!(why.is_err(), "persisted {persisted}, generation {followed}");
            s.release((6, 1));
            for f in &files {
                assert!(gone_within_seconds(f), "{} removed", f.display());
            }
            for rank in 0..2 {
                assert!(!s.dir().join(spare_name(rank)).exists(), "{why:?}");
            }
        }
    }

    #[test]
    fn a_copy_whose_room_is_wanted_for_a_replica_frees_its_pages() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let (mut s, files) = stage_with(shm.path(), ckpt.path(), (6, 1), 4096, true);
        assert!(matches!(
            s.table.copies().next().map(|(_, c)| c.state),
            Some(CopyState::Persisted { .. })
        ));
        s.release_as((6, 1), Err("its room is wanted for a replica"));
        for f in &files {
            assert!(gone_within_seconds(f));
        }
        assert!(!s.dir().join(spare_name(0)).exists());
    }
}
