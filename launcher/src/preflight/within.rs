//! The all_reduce within each node (its own ranks: GPUs over NVLink or PCIe, shared memory on
//! CPU), judged against the other nodes and, on GPUs, against what the GPU model reaches.
//!
//! A node whose GPUs talk over a degraded path (an NVLink down, so NCCL falls back to PCIe or
//! host memory; a GPU in a slower slot) trains every step at its pace: the links between nodes
//! do not show it, its own all_reduce does.

use serde::{Deserialize, Serialize};

use super::{median, Slow};

/// One node's all_reduce among its own ranks, measured at the same time as every other node's.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Within {
    /// Node rank.
    pub node: u32,
    /// Its host.
    pub host: String,
    /// The GPU model (`torch.cuda.get_device_name`); absent on CPU.
    #[serde(default)]
    pub gpu: Option<String>,
    /// Ranks on the node.
    pub ranks: u32,
    /// Buffer size, bytes.
    pub bytes: u64,
    /// Median time of one all_reduce, seconds.
    pub seconds: f64,
    /// Bus bandwidth (as nccl-tests), Gbit/s.
    pub busbw_gbps: f64,
}

/// What an all_reduce among the GPUs of one node reaches for a GPU model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expected {
    /// Bus bandwidth, Gbit/s.
    pub gbps: f64,
    /// The path between the GPUs.
    pub path: &'static str,
}

/// What the all_reduce among a node's GPUs of `model` (as `nvidia-smi` and torch name it)
/// reaches at large sizes, from NVIDIA's published nccl-tests results for 8-GPU NVLink
/// systems (bus bandwidth, rounded down: H100/H200 SXM about 360 GB/s without NVLink
/// SHARP, A100 SXM about 230 GB/s, V100 SXM2 about 130 GB/s); `None` for a model whose path
/// between GPUs depends on the board (PCIe cards, NVLink bridges) or is not in the table.
pub fn expected(model: &str) -> Option<Expected> {
    let m = model.to_ascii_uppercase();
    let gbs = |gb_per_s: f64, path| {
        Some(Expected {
            gbps: gb_per_s * 8.0,
            path,
        })
    };
    if m.contains("PCIE") || m.contains(" NVL") {
        None
    } else if m.contains("H200")
        || (m.contains("H100") && (m.contains("HBM3") || m.contains("SXM")))
    {
        gbs(360.0, "NVLink 4")
    } else if m.contains("A100") && m.contains("SXM") {
        gbs(230.0, "NVLink 3")
    } else if m.contains("V100") && m.contains("SXM2") {
        gbs(130.0, "NVLink 2")
    } else {
        None
    }
}

/// Judges every node of `within` (same order): under half the median node (with at least two
/// nodes), or under half what its GPU model reaches ([`expected`]).
pub fn judge(within: &[Within]) -> Vec<Slow> {
    let m = median(within.iter().map(|w| w.busbw_gbps).collect());
    within
        .iter()
        .map(|w| {
            if let Some(m) = m.filter(|m| within.len() >= 2 && w.busbw_gbps < m / 2.0) {
                return Some(format!(
                    "under half the median node ({m:.2} Gbit/s): check the path between its GPUs (nvidia-smi topo -m, nvidia-smi nvlink -s)"
                ));
            }
            let gpu = w.gpu.as_deref()?;
            let e = expected(gpu)?;
            (w.busbw_gbps < e.gbps / 2.0).then(|| {
                format!(
                    "under half what {gpu} GPUs reach over {} (about {:.0} Gbit/s): check nvidia-smi topo -m and nvidia-smi nvlink -s",
                    e.path, e.gbps
                )
            })
        })
        .collect()
}

