//! The persister's temporary files left in `--ckpt-dir` by an agent killed mid-persist, and
//! their removal by the next agent at its start: each temporary file is named with its owner
//! ([`Owner`]: the machine's boot, the pid namespace, the pid and its start time), so a later
//! agent removes only drun's own files whose owner it can see is gone ([`judge`], pure), and
//! leaves alone those of a live persister or of an owner it cannot see (another machine, another
//! container's pid namespace). The same for an agent's staging directory on the tmpfs
//! ([`sweep_stages`]): a killed agent's staged copies would otherwise hold memory until reboot.

use std::path::{Path, PathBuf};

/// Prefix of the temporary files the persister writes next to a file's place: a persister
/// killed mid-copy leaves only such files, which no manifest ever names. The owner's token
/// follows it ([`Owner`]), so the next agent can tell a dead owner's files from a live one's
/// and remove them.
pub const TEMP_PREFIX: &str = ".drun-persist-";

/// How deep below `--ckpt-dir` the sweep looks: `<run>/<step>/<file>` and one level more (a
/// DCP checkpoint's or a user's own sub-directory).
const DEPTH: usize = 4;

/// Who writes a temporary file: one process of one boot of one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The first 16 hex digits of `/proc/sys/kernel/random/boot_id` (one boot of one machine).
    pub boot: String,
    /// The inode of the owner's pid namespace (`/proc/self/ns/pid`): pids mean something only
    /// inside it.
    pub pidns: u64,
    /// The owner's pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/<pid>/stat` field 22): a pid reused by
    /// another process has another.
    pub start: u64,
}

impl Owner {
    /// The token a file name carries: `<boot>.<pidns>.<pid>.<start>`.
    pub fn token(&self) -> String {
        format!("{}.{}.{}.{}", self.boot, self.pidns, self.pid, self.start)
    }

    /// The owner named by a temporary file's name (`.drun-persist-<token>-<name>-<random>`);
    /// `None` for any other name, or one written before owners were named.
    pub fn of_file(name: &str) -> Option<Self> {
        Self::of_name(name, TEMP_PREFIX)
    }

    /// The owner named by `name`, `<prefix><token>-<rest>`; `None` for any other name.
    pub fn of_name(name: &str, prefix: &str) -> Option<Self> {
        let token = name.strip_prefix(prefix)?.split('-').next()?;
        let mut it = token.split('.');
        let boot = it.next()?;
        if boot.len() != 16 || !boot.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let owner = Self {
            boot: boot.to_string(),
            pidns: it.next()?.parse().ok()?,
            pid: it.next()?.parse().ok()?,
            start: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(owner)
    }

    /// This process, read from `/proc`; `None` where `/proc` does not say (the persister then
    /// names no owner and its leftovers are never removed).
    pub fn current() -> Option<Self> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let boot: String = boot.trim().chars().filter(|c| *c != '-').take(16).collect();
        let pid = std::process::id();
        Some(Self {
            boot: (boot.len() == 16).then_some(boot)?,
            pidns: pidns("/proc/self/ns/pid")?,
            pid,
            start: start_time(pid)?,
        })
    }

    /// This process's owner, read once.
    pub fn me() -> Option<&'static Self> {
        static ME: std::sync::OnceLock<Option<Owner>> = std::sync::OnceLock::new();
        ME.get_or_init(Self::current).as_ref()
    }
}

