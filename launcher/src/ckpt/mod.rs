//! The agent's side of the checkpoint ledger (`docs/architecture.md` §4): the
//! local worker API, batching of the node's ranks, verification of the resume point, manifest
//! files next to the checkpoints.
//!
//! # Theory of operation
//!
//! * [`api`] listens on a Unix socket (mode 0600, path in `DRUN_AGENT_SOCK`) for newline-delimited
//!   JSON requests of the workers: `commit`, `resume`, `progress`, `should_save`.
//! * [`node`] batches the commits of this node's ranks per step: once every local rank has
//!   reported step `s` with the same cursor, one [`drun_rendezvous::NodeCommit`] goes to the
//!   rendezvous, which seals the step when every node has reported it.
//! * [`verify`] checks a manifest's files (size or digest: [`digest`]) before workers resume
//!   from it.
//! * [`fallback`] remembers a checkpoint that failed verification next to its manifest file,
//!   and finds the run's newest usable manifest when `latest` cannot be used.
//! * [`memory`] stages checkpoints in memory and persists them behind the training
//!   (`--ckpt-memory`): its module doc holds the design and the crash-consistency argument.
//! * [`resume`] is what the agent calls about the resume point: the hint a joining node offers
//!   (its own `latest`, or the adopted `--ckpt-resume-from` checkpoint) and the check of the
//!   plan's resume point ([`resume::Verdict`]).
//! * Every problem is a [`CkptError`] naming the file, rank, step or generation.
//! * This module writes the manifest file next to the checkpoint, the atomically replaced
//!   `latest` pointer in `--ckpt-dir`, and reads that pointer back when the store knows no
//!   checkpoint (a fresh etcd, a requeued job on the embedded store).

pub mod api;
pub mod digest;
mod error;
pub mod fallback;
pub mod inspect;
pub mod memory;
pub mod node;
pub mod resume;
pub mod verify;

pub use error::CkptError;

use std::io::Write;
use std::path::{Path, PathBuf};

use drun_rendezvous::{Manifest, Retention};

/// How the resume point is verified before workers start (`--ckpt-verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum VerifyMode {
    /// Every file exists with the recorded size (one `stat` per file).
    #[default]
    Size,
    /// Size and digest of every file (reads every byte, files hashed in parallel, each with the
    /// function its manifest names).
    Digest,
    /// No check.
    None,
}

/// What a node arriving while the group runs below MAX nodes does (`--on-scale-up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnScaleUp {
    /// Re-form at once (torchrun's behaviour): work since the last checkpoint is repeated.
    #[default]
    Now,
    /// Ask every rank for a coordinated checkpoint first; re-form once it is sealed (or after
    /// `--scale-up-save-timeout` without one).
    Checkpoint,
}

/// Checkpoint settings of a launch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CkptConfig {
    /// `--ckpt-dir`, absolute: exported as `DRUN_CKPT_DIR`; holds the `latest` pointer file.
    pub dir: Option<PathBuf>,
    /// `--ckpt-verify`.
    pub verify: VerifyMode,
    /// `--ckpt-keep-last`, `--ckpt-keep-every`.
    pub retention: Retention,
    /// `--on-scale-up checkpoint`: the longest wait for the coordinated checkpoint before a
    /// newcomer is admitted (`--scale-up-save-timeout`); `None`: admit at once.
    pub scale_up_save: Option<std::time::Duration>,
    /// `--ckpt-resume-from`: the manifest file of another run's checkpoint (absolute) this run
    /// starts from while it has no checkpoint of its own.
    pub resume_from: Option<PathBuf>,
    /// `--ckpt-interval`, `--expected-mtbf`.
    pub interval: drun_rendezvous::decisions::ckpt_interval::IntervalConfig,
    /// `--ckpt-memory`: the node's budget for checkpoints staged in memory, bytes; `None`: off
    /// (or no `--ckpt-dir`).
    pub memory: Option<u64>,
    /// `--ckpt-replicas`: copies of each node's staged checkpoints kept on another node (0 or
    /// 1; 0 whenever `memory` is off).
    pub replicas: u8,
}

/// Name of the pointer file in `--ckpt-dir`: one line, the path of the newest manifest file.
pub const LATEST_FILE: &str = "latest";

