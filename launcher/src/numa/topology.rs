//! What the binding needs to know of the node, read once from sysfs (and the NVIDIA driver's
//! `/proc` entries) into plain data: the visible GPUs' NUMA nodes, each NUMA node's CPUs, and
//! each CPU's core, socket and last-level cache.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::NumaError;

/// A set of logical CPU indices.
pub type Cpus = BTreeSet<usize>;

/// One visible GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its PCI address, as sysfs names it (`0000:3b:00.0`).
    pub pci: String,
    /// The NUMA node it is attached to (a single-node machine's `-1` reads as 0).
    pub node: usize,
}

/// The node's topology as far as the binding modes look at it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// The GPUs the workers see, by device index (the local rank binds to its index).
    pub gpus: Vec<Gpu>,
    /// Each NUMA node's CPUs (`/sys/devices/system/node/node<N>/cpulist`).
    pub node_cpus: BTreeMap<usize, Cpus>,
    /// Each CPU's hyper-thread siblings, itself included (`topology/thread_siblings_list`).
    pub siblings: BTreeMap<usize, Cpus>,
    /// Each CPU's socket (`topology/physical_package_id`).
    pub socket: BTreeMap<usize, usize>,
    /// The CPUs sharing each CPU's last-level data cache (the highest `cache/index*` level of
    /// type Data or Unified, `shared_cpu_list`).
    pub llc: BTreeMap<usize, Cpus>,
}

/// A part of a sysfs CPU list that is not a CPU or a range of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a CPU range")]
pub struct NotACpuRange(pub String);

/// Parses a sysfs CPU or node list (`0-3,8,10-11`).
pub fn parse_list(text: &str) -> Result<Cpus, NotACpuRange> {
    let mut out = Cpus::new();
    for part in text
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let num = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| NotACpuRange(part.to_string()))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(NotACpuRange(part.to_string()));
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(num(part)?);
            }
        }
    }
    Ok(out)
}

/// Writes `cpus` as a sysfs list (`0-3,8`), as `numactl` and `taskset` print them.
pub fn format_list(cpus: &Cpus) -> String {
    let mut parts = Vec::new();
    let mut iter = cpus.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().expect("peeked");
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

fn read(root: &Path, path: &str) -> Result<String, NumaError> {
    let p = root.join(path);
    std::fs::read_to_string(&p).map_err(|e| NumaError::Topology(format!("{}: {e}", p.display())))
}

fn list(root: &Path, path: &str) -> Result<Cpus, NumaError> {
    parse_list(&read(root, path)?)
        .map_err(|why| NumaError::Topology(format!("{}: {why}", root.join(path).display())))
}

/// The GPUs' PCI addresses in PCI order, with each one's UUID when the driver says it
/// (`/proc/driver/nvidia/gpus/<address>/information`); empty without the NVIDIA driver.
fn nvidia_gpus(root: &Path) -> Vec<(String, Option<String>)> {
    let Ok(dir) = std::fs::read_dir(root.join("proc/driver/nvidia/gpus")) else {
        return Vec::new();
    };
    let mut gpus: Vec<(String, Option<String>)> = dir
        .flatten()
        .map(|e| {
            let pci = e.file_name().to_string_lossy().to_lowercase();
            let uuid = std::fs::read_to_string(e.path().join("information"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("GPU UUID:").map(|u| u.trim().to_string()))
                });
            (pci, uuid)
        })
        .collect();
    gpus.sort();
    gpus
}

/// Picks the GPUs `CUDA_VISIBLE_DEVICES` makes visible, in its order (indices into the PCI
/// order, or UUIDs and their unique prefixes as CUDA accepts them); all of them when unset.
pub fn visible(
    all: &[(String, Option<String>)],
    cuda_visible_devices: Option<&str>,
) -> Result<Vec<String>, NumaError> {
    let Some(list) = cuda_visible_devices else {
        return Ok(all.iter().map(|(pci, _)| pci.clone()).collect());
    };
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let found = match item.parse::<usize>() {
            Ok(i) => all.get(i).map(|(pci, _)| pci.clone()),
            Err(_) => {
                let matching: Vec<&String> = all
                    .iter()
                    .filter(|(_, uuid)| uuid.as_deref().is_some_and(|u| u.starts_with(item)))
                    .map(|(pci, _)| pci)
                    .collect();
                (matching.len() == 1).then(|| matching[0].clone())
            }
        };
        match found {
            Some(pci) => out.push(pci),
            // CUDA stops at the first entry it cannot use, and so does its device list.
            None if item.parse::<usize>().is_ok() => break,
            None => {
                return Err(NumaError::Topology(format!(
                    "CUDA_VISIBLE_DEVICES names '{item}', which matches no single GPU of this node"
                )))
            }
        }
    }
    Ok(out)
}

/// Reads the topology under `root` (`/` on a real node), the visible GPUs chosen by
/// `cuda_visible_devices`.
pub fn read_topology(
    root: &Path,
    cuda_visible_devices: Option<&str>,
) -> Result<Topology, NumaError> {
    let all = nvidia_gpus(root);
    if all.is_empty() {
        return Err(NumaError::NoGpu);
    }
    let mut gpus = Vec::new();
    for pci in visible(&all, cuda_visible_devices)? {
        let node: i64 = read(root, &format!("sys/bus/pci/devices/{pci}/numa_node"))?
            .trim()
            .parse()
            .map_err(|_| NumaError::Topology(format!("{pci}: numa_node is not a number")))?;
        gpus.push(Gpu {
            pci,
            node: node.max(0) as usize,
        });
    }
    let mut t = Topology {
        gpus,
        ..Topology::default()
    };
    for node in list(root, "sys/devices/system/node/possible")? {
        let cpus =
            list(root, &format!("sys/devices/system/node/node{node}/cpulist")).unwrap_or_default();
        for &cpu in &cpus {
            let base = format!("sys/devices/system/cpu/cpu{cpu}");
            t.siblings.insert(
                cpu,
                list(root, &format!("{base}/topology/thread_siblings_list"))?,
            );
            let socket = read(root, &format!("{base}/topology/physical_package_id"))?;
            t.socket.insert(
                cpu,
                socket.trim().parse().map_err(|_| {
                    NumaError::Topology(format!("cpu{cpu}: physical_package_id is not a number"))
                })?,
            );
            if let Some(shared) = last_level_cache(root, &base) {
                t.llc.insert(cpu, shared);
            }
        }
        t.node_cpus.insert(node, cpus);
    }
    Ok(t)
}

/// The CPUs sharing the highest-level data or unified cache of the CPU at `base`.
fn last_level_cache(root: &Path, base: &str) -> Option<Cpus> {
    let dir = std::fs::read_dir(root.join(base).join("cache")).ok()?;
    let mut best: Option<(u32, Cpus)> = None;
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name
            .strip_prefix("index")
            .is_none_or(|n| n.parse::<u32>().is_err())
        {
            continue;
        }
        let field = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        let kind = field("type").unwrap_or_default();
        if !matches!(kind.trim(), "Data" | "Unified") {
            continue;
        }
        let Some(level) = field("level").and_then(|l| l.trim().parse::<u32>().ok()) else {
            continue;
        };
        let Some(shared) = field("shared_cpu_list").and_then(|s| parse_list(&s).ok()) else {
            continue;
        };
        if best.as_ref().is_none_or(|(l, _)| level > *l) {
            best = Some((level, shared));
        }
    }
    best.map(|(_, cpus)| cpus)
}
