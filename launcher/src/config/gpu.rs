//! The workers' devices: `--numa-binding` (each local rank's CPUs near its GPU) and
//! `--virtual-local-rank` (each worker's own GPU as device 0).

use super::{invalid, Host};
use crate::ConfigError;

/// `--numa-binding`: each local rank's CPUs, from this node's topology (`DRUN_TOPOLOGY_ROOT`,
/// a test's fixture tree, stands for `/`) and the GPUs `CUDA_VISIBLE_DEVICES` leaves visible.
pub(super) fn numa_binding(
    mode: Option<&str>,
    nproc_per_node: u32,
    host: &Host,
) -> Result<Option<crate::numa::Binding>, ConfigError> {
    let Some(m) = mode else {
        return Ok(None);
    };
    let refuse = |why: String| invalid("--numa-binding", m, why);
    let mode: crate::numa::NumaMode = m.parse().map_err(|e| refuse(format!("{e}")))?;
    let root = std::path::Path::new(host.var("DRUN_TOPOLOGY_ROOT").unwrap_or("/"));
    crate::numa::resolve(
        mode,
        nproc_per_node,
        root,
        host.var("CUDA_VISIBLE_DEVICES"),
        &crate::numa::allowed_cpus(),
    )
    .map(Some)
    .map_err(|e| refuse(e.to_string()))
}

/// `--virtual-local-rank` picks each local rank's device from the agent's visible-devices list:
/// one shorter than `--nproc-per-node` is refused (torchrun fails the launch on it).
pub(super) fn virtual_devices(
    on: bool,
    nproc_per_node: u32,
    host: &Host,
) -> Result<(), ConfigError> {
    let var = ["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
        .into_iter()
        .find_map(|k| host.var(k).filter(|v| !v.is_empty()).map(|v| (k, v)));
    match var {
        Some((k, list)) if on && crate::env::virtual_device(Some(list), nproc_per_node - 1).is_none() => {
            Err(invalid(
                "--virtual-local-rank",
                format!("{k}={list}"),
                format!(
                    "{nproc_per_node} local ranks need {nproc_per_node} devices in {k}; list more or lower --nproc-per-node"
                ),
            ))
        }
        _ => Ok(()),
    }
}
