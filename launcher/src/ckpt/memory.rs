//! Checkpoints staged in memory and persisted behind the training (`--ckpt-memory`, issue 35).
//!
//! # Design
//!
//! **Where staged files live.** With `--ckpt-memory SIZE|auto` and `--ckpt-dir DIR`, the agent
//! creates one private (0700) directory on the node's tmpfs, `/dev/shm/drun-stage-<owner>-<random>/`
//! (or under `DRUN_CKPT_STAGE_PARENT` when set), and exports it to its workers as
//! `DRUN_CKPT_STAGE_DIR`. A staged file mirrors its final place: the file a rank would write at
//! `DIR/<run>/step-<s>-g<g>/rank<r>.pt` is written at
//! `/dev/shm/drun-stage-*/<run>/step-<s>-g<g>/rank<r>.pt` ([`staged_path`]). The directory is
//! the agent's own: it is removed when the agent exits (however it exits short of SIGKILL; a
//! SIGKILLed agent's, named with its owner, is removed by the next agent on the tmpfs:
//! [`leftover::sweep_stages`]); no other process ever resumes from it.
//!
//! **What a save does.** `drun.atomic_save(path, write)` writes the bytes to the staged path
//! (no fsync: it is memory; no hashing: that is the agent's, off the training's path), and
//! `drun.commit` reports the *final* path with `"staged": true`. The agent checks the staged
//! file's size and answers the node's ranks **at once** (`{"staged": true, "sealed": false}`):
//! the training goes on. The node's batched commit goes to the persister ([`persist`]): each
//! file is copied by the kernel to a temporary file next to its final path, written back as the
//! copy goes (its pages dropped from the cache once on disk), fsynced, read back from the device
//! (`O_DIRECT`) and compared byte for byte with the staged copy (or its digest with the rank's,
//! when it sent one), hashed once on that read, and only then renamed into place and its
//! directory fsynced. The manifest records that digest (BLAKE3 where the rank left it to the
//! agent: [`crate::ckpt::digest`]). Only then does the node's commit go to
//! the ledger — where it seals as any commit does (manifest, `latest` pointer).
//!
//! **Sharing the node with the training.** The persister is throttled by a byte rate
//! ([`pace::pause`]) and by the CPU ([`pace::pace`]): while the node's CPUs are busy (the
//! rest of the CPUs the agent may run on leave less than most of one idle, `/proc/stat`), it keeps to a share
//! of one CPU (1.5 %, `DRUN_CKPT_PERSIST_CPU`) in the idle I/O class, in bursts of work
//! (`persist::pacer::LOOK_EVERY`) with the pause they ask between them: a rank that loses its
//! core holds up every rank that steps with it, at each burst; it goes at full speed while
//! a CPU is spare, when a newer step waits behind the one it writes, once the step waited past
//! the lag bound (120 s, `DRUN_CKPT_PERSIST_LAG`), and while the workers' end waits for it. A
//! CPU is spare ([`pace::judge`]) once windows the persister paused through have found most of
//! one idle for a second in a row, and stays spare while a window at full speed leaves most of
//! one idle beside it; else the persister pauses a window to look again: its own CPU, and the
//! waits it causes the ranks that step together, would otherwise keep it at full speed. A
//! lower CPU priority of its thread (nice, `SCHED_IDLE`) is not used: the ranks run in sessions
//! of their own, so with the kernel's autogroups (`sched_autogroup_enabled`) they compete with
//! the agent's session as groups, whatever the priority of a thread inside it; and an
//! unprivileged thread cannot take a lowered priority back for the run's end. `SCHED_BATCH`
//! (no preemption at wake-up) was measured and did not help; nor did `SCHED_IDLE` (at 3 % the
//! steps while it persisted ran 13.9 % slower, against 6-10 % without it on the same machine).
//!
//! **States of a step** (this node's, [`decide::Copy`]): `Staged` (in memory, answered to the
//! ranks) → `Persisting` (being written to `DIR`) → `Persisted` (every file written, fsynced,
//! verified; the node's commit is sent to the ledger). A persisted step's staged copy stays
//! until the budget needs the room (oldest first). A save that does not fit the budget even
//! after releasing every persisted copy goes straight to disk: the agent persists it before it
//! answers the ranks (one warning line), as a save without `--ckpt-memory` would cost.
//!
//! **What a resume may use.** In the ledger only persisted steps exist in this slice: the
//! resume point is always a step whose every file is on `DIR`, verified. When the plan's
//! resume point is a step this agent still holds in memory, complete (every file of its
//! manifest staged here with its recorded size), the workers' `DRUN_RESUME_PATH` names the
//! staged directory: the restart reads memory, not disk ([`resume_from_memory`]).
//!
//! **Crash consistency.**
//! * A persisted step becomes a resume point only after every file is written, fsynced and
//!   digest-verified in `DIR`: the node's commit, without which the step cannot seal, is sent
//!   after that, never before. An agent killed in the middle of persisting leaves at most
//!   `.drun-persist-*` temporary files in `DIR`, which no manifest names. Each names its
//!   owner (boot, pid namespace, pid, start time: [`leftover`]); the next agent with
//!   `--ckpt-memory` and this `--ckpt-dir` removes at its start those whose owner it sees gone, in one line, and leaves
//!   a live persister's and those of owners it cannot see (another machine or container).
//! * A staged copy is used for a resume only by the agent that holds it, within its life (the
//!   directory is private to the agent and removed with it), and only for a step the ledger
//!   chose for every rank: the staged copy never decides *which* step; the ledger does.
//! * A worker killed mid-stage has not committed: nothing of it is sealed, and its partial
//!   file in the staging directory is never named by any commit.
//! * At the end of the run (success, a signal, a worker failure) the agent reports its workers'
//!   end only once its staged steps are persisted and committed, bounded by
//!   `--shutdown-timeout`; it says how long it waited, and names what it could not persist.
//!
//! **Why staged steps are not in the ledger yet.** Recording a step as `staged` in the store
//! would let a resume point at a copy in memory on every node; it needs a second record per
//! node (persisted) and a resume rule over both — left for the next slice (with replicas on
//! peers). The first slice keeps the ledger's meaning unchanged: sealed means on disk.

