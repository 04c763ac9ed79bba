//! The CPUs a local rank is bound to under each mode (pure, over a [`Topology`]), as torchrun
//! 2.9+ computes them (`torch/numa/binding.py`): the same sets for the same node.

use std::collections::BTreeMap;

use super::topology::{Cpus, Topology};
use super::{NumaError, NumaMode};

/// The CPUs the worker using GPU `device` is bound to under `mode`, among the CPUs the agent
/// may use (`allowed`), and the NUMA node the GPU sits on.
pub fn cpus_for(
    mode: NumaMode,
    device: usize,
    topo: &Topology,
    allowed: &Cpus,
) -> Result<Cpus, NumaError> {
    let node = node_of(device, topo)?;
    let cpus = match mode {
        NumaMode::Node => allowed_on(node, topo, allowed),
        NumaMode::Socket => {
            let socket = socket_of(node, topo, allowed)?;
            let mut cpus = Cpus::new();
            for &other in topo.node_cpus.keys() {
                if socket_of(other, topo, allowed).ok() == Some(socket) {
                    cpus.extend(allowed_on(other, topo, allowed));
                }
            }
            cpus
        }
        NumaMode::Exclusive => exclusive(device, node, topo, allowed)?,
        NumaMode::CoreComplex => core_complex(device, node, topo, allowed),
    };
    if cpus.is_empty() {
        return Err(NumaError::NoCpu { node });
    }
    Ok(cpus)
}

fn node_of(device: usize, topo: &Topology) -> Result<usize, NumaError> {
    topo.gpus
        .get(device)
        .map(|g| g.node)
        .ok_or(NumaError::NoDevice {
            device,
            count: topo.gpus.len(),
        })
}

fn allowed_on(node: usize, topo: &Topology, allowed: &Cpus) -> Cpus {
    topo.node_cpus
        .get(&node)
        .map(|c| c.intersection(allowed).copied().collect())
        .unwrap_or_default()
}

/// The socket of a NUMA node: that of its lowest allowed CPU.
fn socket_of(node: usize, topo: &Topology, allowed: &Cpus) -> Result<usize, NumaError> {
    let cpu = allowed_on(node, topo, allowed)
        .first()
        .copied()
        .ok_or(NumaError::NoCpu { node })?;
    topo.socket
        .get(&cpu)
        .copied()
        .ok_or_else(|| NumaError::Topology(format!("cpu{cpu}: no socket")))
}

/// The devices on `node`, in index order, and where `device` is among them.
fn rank_on_node(device: usize, node: usize, topo: &Topology) -> (usize, usize) {
    let on_node: Vec<usize> = (0..topo.gpus.len())
        .filter(|&d| topo.gpus[d].node == node)
        .collect();
    let i = on_node
        .iter()
        .position(|&d| d == device)
        .expect("the device is on its own node");
    (i, on_node.len())
}

/// Groups the allowed CPUs of `node` by `key` (the lowest CPU of a group stands for it).
fn groups(
    node: usize,
    topo: &Topology,
    allowed: &Cpus,
    key: impl Fn(usize) -> Option<usize>,
) -> BTreeMap<usize, Cpus> {
    let mut out: BTreeMap<usize, Cpus> = BTreeMap::new();
    for cpu in allowed_on(node, topo, allowed) {
        out.entry(key(cpu).unwrap_or(cpu)).or_default().insert(cpu);
    }
    out
}

/// The node's physical cores divided evenly among its devices, the first ones one core more
/// when they do not divide.
fn exclusive(
    device: usize,
    node: usize,
    topo: &Topology,
    allowed: &Cpus,
) -> Result<Cpus, NumaError> {
    let (i, n) = rank_on_node(device, node, topo);
    let cores = groups(node, topo, allowed, |cpu| {
        topo.siblings.get(&cpu).and_then(|s| s.first().copied())
    });
    let (each, extra) = (cores.len() / n, cores.len() % n);
    if each == 0 {
        return Err(NumaError::TooFewCores {
            node,
            cores: cores.len(),
            devices: n,
        });
    }
    let start = i * each + i.min(extra);
    let end = start + each + usize::from(i < extra);
    Ok(cores
        .into_values()
        .skip(start)
        .take(end - start)
        .flatten()
        .collect())
}

/// One last-level-cache domain of the node per device, the largest first, round robin when
/// there are more devices than domains.
fn core_complex(device: usize, node: usize, topo: &Topology, allowed: &Cpus) -> Cpus {
    let (i, _) = rank_on_node(device, node, topo);
    let mut caches: Vec<(usize, Cpus)> = groups(node, topo, allowed, |cpu| {
        topo.llc.get(&cpu).and_then(|s| s.first().copied())
    })
    .into_iter()
    .collect();
    caches.sort_by_key(|(first, cpus)| (std::cmp::Reverse(cpus.len()), *first));
    if caches.is_empty() {
        return Cpus::new();
    }
    let n = caches.len();
    caches.swap_remove(i % n).1
}