/// Where the manifest file of `m` lives: next to its files. A checkpoint of no files (every
/// rank committed `[]`: a job that keeps its state elsewhere and lets drun keep the cursor) has
/// no files to sit next to: its manifest goes in the run's own directory of `--ckpt-dir` `dir`,
/// and nowhere without one (`None`).
pub fn manifest_path(m: &Manifest, dir: Option<&Path>) -> Option<PathBuf> {
    if m.files.is_empty() {
        dir.and_then(|d| run_pointer_dir(d, &m.run_id))
            .map(|r| r.join(m.file_name()))
    } else {
        Some(m.dir().join(m.file_name()))
    }
}

/// The directory a resuming rank finds checkpoint `m` in (`DRUN_RESUME_PATH`): where its files
/// are, or for a checkpoint of no files where its manifest is (`manifest`), if anywhere.
pub fn resume_dir(m: &Manifest, manifest: Option<&Path>) -> Option<PathBuf> {
    if m.files.is_empty() {
        manifest.and_then(Path::parent).map(Path::to_path_buf)
    } else {
        Some(m.dir())
    }
}

/// Writes `bytes` to `path` atomically: temporary file in the same directory, fsync, rename,
/// fsync of the directory.
///
/// # Errors
/// I/O errors of any of those steps.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Where run `run`'s own `latest` pointer lives inside `--ckpt-dir` `dir`: `<dir>/<run>/` (the
/// directory `drun.shard_path()` writes the run's files under). `None` for a run id that is not
/// a plain file name (`/`, `.`, `..`, empty).
pub fn run_pointer_dir(dir: &Path, run: &str) -> Option<PathBuf> {
    let plain = !run.is_empty() && run != "." && run != ".." && !run.contains('/');
    plain.then(|| dir.join(run))
}