pub mod decide;
pub mod leftover;
pub mod limit;
pub mod pace;
pub mod persist;
pub mod replica;
pub mod spare;
pub mod wire;

pub use limit::{NodeMemory, AUTO_SHARE};

use std::path::{Path, PathBuf};

/// Parses a size: bytes, or a number with K/M/G/T (powers of 1024; `KiB`, `KB`, `k` alike).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    let v = n * (1u64 << shift) as f64;
    (v.is_finite() && v >= 1.0 && v < u64::MAX as f64).then_some(v as u64)
}

pub use drun_rendezvous::human::bytes as human_bytes;

/// A `--ckpt-memory` value that is no budget this node can stage in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// Neither a size nor `auto`/`off`.
    #[error("not a size (e.g. 8GiB, 512M, auto or off)")]
    NotASize,
    /// A number without a unit: bytes, or the gibibytes a user likely meant?
    #[error("a number needs a unit (e.g. 8G for 8 GiB, 512M for 512 MiB), or give auto or off")]
    NoUnit,
    /// More than the node's usable memory (its RAM, or its cgroup's limit when lower).
    #[error(
        "{} is more than this node can hold: it has {} of RAM and {}; give at most {}, auto (a quarter of that) or off",
        human_bytes(*.bytes),
        human_bytes(.node.ram),
        .node.cgroup.map_or("no cgroup limit".to_string(), |c| format!("its cgroup's limit is {}", human_bytes(c))),
        human_bytes(.node.usable())
    )]
    TooLarge {
        /// The bytes asked for.
        bytes: u64,
        /// The node's memory.
        node: NodeMemory,
    },
}