/// The table's lines for the nodes' own all_reduce: one summary line, then one per slow node.
pub fn lines(within: &[Within], slow: &[Slow]) -> Vec<String> {
    let Some(m) = median(within.iter().map(|w| w.busbw_gbps).collect()) else {
        return Vec::new();
    };
    let low = within
        .iter()
        .min_by(|a, b| a.busbw_gbps.total_cmp(&b.busbw_gbps))
        .expect("not empty: it has a median");
    let gpus = within
        .iter()
        .find_map(|w| w.gpu.as_deref())
        .map_or(String::new(), |g| format!(" ({g})"));
    let mut out = vec![format!(
        "  all_reduce within each node{gpus}: bus bandwidth median {m:.2} Gbit/s, lowest {:.2} on node {} ({}), {} ranks on a node",
        low.busbw_gbps, low.node, low.host, low.ranks
    )];
    for (w, why) in within.iter().zip(slow) {
        if let Some(why) = why {
            out.push(format!(
                "  SLOW NODE: node {} ({}): all_reduce among its {} ranks {:.2} Gbit/s, {why}",
                w.node, w.host, w.ranks, w.busbw_gbps
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(node: u32, gpu: Option<&str>, busbw_gbps: f64) -> Within {
        Within {
            node,
            host: format!("h{node}"),
            gpu: gpu.map(str::to_string),
            ranks: 8,
            bytes: 64 << 20,
            seconds: 0.001,
            busbw_gbps,
        }
    }

    #[test]
    fn the_table_knows_the_nvlink_boards_by_the_names_nvidia_smi_gives_them() {
        for (name, gbps) in [
            ("NVIDIA H100 80GB HBM3", 2880.0),
            ("NVIDIA H200", 2880.0),
            ("NVIDIA A100-SXM4-80GB", 1840.0),
            ("Tesla V100-SXM2-32GB", 1040.0),
        ] {
            assert_eq!(expected(name).map(|e| e.gbps), Some(gbps), "{name}");
        }
        for name in [
            "NVIDIA H100 PCIe",
            "NVIDIA H100 NVL",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA L40S",
            "Tesla T4",
        ] {
            assert_eq!(expected(name), None, "{name}");
        }
    }

    #[test]
    fn a_node_under_half_the_median_node_is_named_and_even_nodes_are_not() {
        let even = [
            node(0, None, 40.0),
            node(1, None, 38.0),
            node(2, None, 45.0),
        ];
        assert_eq!(judge(&even), vec![None, None, None]);
        let v = judge(&[
            node(0, None, 40.0),
            node(1, None, 12.0),
            node(2, None, 45.0),
        ]);
        assert_eq!(v[0], None);
        assert!(v[1]
            .as_deref()
            .unwrap()
            .starts_with("under half the median node (40.00 Gbit/s)"));
        assert_eq!(v[2], None);
    }

    #[test]
    fn one_node_is_judged_against_its_gpu_model_only() {
        let h100 = Some("NVIDIA H100 80GB HBM3");
        assert_eq!(judge(&[node(0, h100, 2000.0)]), vec![None]);
        let v = judge(&[node(0, h100, 1000.0)]);
        assert_eq!(
            v[0].as_deref(),
            Some("under half what NVIDIA H100 80GB HBM3 GPUs reach over NVLink 4 (about 2880 Gbit/s): check nvidia-smi topo -m and nvidia-smi nvlink -s")
        );
        assert_eq!(
            judge(&[node(0, None, 0.5)]),
            vec![None],
            "CPU: nothing to compare with"
        );
        assert_eq!(judge(&[node(0, Some("NVIDIA L40S"), 1.0)]), vec![None]);
    }

    #[test]
    fn every_node_of_a_slow_model_is_named_even_when_they_are_even() {
        let a100 = Some("NVIDIA A100-SXM4-40GB");
        let v = judge(&[node(0, a100, 300.0), node(1, a100, 310.0)]);
        assert!(v
            .iter()
            .all(|s| s.as_deref().is_some_and(|s| s.contains("NVLink 3"))));
    }

    #[test]
    fn the_lines_give_the_median_the_lowest_node_and_one_line_per_slow_node() {
        let w = [
            node(0, None, 40.0),
            node(1, None, 12.0),
            node(2, None, 45.0),
        ];
        let t = lines(&w, &judge(&w));
        assert_eq!(
            t[0],
            "  all_reduce within each node: bus bandwidth median 40.00 Gbit/s, lowest 12.00 on node 1 (h1), 8 ranks on a node"
        );
        assert_eq!(t.len(), 2);
        assert!(t[1].starts_with("  SLOW NODE: node 1 (h1): all_reduce among its 8 ranks 12.00 Gbit/s, under half the median node"));
        assert!(lines(&[], &[]).is_empty());
    }
}
