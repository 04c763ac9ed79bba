//! Checkpoints that failed verification, remembered on disk, and the fallback a node offers
//! when its `latest` cannot be used.
//!
//! A checkpoint of this run that fails verification is marked bad in the store (the ledger then
//! falls back to the previous sealed one), and here also next to its manifest file: a
//! `<manifest>.bad` file holding the reason. The mark outlives the store: a relaunch on a fresh
//! store (standalone, c10d, a requeued Slurm job) that finds `latest` pointing at a marked, a
//! missing or an undecodable manifest offers the newest unmarked manifest of the run's own
//! directory instead (`<ckpt-dir>/<run>/`, where `drun.shard_path()` puts checkpoints), so the
//! run resumes from the previous checkpoint rather than from step 0.

use std::path::{Path, PathBuf};

use drun_rendezvous::Manifest;

use super::{manifest_path, run_pointer_dir};

/// Suffix of the mark of a checkpoint that failed verification, next to its manifest file.
pub const BAD_SUFFIX: &str = ".bad";

/// The mark file of manifest file `manifest`.
pub fn mark_path(manifest: &Path) -> PathBuf {
    let mut name = manifest.as_os_str().to_owned();
    name.push(BAD_SUFFIX);
    PathBuf::from(name)
}

/// Marks `m` bad next to its manifest file (`dir`: `--ckpt-dir`), with `reason` (one line).
/// A mark that cannot be written is logged: the store's mark still holds for this launch.
pub fn mark_bad(m: &Manifest, dir: Option<&Path>, reason: &str) {
    let Some(file) = manifest_path(m, dir) else {
        return;
    };
    let mark = mark_path(&file);
    if let Err(e) = super::write_atomic(&mark, format!("{reason}\n").as_bytes()) {
        tracing::warn!(path = %mark.display(), error = %e, "cannot mark the checkpoint bad on disk");
    }
}

/// Whether `m` was marked bad on disk.
pub fn is_marked_bad(m: &Manifest, dir: Option<&Path>) -> bool {
    manifest_path(m, dir).is_some_and(|f| mark_path(&f).exists())
}

/// The newest manifest of run `run` in `<dir>/<run>/` (its own files, one directory level
/// down) that decodes, belongs to the run and is not marked bad; newest by (step, generation).
pub fn newest_usable(dir: &Path, run: &str) -> Option<Manifest> {
    let root = run_pointer_dir(dir, run)?;
    candidates(&root)
        .into_iter()
        .filter(|f| !mark_path(f).exists())
        .filter_map(|f| {
            let mut m = serde_json::from_slice::<Manifest>(&std::fs::read(&f).ok()?).ok()?;
            super::relocate(&mut m, &f);
            Some(m)
        })
        .filter(|m| m.run_id == run)
        .max_by_key(|m| (m.step, m.generation))
}

/// Manifest files (`drun-manifest-*.json`) in `root` and in its subdirectories.
fn candidates(root: &Path) -> Vec<PathBuf> {
    let is_manifest = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("drun-manifest-") && n.ends_with(".json"))
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            for f in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                if is_manifest(&f.path()) {
                    out.push(f.path());
                }
            }
        } else if is_manifest(&p) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::{Cursor, ShardFile};

    fn saved(dir: &Path, run: &str, step: u64, generation: u64) -> Manifest {
        let d = dir.join(run).join(format!("step-{step}-g{generation}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("rank0.pt"), b"abc").unwrap();
        let m = Manifest {
            run_id: run.into(),
            step,
            generation,
            world_size: 1,
            cursor: Cursor::default(),
            files: vec![ShardFile {
                rank: 0,
                path: d.join("rank0.pt").display().to_string(),
                bytes: 3,
                digest: String::new(),
            }],
            sealed_at_ms: 0,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        };
        super::super::publish(&m, Some(dir), true).unwrap();
        m
    }

    #[test]
    fn a_marked_checkpoint_is_skipped_for_the_newest_unmarked_one_of_the_run() {
        let d = tempfile::tempdir().unwrap();
        saved(d.path(), "r", 10, 1);
        let s20 = saved(d.path(), "r", 20, 1);
        let s30 = saved(d.path(), "r", 30, 2);
        saved(d.path(), "other", 40, 1);
        assert_eq!(newest_usable(d.path(), "r").unwrap().step, 30);
        assert!(!is_marked_bad(&s30, Some(d.path())));
        mark_bad(
            &s30,
            Some(d.path()),
            "rank0.pt has 1 bytes, the manifest says 3",
        );
        assert!(is_marked_bad(&s30, Some(d.path())));
        assert_eq!(newest_usable(d.path(), "r").unwrap().step, 20);
        // An undecodable manifest is passed over too.
        let f20 = manifest_path(&s20, Some(d.path())).unwrap();
        std::fs::write(&f20, "{\"broken\":").unwrap();
        assert_eq!(newest_usable(d.path(), "r").unwrap().step, 10);
        assert_eq!(newest_usable(d.path(), "none"), None);
    }

    #[test]
    fn a_moved_directorys_checkpoints_are_read_and_marked_where_they_are_now() {
        let d = tempfile::tempdir().unwrap();
        let old = d.path().join("ck");
        saved(&old, "r", 10, 1);
        saved(&old, "r", 20, 1);
        let moved = d.path().join("moved");
        std::fs::rename(&old, &moved).unwrap();
        let m = newest_usable(&moved, "r").unwrap();
        assert_eq!(m.step, 20);
        assert!(
            m.files[0].path.starts_with(&*moved.to_string_lossy()),
            "{m:?}"
        );
        mark_bad(&m, Some(&moved), "differs");
        assert!(is_marked_bad(&m, Some(&moved)));
        assert!(!old.exists(), "nothing is written where the directory was");
        assert_eq!(newest_usable(&moved, "r").unwrap().step, 10);
    }
}