/// The budget `--ckpt-memory` asks for: `Ok(None)` for `off`, `Ok(Some(bytes))` for `auto`
/// ([`AUTO_SHARE`] of the usable memory; `Ok(None)` when the node's memory is unknown) or a
/// size no larger than the node's memory.
///
/// # Errors
/// Not a size, zero, or larger than the node's memory or its cgroup limit.
pub fn budget(text: &str, node: Option<NodeMemory>) -> Result<Option<u64>, BudgetError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "false" | "no" => return Ok(None),
        // The default: where the node's memory cannot be read, nothing is staged (the
        // checkpoints go straight to disk, as with `off`) rather than a run refused.
        "auto" | "on" => return Ok(node.map(|n| n.usable() / AUTO_SHARE)),
        _ => {}
    }
    // A size of nothing (`0G`, `0M`) is `off`, as `0` is.
    let number = text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if number.trim().parse::<f64>() == Ok(0.0) {
        return Ok(None);
    }
    let bytes = parse_size(text).ok_or(BudgetError::NotASize)?;
    if text.trim().chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(BudgetError::NoUnit);
    }
    if let Some(n) = node {
        if bytes > n.usable() {
            return Err(BudgetError::TooLarge { bytes, node: n });
        }
    }
    Ok(Some(bytes))
}

/// Below this many bytes free (16 pages), a tmpfs is full: nothing is staged in it.
pub const TMPFS_FULL_BELOW: u64 = 64 << 10;

/// What the staging tmpfs allows of a budget ([`fit_tmpfs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TmpfsFit {
    /// Stage up to `budget` bytes there; `warning` (one line) when that is less than asked.
    Stage {
        /// The budget it can hold.
        budget: u64,
        /// The line saying it was cut to what the tmpfs has free.
        warning: Option<String>,
    },
    /// It is full (less than [`TMPFS_FULL_BELOW`] free): stage nothing, every save goes
    /// straight to `--ckpt-dir`; the one warning line.
    Full(String),
}

/// The budget the staging tmpfs can hold: `budget`, or the tmpfs's `free` bytes when fewer, with
/// the one warning line that says so (naming both and what drun does); nothing when it is full.
/// `free`: `None` when unknown (the budget stands).
pub fn fit_tmpfs(budget: u64, free: Option<u64>, tmpfs: &Path) -> TmpfsFit {
    match free {
        Some(free) if free < TMPFS_FULL_BELOW => TmpfsFit::Full(format!(
            "drun: warning: --ckpt-memory: {} is full ({} free): checkpoints are saved straight to --ckpt-dir (the ranks wait for the disk); free or enlarge {} (a container's --shm-size), or give --ckpt-memory off",
            tmpfs.display(),
            human_bytes(free),
            tmpfs.display()
        )),
        Some(free) if free < budget => TmpfsFit::Stage {
            budget: free,
            warning: Some(format!(
                "drun: warning: --ckpt-memory {} is more than {} has free ({}): this agent stages at most {} there, and a save that does not fit goes straight to --ckpt-dir (the ranks wait for the disk); enlarge {} (a container's --shm-size) or lower --ckpt-memory",
                human_bytes(budget),
                tmpfs.display(),
                human_bytes(free),
                human_bytes(free),
                tmpfs.display()
            )),
        },
        _ => TmpfsFit::Stage {
            budget,
            warning: None,
        },
    }
}

/// Bytes free for an unprivileged writer on the file system of `dir`, if it can be asked.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

/// Removes `files` and the directories below `root` they leave empty (a staged step's or a
/// replica's files once released).
pub fn remove_under(files: &[PathBuf], root: &Path) {
    for f in files {
        let _ = std::fs::remove_file(f);
        let mut dir = f.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(root) && *d != root) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
}

/// Where the file of final path `path` (inside `ckpt_dir`) is staged under `stage`; `None` for a
/// path outside `ckpt_dir` or with `..` in it.
pub fn staged_path(stage: &Path, ckpt_dir: &Path, path: &Path) -> Option<PathBuf> {
    let rel = path.strip_prefix(ckpt_dir).ok()?;
    let plain = rel
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    (plain && !rel.as_os_str().is_empty()).then(|| stage.join(rel))
}

