//! The node's memory as `--ckpt-memory` judges a budget against it: MemTotal, and the memory
//! limit of the agent's own cgroup (the smallest on its path to the hierarchy's root, cgroup v2
//! `memory.max` or v1 `memory.limit_in_bytes`), read through a seam so the walk is tested on
//! made-up trees.

use std::path::{Component, Path, PathBuf};

/// The budget when `--ckpt-memory auto` (the default): this fraction of the node's memory (the
/// smaller of its RAM and its cgroup's limit). A quarter: the staged copies of one or two steps
/// must fit beside the training's own memory — its CPU copy of the state while it saves (as
/// large as a staged copy), data loader workers, pinned buffers — and tmpfs pages count against
/// the same cgroup limit as the training's, so a larger share trades checkpoints for an OOM
/// kill. A default tmpfs (`/dev/shm`, half of RAM) holds a quarter with room to spare; a smaller
/// one cuts the budget to what it has free ([`super::fit_tmpfs`]).
pub const AUTO_SHARE: u64 = 4;

/// The node's memory as the budget is judged against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMemory {
    /// MemTotal of `/proc/meminfo`, bytes.
    pub ram: u64,
    /// The agent's cgroup's memory limit (the smallest on its path to the root: cgroup v2
    /// `memory.max`, v1 `memory.limit_in_bytes`), bytes; `None` when unlimited or unknown.
    pub cgroup: Option<u64>,
}

impl NodeMemory {
    /// The memory this node's processes may use: RAM, or the cgroup limit when smaller.
    pub fn usable(&self) -> u64 {
        self.cgroup.map_or(self.ram, |c| c.min(self.ram))
    }

    /// Reads `/proc/meminfo` and the agent's cgroup limit (`/proc/self/cgroup`, under
    /// `/sys/fs/cgroup`); `None` when MemTotal is unreadable.
    pub fn read() -> Option<Self> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let ram = meminfo_total(&info)?;
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|own| {
                cgroup_limit_of(&own, Path::new("/sys/fs/cgroup"), |p| {
                    std::fs::read_to_string(p).ok()
                })
            });
        Some(Self { ram, cgroup })
    }
}

/// MemTotal of a `/proc/meminfo` text, bytes.
pub fn meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A cgroup memory limit file's value: `None` for `max` or a v1 "unlimited" (a huge number).
pub fn cgroup_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