/// The inode of a `pid:[N]` namespace link.
fn pidns(link: &str) -> Option<u64> {
    let l = std::fs::read_link(link).ok()?;
    l.to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The start time of `pid` (field 22 of its `stat`), `None` when no such process exists.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_start(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` text (the command may hold spaces and parentheses: fields
/// are counted after its last `)`).
pub fn stat_start(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// What to do with one temporary file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its owner is gone: remove it.
    Remove,
    /// Leave it, for this reason.
    Keep(&'static str),
}

/// Judges a temporary file of owner `owner` (`None`: it names none) seen by `me`, where
/// `now_start` is the start time of the process that holds the owner's pid in `me`'s pid
/// namespace today (`None`: no process has it). Only a file whose owner was of this boot and
/// this pid namespace, and whose pid is free or held by a later process, is removed.
pub fn judge(owner: Option<&Owner>, me: &Owner, now_start: Option<u64>) -> Verdict {
    let Some(o) = owner else {
        return Verdict::Keep("it names no owner (written by an older drun)");
    };
    if o.boot != me.boot {
        return Verdict::Keep("its owner ran on another machine or an earlier boot");
    }
    if o.pidns != me.pidns {
        return Verdict::Keep("its owner ran in another pid namespace (container)");
    }
    match now_start {
        Some(s) if s == o.start => Verdict::Keep("its owner is alive"),
        _ => Verdict::Remove,
    }
}

/// What a sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// The files removed.
    pub removed: Vec<PathBuf>,
    /// Bytes they held.
    pub bytes: u64,
    /// Temporary files left alone (a live owner, or one this agent cannot see).
    pub kept: usize,
}

impl Swept {
    /// The one line an agent prints, `None` when nothing was found.
    pub fn line(&self, dir: &Path) -> Option<String> {
        if self.removed.is_empty() {
            return None;
        }
        let mut line = format!(
            "drun: removed {} temporary file{} ({}) left in {} by an agent killed while it persisted a checkpoint",
            self.removed.len(),
            if self.removed.len() == 1 { "" } else { "s" },
            super::human_bytes(self.bytes),
            dir.display()
        );
        if let Some(first) = self.removed.first() {
            line.push_str(&format!(": {}", first.display()));
            if self.removed.len() > 1 {
                line.push_str(&format!(" and {} more", self.removed.len() - 1));
            }
        }
        if self.kept > 0 {
            line.push_str(&format!(
                "; {} left alone (a live agent's, or one on another machine or container)",
                self.kept
            ));
        }
        Some(line)
    }
}

impl Swept {
    /// The one line an agent prints after [`sweep_stages`], `None` when nothing was removed.
    pub fn stages_line(&self, parent: &Path) -> Option<String> {
        let first = self.removed.first()?;
        let n = self.removed.len();
        Some(format!(
            "drun: removed {n} staging director{} ({}) left in {} by an agent that was killed: {}{}",
            if n == 1 { "y" } else { "ies" },
            super::human_bytes(self.bytes),
            parent.display(),
            first.display(),
            if n > 1 {
                format!(" and {} more", n - 1)
            } else {
                String::new()
            }
        ))
    }
}

/// Removes from `dir` (four levels down, not following links) every persister temporary
/// file whose owner [`judge`] finds gone, as seen by `me`.
pub fn sweep(dir: &Path, me: &Owner) -> Swept {
    let mut out = Swept::default();
    walk(dir, DEPTH, &mut |path, name, len| {
        if !name.starts_with(TEMP_PREFIX) {
            return;
        }
        let owner = Owner::of_file(name);
        let now = owner.as_ref().and_then(|o| start_time(o.pid));
        match judge(owner.as_ref(), me, now) {
            Verdict::Remove if std::fs::remove_file(path).is_ok() => {
                out.removed.push(path.to_path_buf());
                out.bytes += len;
            }
            Verdict::Remove => {}
            Verdict::Keep(why) => {
                tracing::debug!(file = %path.display(), why, "temporary checkpoint file kept");
                out.kept += 1;
            }
        }
    });
    out
}

/// Prefix of an agent's staging directory on the tmpfs; the owner's token follows it
/// (`drun-stage-<token>-<random>`), so that a later agent can tell a dead agent's from a live
/// one's.
pub const STAGE_PREFIX: &str = "drun-stage-";

/// Removes from `parent` (the tmpfs, `/dev/shm`) the staging directories of agents that died
/// without removing theirs (SIGKILL, the OOM killer): their staged copies hold memory until the
/// next reboot, and no agent ever reads another's. Only directories named with an owner
/// ([`STAGE_PREFIX`]), this user's, whose owner [`judge`] finds gone, as seen by `me`.
pub fn sweep_stages(parent: &Path, me: &Owner) -> Swept {
    use std::os::unix::fs::MetadataExt;
    let mut out = Swept::default();
    let uid = nix::unistd::geteuid().as_raw();
    for e in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(owner) = Owner::of_name(&name, STAGE_PREFIX) else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid {
            continue;
        }
        match judge(Some(&owner), me, start_time(owner.pid)) {
            Verdict::Remove => {
                let mut bytes = 0;
                walk(&e.path(), 8, &mut |_, _, len| bytes += len);
                if std::fs::remove_dir_all(e.path()).is_ok() {
                    out.removed.push(e.path());
                    out.bytes += bytes;
                }
            }
            Verdict::Keep(why) => {
                tracing::debug!(dir = %e.path().display(), why, "staging directory kept");
                out.kept += 1;
            }
        }
    }
    out
}

fn walk(dir: &Path, depth: usize, visit: &mut dyn FnMut(&Path, &str, u64)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        let path = e.path();
        if kind.is_dir() && depth > 1 {
            walk(&path, depth - 1, visit);
        } else if kind.is_file() {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            visit(&path, &e.file_name().to_string_lossy(), len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Owner {
        Owner {
            boot: "0123456789abcdef".into(),
            pidns: 4026531836,
            pid: 100,
            start: 5000,
        }
    }

    #[test]
    fn a_file_name_carries_its_owner() {
        let o = me();
        let name = format!("{TEMP_PREFIX}{}-rank0.pt-Ab12Cd", o.token());
        assert_eq!(Owner::of_file(&name), Some(o));
        for other in [
            ".drun-persist-rank0.pt-Ab12Cd",
            ".drun-persist-0123456789abcdef.1.2-x",
            ".drun-persist-0123456789abcdeg.1.2.3-x",
            "rank0.pt",
        ] {
            assert_eq!(Owner::of_file(other), None, "{other}");
        }
    }

    #[test]
    fn a_dead_agents_staging_directory_is_removed_and_a_live_ones_kept() {
        let shm = tempfile::tempdir().unwrap();
        let me = Owner::current().expect("/proc says who this is");
        // A dead agent: this boot and pid namespace, a pid no process holds now.
        let dead = Owner {
            pid: u32::MAX - 1,
            ..me.clone()
        };
        let other_machine = Owner {
            boot: "fedcba9876543210".into(),
            ..dead.clone()
        };
        let mk = |o: &Owner, file: &[u8]| {
            let d = shm
                .path()
                .join(format!("{STAGE_PREFIX}{}-Ab12Cd", o.token()));
            std::fs::create_dir_all(d.join("run/step-2-g1")).unwrap();
            std::fs::write(d.join("run/step-2-g1/rank0.pt"), file).unwrap();
            d
        };
        let gone = mk(&dead, &[0; 1000]);
        let live = mk(&me, b"x");
        let foreign = mk(&other_machine, b"x");
        let unnamed = shm.path().join("drun-stage-Ab12Cd");
        std::fs::create_dir(&unnamed).unwrap();
        let swept = sweep_stages(shm.path(), &me);
        assert_eq!(swept.removed, std::slice::from_ref(&gone));
        assert_eq!(swept.bytes, 1000);
        assert_eq!(swept.kept, 2, "the live one's and the other machine's");
        assert!(!gone.exists() && live.exists() && foreign.exists() && unnamed.exists());
        let line = swept.stages_line(shm.path()).unwrap();
        assert!(
            line.starts_with("drun: removed 1 staging directory (1000 B) left in ")
                && line.contains("by an agent that was killed")
                && !line.contains('\n'),
            "{line}"
        );
        assert_eq!(sweep_stages(shm.path(), &me).stages_line(shm.path()), None);
    }

    #[test]
    fn only_a_file_whose_owner_is_seen_gone_is_removed() {
        let mine = me();
        let dead = Owner {
            pid: 200,
            start: 42,
            ..me()
        };
        assert_eq!(judge(Some(&dead), &mine, None), Verdict::Remove, "pid free");
        assert_eq!(
            judge(Some(&dead), &mine, Some(43)),
            Verdict::Remove,
            "pid reused by a later process"
        );
        assert_eq!(
            judge(Some(&dead), &mine, Some(42)),
            Verdict::Keep("its owner is alive")
        );
        let elsewhere = Owner {
            boot: "fedcba9876543210".into(),
            ..dead.clone()
        };
        assert!(matches!(
            judge(Some(&elsewhere), &mine, None),
            Verdict::Keep(w) if w.contains("another machine")
        ));
        let container = Owner { pidns: 1, ..dead };
        assert!(matches!(
            judge(Some(&container), &mine, None),
            Verdict::Keep(w) if w.contains("pid namespace")
        ));
        assert!(matches!(judge(None, &mine, None), Verdict::Keep(_)));
    }

    #[test]
    fn stat_start_counts_fields_after_the_command() {
        let stat = "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(stat_start(stat), Some(987654));
        assert_eq!(stat_start("garbage"), None);
    }

    #[test]
    fn this_process_is_its_own_live_owner() {
        let me = Owner::current().expect("/proc says who this is");
        assert_eq!(
            judge(Some(&me), &me, start_time(me.pid)),
            Verdict::Keep("its owner is alive")
        );
        assert_eq!(
            Owner::of_file(&format!("{TEMP_PREFIX}{}-x-y", me.token())),
            Some(me)
        );
    }

    #[test]
    fn a_sweep_removes_the_dead_owners_files_and_says_so_in_one_line() {
        let d = tempfile::tempdir().unwrap();
        let me = Owner::current().unwrap();
        let step = d.path().join("run/step-4-g1");
        std::fs::create_dir_all(&step).unwrap();
        // A pid no process holds: above the kernel's pid_max of 2^22.
        let dead = Owner {
            pid: 5_000_000,
            ..me.clone()
        };
        let elsewhere = Owner {
            boot: "fedcba9876543210".into(),
            ..dead.clone()
        };
        let gone = step.join(format!("{TEMP_PREFIX}{}-rank1.pt-aaaaaa", dead.token()));
        let live = step.join(format!("{TEMP_PREFIX}{}-rank0.pt-bbbbbb", me.token()));
        let foreign = step.join(format!(
            "{TEMP_PREFIX}{}-rank2.pt-cccccc",
            elsewhere.token()
        ));
        let user = step.join("rank1.pt");
        for f in [&gone, &live, &foreign, &user] {
            std::fs::write(f, b"12345").unwrap();
        }
        let s = sweep(d.path(), &me);
        assert_eq!(s.removed, vec![gone.clone()]);
        assert_eq!((s.bytes, s.kept), (5, 2));
        assert!(!gone.exists() && live.exists() && foreign.exists() && user.exists());
        let line = s.line(d.path()).unwrap();
        assert!(
            line.starts_with("drun: removed 1 temporary file (5 B) left in ")
                && line.contains(&gone.display().to_string())
                && line.contains("; 2 left alone")
                && !line.contains('\n'),
            "{line}"
        );
        assert_eq!(Swept::default().line(d.path()), None);
        let only_kept = Swept {
            kept: 1,
            ..Swept::default()
        };
        assert_eq!(only_kept.line(d.path()), None, "nothing removed: no line");
    }
}