/// The staged directory a resume of `m` may read instead of `ckpt_dir`: `Some` only when every
/// file of `m` is staged under `stage` with its recorded size (this agent holds the whole
/// checkpoint in memory), else `None` (read the disk).
pub fn resume_from_memory(
    stage: &Path,
    ckpt_dir: &Path,
    m: &drun_rendezvous::Manifest,
) -> Option<PathBuf> {
    if m.files.is_empty() {
        return None;
    }
    let complete = m.files.iter().all(|f| {
        staged_path(stage, ckpt_dir, Path::new(&f.path))
            .and_then(|p| std::fs::metadata(p).ok())
            .is_some_and(|md| md.is_file() && md.len() == f.bytes)
    });
    if !complete {
        return None;
    }
    staged_path(stage, ckpt_dir, &m.dir())
}

/// `--ckpt-verify digest` on a resume from the staged copy: why the staged copy of `m` is not
/// what its manifest says (the first file whose size or digest differs, as one line), or
/// `None`. The ranks read the staged copy, not the one on disk that the resume check hashed; it
/// is checked the same way ([`crate::ckpt::verify::verify`], files hashed in parallel).
pub fn staged_differs(
    stage: &Path,
    ckpt_dir: &Path,
    m: &drun_rendezvous::Manifest,
) -> Option<String> {
    let mut staged = m.clone();
    for f in &mut staged.files {
        match staged_path(stage, ckpt_dir, Path::new(&f.path)) {
            Some(p) => f.path = p.display().to_string(),
            None => return Some(format!("{} is outside --ckpt-dir", f.path)),
        }
    }
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    crate::ckpt::verify::verify(&staged, crate::ckpt::VerifyMode::Digest, threads)
        .err()
        .map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8GiB"), Some(8 * GIB));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1.5g"), Some(3 * GIB / 2));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2 KB"), Some(2048));
        for bad in ["", "G", "-1G", "3X", "0"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(human_bytes(3 * GIB / 2), "1.5 GiB");
        assert_eq!(human_bytes(300 << 20), "300 MiB");
    }

    #[test]
    fn the_budget_is_off_auto_or_a_size_the_node_can_hold() {
        let node = NodeMemory {
            ram: 64 * GIB,
            cgroup: Some(16 * GIB),
        };
        assert_eq!(budget("off", Some(node)), Ok(None));
        assert_eq!(
            budget("auto", Some(node)),
            Ok(Some(4 * GIB)),
            "a quarter of the cgroup"
        );
        let free = NodeMemory {
            cgroup: None,
            ..node
        };
        assert_eq!(budget("auto", Some(free)), Ok(Some(16 * GIB)));
        assert_eq!(budget("8G", Some(node)), Ok(Some(8 * GIB)));
        let e = budget("32G", Some(node)).unwrap_err();
        assert_eq!(
            e,
            BudgetError::TooLarge {
                bytes: 32 * GIB,
                node
            }
        );
        assert_eq!(
            e.to_string(),
            "32 GiB is more than this node can hold: it has 64 GiB of RAM and its cgroup's limit is 16 GiB; give at most 16 GiB, auto (a quarter of that) or off"
        );
        let e = budget("128G", Some(free)).unwrap_err().to_string();
        assert!(e.contains("64 GiB of RAM and no cgroup limit"), "{e}");
        assert_eq!(budget("lots", Some(node)), Err(BudgetError::NotASize));
        // `--ckpt-memory 1`: one byte, or the GiB the user likely meant? Neither: refused.
        assert_eq!(budget("1", Some(node)), Err(BudgetError::NoUnit));
        assert_eq!(budget("4096", Some(node)), Err(BudgetError::NoUnit));
        assert_eq!(
            BudgetError::NotASize.to_string(),
            "not a size (e.g. 8GiB, 512M, auto or off)"
        );
        assert_eq!(budget("auto", None), Ok(None), "unknown memory: off");
        for zero in ["0", "0G", "0MiB", " 0.0 k"] {
            assert_eq!(budget(zero, Some(node)), Ok(None), "{zero}: off");
        }
        assert_eq!(budget("1G", None), Ok(Some(GIB)));
    }

    #[test]
    fn a_budget_larger_than_the_tmpfs_has_free_is_cut_to_it_with_one_line() {
        let shm = Path::new("/dev/shm");
        let as_is = |budget| TmpfsFit::Stage {
            budget,
            warning: None,
        };
        assert_eq!(fit_tmpfs(8 * GIB, Some(16 * GIB), shm), as_is(8 * GIB));
        assert_eq!(fit_tmpfs(8 * GIB, None, shm), as_is(8 * GIB), "unknown");
        let TmpfsFit::Stage {
            budget,
            warning: Some(line),
        } = fit_tmpfs(8 * GIB, Some(GIB / 2), shm)
        else {
            panic!("cut to what is free")
        };
        assert_eq!(budget, GIB / 2);
        assert!(
            line.starts_with("drun: warning: --ckpt-memory 8 GiB is more than /dev/shm has free (512 MiB): this agent stages at most 512 MiB there")
                && line.contains("goes straight to --ckpt-dir")
                && !line.contains('\n'),
            "{line}"
        );
        assert!(free_bytes(Path::new("/")).is_some_and(|f| f > 0));
    }

    #[test]
    fn a_full_tmpfs_stages_nothing_with_one_line() {
        let shm = Path::new("/dev/shm");
        for free in [0, 4096, TMPFS_FULL_BELOW - 1] {
            let TmpfsFit::Full(line) = fit_tmpfs(8 * GIB, Some(free), shm) else {
                panic!("{free} bytes free is full");
            };
            assert!(
                line.starts_with("drun: warning: --ckpt-memory: /dev/shm is full (")
                    && line.contains("saved straight to --ckpt-dir")
                    && !line.contains('\n'),
                "{line}"
            );
        }
        assert!(matches!(
            fit_tmpfs(8 * GIB, Some(TMPFS_FULL_BELOW), shm),
            TmpfsFit::Stage { budget, .. } if budget == TMPFS_FULL_BELOW
        ));
    }

    #[test]
    fn staged_paths_mirror_the_checkpoint_directory() {
        let (s, d) = (Path::new("/dev/shm/st"), Path::new("/ck"));
        assert_eq!(
            staged_path(s, d, Path::new("/ck/run/step-1-g1/rank0.pt")),
            Some(PathBuf::from("/dev/shm/st/run/step-1-g1/rank0.pt"))
        );
        assert_eq!(staged_path(s, d, Path::new("/other/x")), None);
        assert_eq!(staged_path(s, d, Path::new("/ck/../etc/passwd")), None);
        assert_eq!(staged_path(s, d, Path::new("/ck")), None);
    }

    #[test]
    fn a_resume_reads_memory_only_when_every_file_is_staged() {
        let stage = tempfile::tempdir().unwrap();
        let dir = Path::new("/ck");
        let f = |r: u32| drun_rendezvous::ShardFile {
            rank: r,
            path: format!("/ck/run/step-2-g1/rank{r}.pt"),
            bytes: 3,
            digest: String::new(),
        };
        let mut m = drun_rendezvous::Manifest {
            run_id: "run".into(),
            step: 2,
            generation: 1,
            world_size: 2,
            cursor: Default::default(),
            files: vec![f(0), f(1)],
            sealed_at_ms: 0,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        };
        let d = stage.path().join("run/step-2-g1");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("rank0.pt"), b"abc").unwrap();
        assert_eq!(
            resume_from_memory(stage.path(), dir, &m),
            None,
            "rank 1 missing"
        );
        std::fs::write(d.join("rank1.pt"), b"ab").unwrap();
        assert_eq!(
            resume_from_memory(stage.path(), dir, &m),
            None,
            "wrong size"
        );
        std::fs::write(d.join("rank1.pt"), b"abc").unwrap();
        assert_eq!(resume_from_memory(stage.path(), dir, &m), Some(d));
        m.files.clear();
        assert_eq!(resume_from_memory(stage.path(), dir, &m), None);
    }
}