/// The memory limit of the process whose `/proc/<pid>/cgroup` is `own`, with the cgroup file
/// systems mounted under `root` (`/sys/fs/cgroup`): the smallest limit set on the path from its
/// cgroup up to the root of each hierarchy that has the memory controller — cgroup v2
/// (`0::/path`, `memory.max`, at `root` or at `root/unified` on a hybrid host) and v1
/// (`N:…memory…:/path`, `memory.limit_in_bytes`, at `root/memory`). A parent's limit binds
/// its children, and a job's limit is often set above the process's own cgroup (Slurm's
/// `job_<id>` above `step_<id>`, systemd's slice above the service). `read` is the seam:
/// a file's text, `None` when absent. `None`: no limit found.
pub fn cgroup_limit_of(
    own: &str,
    root: &Path,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let mut places: Vec<(PathBuf, &str, &str)> = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            places.push((root.to_path_buf(), path, "memory.max"));
            places.push((root.join("unified"), path, "memory.max"));
        } else if controllers.split(',').any(|c| c == "memory") {
            places.push((root.join("memory"), path, "memory.limit_in_bytes"));
        }
    }
    places
        .iter()
        .flat_map(|(mount, path, file)| {
            // Only plain names: a path outside this cgroup namespace (`/../..`) has no place
            // under the mount, and its limits are not ours to read.
            let names: Vec<_> = Path::new(path)
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n),
                    _ => None,
                })
                .collect();
            let plain = Path::new(path)
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::RootDir));
            let depth = if plain { Some(names.len()) } else { None };
            depth
                .into_iter()
                .flat_map(|d| 0..=d)
                .map(|n| {
                    let mut dir = mount.clone();
                    dir.extend(&names[..n]);
                    dir.join(file)
                })
                .collect::<Vec<_>>()
        })
        .filter_map(|f| read(&f).and_then(|t| cgroup_limit(&t)))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const GIB: u64 = 1 << 30;

    fn tree(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let m: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), (*t).to_string()))
            .collect();
        move |p| m.get(p).cloned()
    }

    #[test]
    fn proc_and_cgroup_files_read() {
        let info = "MemTotal:       16303412 kB\nMemFree:  1 kB\n";
        assert_eq!(meminfo_total(info), Some(16303412 * 1024));
        assert_eq!(cgroup_limit("max\n"), None);
        assert_eq!(cgroup_limit("9223372036854771712\n"), None, "v1 unlimited");
        assert_eq!(cgroup_limit("4294967296\n"), Some(4 * GIB));
    }

    #[test]
    fn a_v2_limit_set_on_an_ancestor_binds_the_agent() {
        let root = Path::new("/sys/fs/cgroup");
        // A Slurm job on a cgroup v2 host: the limit is the job's, two levels up.
        let own = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n";
        let read = tree(&[
            (
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/memory.max",
                "8589934592\n",
            ),
            (
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/memory.max",
                "max\n",
            ),
            ("/sys/fs/cgroup/system.slice/memory.max", "max\n"),
        ]);
        assert_eq!(cgroup_limit_of(own, root, &read), Some(8 * GIB));
        // The smallest of several limits on the path.
        let read = tree(&[
            ("/sys/fs/cgroup/a/memory.max", "17179869184\n"),
            ("/sys/fs/cgroup/a/b/memory.max", "4294967296\n"),
        ]);
        assert_eq!(cgroup_limit_of("0::/a/b/c\n", root, &read), Some(4 * GIB));
        // A container with its own cgroup namespace: its cgroup is the mount's root.
        let read = tree(&[("/sys/fs/cgroup/memory.max", "2147483648\n")]);
        assert_eq!(cgroup_limit_of("0::/\n", root, &read), Some(2 * GIB));
        // No limit anywhere, or a path outside the namespace: none.
        assert_eq!(cgroup_limit_of("0::/a/b\n", root, tree(&[])), None);
        let read = tree(&[("/sys/fs/cgroup/memory.max", "2147483648\n")]);
        assert_eq!(cgroup_limit_of("0::/../../x\n", root, &read), None);
        assert_eq!(cgroup_limit_of("", root, &read), None, "not in a cgroup");
    }

    #[test]
    fn a_v1_memory_hierarchy_is_walked_too() {
        let root = Path::new("/sys/fs/cgroup");
        let own = "9:name=systemd:/\n4:memory:/slurm/uid_0/job_7/step_batch\n0::/\n";
        let read = tree(&[
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/slurm/uid_0/job_7/memory.limit_in_bytes",
                "3221225472\n",
            ),
        ]);
        assert_eq!(cgroup_limit_of(own, root, &read), Some(3 * GIB));
        // Controllers sharing a hierarchy ("memory,cpu") count; "memory_extra" does not.
        let read = tree(&[(
            "/sys/fs/cgroup/memory/j/memory.limit_in_bytes",
            "1073741824\n",
        )]);
        assert_eq!(cgroup_limit_of("3:cpu,memory:/j\n", root, &read), Some(GIB));
        assert_eq!(cgroup_limit_of("3:memory_extra:/j\n", root, &read), None);
    }

    #[test]
    fn the_usable_memory_is_the_smaller_of_ram_and_the_limit() {
        let n = NodeMemory {
            ram: 64 * GIB,
            cgroup: Some(16 * GIB),
        };
        assert_eq!(n.usable(), 16 * GIB);
        let n = NodeMemory {
            ram: 8 * GIB,
            cgroup: Some(16 * GIB),
        };
        assert_eq!(n.usable(), 8 * GIB);
        assert!(NodeMemory::read().is_some_and(|n| n.ram > 0));
    }
}