/// Writes (atomically replaces) the manifest file of `m` where [`manifest_path`] says and, when
/// `dir` is set and `pointers`, points `<dir>/latest` and this run's `<dir>/<run>/latest` at it
/// — unless the pointer names a newer checkpoint of the same run. Pointers hold the manifest's
/// path relative to their directory when it lies inside it (so a moved or copied directory
/// still resolves). Returns the manifest file's path.
///
/// # Errors
/// One line naming the file that could not be written, or saying that a checkpoint of no files
/// without `--ckpt-dir` has no place for one (the caller logs it: the ledger in the store stays
/// authoritative).
pub fn publish(m: &Manifest, dir: Option<&Path>, pointers: bool) -> Result<PathBuf, CkptError> {
    let Some(path) = manifest_path(m, dir) else {
        return Err(CkptError::WriteManifest {
            path: PathBuf::from(m.file_name()),
            source: std::io::Error::other(
                "a checkpoint of no files has no directory without --ckpt-dir; only the store's ledger holds it",
            ),
        });
    };
    if m.files.is_empty() {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| CkptError::WriteManifest {
                path: path.clone(),
                source,
            })?;
        }
    }
    let same = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Manifest>(&b).ok())
        .is_some_and(|old| old == *m);
    if !same {
        write_atomic(
            &path,
            &serde_json::to_vec_pretty(m).expect("Manifest serializes"),
        )
        .map_err(|source| CkptError::WriteManifest {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(d) = dir.filter(|_| pointers) {
        let own = run_pointer_dir(d, &m.run_id).filter(|r| path.starts_with(r));
        for pointer_dir in std::iter::once(d.to_path_buf()).chain(own) {
            // A pointer at a checkpoint that failed verification moves on to any newer save
            // (a relaunch on a fresh store numbers its generations from 1 again).
            let newer = match read_latest(&pointer_dir) {
                Some(cur) if cur.run_id == m.run_id && !fallback::is_marked_bad(&cur, dir) => {
                    (cur.step, cur.generation) <= (m.step, m.generation)
                }
                _ => true,
            };
            if newer {
                let pointer = pointer_dir.join(LATEST_FILE);
                let target = path.strip_prefix(&pointer_dir).unwrap_or(&path);
                write_atomic(&pointer, format!("{}\n", target.display()).as_bytes()).map_err(
                    |source| CkptError::WritePointer {
                        path: pointer.clone(),
                        source,
                    },
                )?;
            }
        }
    }
    Ok(path)
}

/// A checkpoint directory that was moved or copied: the files of manifest `m`, read from the
/// manifest file `file`, are where that file is now, at the same places relative to it. The
/// manifest records absolute paths; they are rewritten when every file is found at its new
/// place (else they stay, and the check of the files names the first one missing).
pub fn relocate(m: &mut Manifest, file: &Path) {
    let recorded = m.dir();
    let here = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let same = |a: &Path, b: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if m.files.is_empty() || same(&recorded, &here) {
        return;
    }
    let moved: Option<Vec<String>> = m
        .files
        .iter()
        .map(|f| {
            let rel = Path::new(&f.path).strip_prefix(&recorded).ok()?;
            let p = here.join(rel);
            p.exists().then(|| p.display().to_string())
        })
        .collect();
    if let Some(paths) = moved {
        for (f, p) in m.files.iter_mut().zip(paths) {
            f.path = p;
        }
    }
}

/// The manifest `<dir>/latest` points at, if it exists and decodes (its files where the
/// manifest file is now: [`relocate`]).
pub fn read_latest(dir: &Path) -> Option<Manifest> {
    let pointer = std::fs::read_to_string(dir.join(LATEST_FILE)).ok()?;
    let path = PathBuf::from(pointer.trim());
    let path = if path.is_absolute() {
        path
    } else {
        dir.join(path)
    };
    let bytes = std::fs::read(&path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(mut m) => {
            relocate(&mut m, &path);
            Some(m)
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an undecodable manifest file");
            None
        }
    }
}

/// Reads the checkpoint `--ckpt-resume-from PATH` names: a manifest file
/// (`drun-manifest-<step>-<generation>.json`), or a directory whose `latest` pointer names one
/// (the earlier run's `--ckpt-dir`). Returns the manifest file's path and the manifest; checks
/// that every file it lists exists with its recorded size in bytes (one `stat` each).
///
/// # Errors
/// One line saying what is missing or wrong (no manifest, undecodable, nothing saved, a file
/// missing or of another size).
pub fn read_adoptable(path: &Path) -> Result<(PathBuf, Manifest), CkptError> {
    let file = if path.is_dir() {
        let pointer = path.join(LATEST_FILE);
        let line = std::fs::read_to_string(&pointer).map_err(|source| CkptError::NoPointer {
            dir: path.to_path_buf(),
            source,
        })?;
        let p = PathBuf::from(line.trim());
        if p.is_absolute() {
            p
        } else {
            path.join(p)
        }
    } else {
        path.to_path_buf()
    };
    let bytes = std::fs::read(&file).map_err(|source| CkptError::ReadManifest {
        path: file.clone(),
        source,
    })?;
    let mut m: Manifest =
        serde_json::from_slice(&bytes).map_err(|source| CkptError::NotManifest {
            path: file.clone(),
            source,
        })?;
    if m.files.is_empty() {
        return Err(CkptError::NoFiles { path: file });
    }
    relocate(&mut m, &file);
    for f in &m.files {
        let len = std::fs::metadata(&f.path)
            .map_err(|source| CkptError::Unreadable {
                path: f.path.clone(),
                rank: f.rank,
                step: Some(m.step),
                source,
            })?
            .len();
        if len != f.bytes {
            return Err(CkptError::Size {
                path: f.path.clone(),
                rank: f.rank,
                step: Some(m.step),
                found: len,
                expected: f.bytes,
            });
        }
    }
    Ok((file, m))
}

/// Deletes what retention dropped: `garbage` files, the manifest files of `dropped`, and the
/// directories that become empty — only inside `root` (`--ckpt-dir`), never `root` itself.
/// Errors are logged, never fatal.
pub fn remove_garbage(root: &Path, garbage: &[String], dropped: &[Manifest]) {
    let mut dirs = Vec::new();
    let files = garbage.iter().map(PathBuf::from).chain(
        dropped
            .iter()
            .filter_map(|m| manifest_path(m, Some(root)))
            .flat_map(|f| [fallback::mark_path(&f), f]),
    );
    for f in files {
        if !f.starts_with(root) || f == root {
            tracing::debug!(path = %f.display(), "not deleting a file outside --ckpt-dir");
            continue;
        }
        match std::fs::remove_file(&f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %f.display(), error = %e, "cannot remove an old checkpoint file")
            }
        }
        if let Some(p) = f.parent().filter(|p| p.starts_with(root) && *p != root) {
            dirs.push(p.to_path_buf());
        }
    }
    dirs.sort();
    dirs.dedup();
    for d in dirs.into_iter().rev() {
        let _ = std::fs::remove_dir(d); // only succeeds when empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::{Cursor, ShardFile};

    fn manifest(dir: &Path, step: u64) -> Manifest {
        Manifest {
            run_id: "r".into(),
            step,
            generation: 1,
            world_size: 1,
            cursor: Cursor::default(),
            files: vec![ShardFile {
                rank: 0,
                path: dir
                    .join(format!("step-{step}/rank0.bin"))
                    .display()
                    .to_string(),
                bytes: 3,
                digest: String::new(),
            }],
            sealed_at_ms: 0,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        }
    }

    #[test]
    fn publish_points_latest_forward_only() {
        let d = tempfile::tempdir().unwrap();
        for s in [4, 8] {
            std::fs::create_dir_all(d.path().join(format!("step-{s}"))).unwrap();
        }
        publish(&manifest(d.path(), 8), Some(d.path()), true).unwrap();
        publish(&manifest(d.path(), 4), Some(d.path()), true).unwrap();
        assert_eq!(read_latest(d.path()).unwrap().step, 8);
        assert!(d.path().join("step-4/drun-manifest-4-1.json").exists());
        let outside = tempfile::tempdir().unwrap();
        let precious = outside.path().join("dataset.bin");
        std::fs::write(&precious, b"data").unwrap();
        remove_garbage(
            d.path(),
            &[
                d.path().join("step-4/rank0.bin").display().to_string(),
                precious.display().to_string(),
            ],
            &[manifest(d.path(), 4)],
        );
        assert!(!d.path().join("step-4").exists(), "emptied dir removed");
        assert!(precious.exists(), "nothing outside --ckpt-dir is deleted");
        assert!(d.path().exists());
    }

    #[test]
    fn a_checkpoint_of_no_files_lives_in_the_runs_directory_never_at_the_root() {
        let d = tempfile::tempdir().unwrap();
        let mut m = manifest(d.path(), 5);
        m.files.clear();
        let file = publish(&m, Some(d.path()), true).unwrap();
        assert_eq!(file, d.path().join("r/drun-manifest-5-1.json"));
        assert!(file.exists());
        assert!(!Path::new("/drun-manifest-5-1.json").exists());
        // Both pointers name it relative to their directory.
        let own = std::fs::read_to_string(d.path().join("r/latest")).unwrap();
        assert_eq!(own.trim(), "drun-manifest-5-1.json");
        let top = std::fs::read_to_string(d.path().join("latest")).unwrap();
        assert_eq!(top.trim(), "r/drun-manifest-5-1.json");
        assert_eq!(read_latest(d.path()).unwrap().step, 5);
        assert_eq!(resume_dir(&m, Some(&file)), Some(d.path().join("r")));
        // Without --ckpt-dir there is no place for it: an error, nothing written.
        let e = publish(&m, None, false).unwrap_err().to_string();
        assert!(e.contains("no directory without --ckpt-dir"), "{e}");
        // Retention removes it from the run's directory.
        remove_garbage(d.path(), &[], &[m]);
        assert!(!file.exists());
    }

    #[test]
    fn a_moved_directory_is_read_where_it_is_now() {
        let d = tempfile::tempdir().unwrap();
        let old = d.path().join("ck");
        std::fs::create_dir_all(old.join("step-8")).unwrap();
        std::fs::write(old.join("step-8/rank0.bin"), b"abc").unwrap();
        publish(&manifest(&old, 8), Some(&old), true).unwrap();
        let moved = d.path().join("moved");
        std::fs::rename(&old, &moved).unwrap();
        let want = moved.join("step-8/rank0.bin").display().to_string();
        assert_eq!(read_latest(&moved).unwrap().files[0].path, want);
        // A file missing at the new place: the recorded paths stay (the check names it).
        std::fs::remove_file(moved.join("step-8/rank0.bin")).unwrap();
        let recorded = old.join("step-8/rank0.bin").display().to_string();
        assert_eq!(read_latest(&moved).unwrap().files[0].path, recorded);
    }
}
