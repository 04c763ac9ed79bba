//! `--numa-binding`: each worker runs on the CPUs near its GPU, as with torchrun 2.9+.
//!
//! # Theory of operation
//!
//! At start the agent reads the node's topology once ([`topology::read_topology`]): the GPUs
//! the workers see (the NVIDIA driver's `/proc/driver/nvidia/gpus/<PCI address>`, in PCI order,
//! narrowed and ordered by `CUDA_VISIBLE_DEVICES` as CUDA does), each GPU's NUMA node
//! (`/sys/bus/pci/devices/<address>/numa_node`), and each NUMA node's CPUs with their cores,
//! sockets and last-level caches. The worker of local rank `r` uses GPU `r`, as torchrun
//! assumes; [`cpus::cpus_for`] picks its CPUs by torchrun's modes ([`NumaMode`]), among the
//! CPUs the agent itself may use (a cgroup's or Slurm's cpuset is respected). Each worker is
//! then started bound to them (`sched_setaffinity` between fork and exec, so every thread it
//! ever starts inherits them); a warm interpreter is started bound to its rank's CPUs, so a
//! warm worker is bound from its first instruction too. One line per node says what each local
//! rank got.
//!
//! Memory follows the CPUs by the kernel's default first-touch policy, as with torchrun, which
//! binds CPUs only. A node without an NVIDIA GPU, a local rank without a GPU, or a NUMA node
//! with too few cores for its GPUs is bad input: one line naming it, exit 2, nothing started.

pub mod cpus;
pub mod topology;

use std::path::Path;
use std::str::FromStr;

use topology::{format_list, Cpus};

/// torchrun's binding modes (`torch.numa.binding.AffinityMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumaMode {
    /// Every CPU of the GPU's NUMA node.
    Node,
    /// Every CPU of every NUMA node of the GPU's socket.
    Socket,
    /// An exclusive share of the physical cores of the GPU's NUMA node.
    Exclusive,
    /// One last-level-cache domain (core complex) of the GPU's NUMA node.
    CoreComplex,
}

/// A `--numa-binding` value that is not one of torchrun's modes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected node, socket, exclusive or core-complex")]
pub struct UnknownNumaMode;

impl FromStr for NumaMode {
    type Err = UnknownNumaMode;
    fn from_str(s: &str) -> Result<Self, UnknownNumaMode> {
        match s {
            "node" => Ok(Self::Node),
            "socket" => Ok(Self::Socket),
            "exclusive" => Ok(Self::Exclusive),
            "core-complex" => Ok(Self::CoreComplex),
            _ => Err(UnknownNumaMode),
        }
    }
}

impl NumaMode {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Socket => "socket",
            Self::Exclusive => "exclusive",
            Self::CoreComplex => "core-complex",
        }
    }
}

/// Why the workers cannot be bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumaError {
    /// No NVIDIA GPU on this node.
    #[error("this node has no NVIDIA GPU (no /proc/driver/nvidia/gpus): drop --numa-binding on nodes without GPUs")]
    NoGpu,
    /// A local rank has no GPU to be near.
    #[error("local rank {device} has no GPU: this node's workers see {count} (lower --nproc-per-node, or use --nproc-per-node gpu)")]
    NoDevice {
        /// The local rank (device index).
        device: usize,
        /// How many GPUs the workers see.
        count: usize,
    },
    /// The agent may use no CPU of a GPU's NUMA node.
    #[error("the agent may use no CPU of NUMA node {node} (its cpuset excludes them)")]
    NoCpu {
        /// The NUMA node.
        node: usize,
    },
    /// `exclusive` with fewer physical cores than GPUs on a NUMA node.
    #[error(
        "NUMA node {node} has {cores} physical core(s) for {devices} GPUs: use --numa-binding node"
    )]
    TooFewCores {
        /// The NUMA node.
        node: usize,
        /// Its physical cores the agent may use.
        cores: usize,
        /// The GPUs on it.
        devices: usize,
    },
    /// A topology file could not be read or parsed.
    #[error("cannot read the node's topology: {0}")]
    Topology(String),
}

/// Each local rank's CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The mode.
    pub mode: NumaMode,
    /// By local rank.
    pub cpus: Vec<Cpus>,
    /// By local rank: the GPU's PCI address and NUMA node, for the start line.
    pub near: Vec<(String, usize)>,
}

impl Binding {
    /// Local rank `local_rank`'s CPUs.
    pub fn for_rank(&self, local_rank: u32) -> Option<&Cpus> {
        self.cpus.get(local_rank as usize)
    }

    /// The one line saying what each local rank got.
    pub fn describe(&self) -> String {
        let ranks: Vec<String> = self
            .cpus
            .iter()
            .zip(&self.near)
            .enumerate()
            .map(|(r, (cpus, (pci, node)))| {
                format!(
                    "local rank {r} → CPUs {} (GPU {pci}, NUMA node {node})",
                    format_list(cpus)
                )
            })
            .collect();
        format!(
            "--numa-binding {}: {}",
            self.mode.as_str(),
            ranks.join("; ")
        )
    }
}

/// Computes the binding of `nproc` local ranks from the topology under `root` (`/`), the GPUs
/// `cuda_visible_devices` leaves visible, among the `allowed` CPUs (pure but for the reads).
pub fn resolve(
    mode: NumaMode,
    nproc: u32,
    root: &Path,
    cuda_visible_devices: Option<&str>,
    allowed: &Cpus,
) -> Result<Binding, NumaError> {
    let topo = topology::read_topology(root, cuda_visible_devices)?;
    let mut binding = Binding {
        mode,
        cpus: Vec::new(),
        near: Vec::new(),
    };
    for r in 0..nproc as usize {
        binding.cpus.push(cpus::cpus_for(mode, r, &topo, allowed)?);
        let gpu = &topo.gpus[r];
        binding.near.push((gpu.pci.clone(), gpu.node));
    }
    Ok(binding)
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Cpus {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Cpus::new(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
