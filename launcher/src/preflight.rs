//! `--preflight`: before the run's first generation trains, its workers measure the interconnect
//! with the job's own backend — an `all_reduce` over all ranks, a ring of node-to-node links,
//! and an `all_reduce` within each node ([`within`]) — and the agent names the links and nodes
//! that are slow.
//!
//! # How it runs
//!
//! The measuring is Python (`python/drun/preflight.py`, embedded here and written next to the
//! worker API socket): with `--preflight` the workers of a generation that is the run's first
//! (no restart of either kind yet) start as `python -u <dir>/preflight.py MODE TARGET ARGS...`
//! instead of `python -u TARGET ARGS...`. The script measures, reports over the worker API
//! (`{"op":"preflight", ...}`, see [`Outcome`]) and then runs TARGET in the same process with
//! `runpy`, so the interpreter and torch are loaded once and the process the agent supervises
//! is the training process. Re-forms skip the check (recovery time stays what it was).
//!
//! Not run, with one line at start: `--no-python` (no interpreter to measure in) and
//! `--worker-store rank0` (the check needs the agent-hosted store, where it keeps its keys under
//! `drun-preflight/`).
//!
//! # Verdict
//!
//! [`judge`] is pure: a link is slow when its bandwidth is under `--preflight-min-gbps`, or
//! under half the median of the job's links (nccl-tests' rule of thumb: below half the expected
//! bandwidth it is configuration, not the algorithm). Units are Gbit/s throughout.

mod table;
pub mod within;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::command::{EntryKind, Entrypoint};

pub use table::{lines, summary};
pub use within::{expected, Expected, Within};

/// The measuring script, run by the worker interpreter.
pub const SCRIPT: &str = include_str!("../../python/drun/preflight.py");
/// Its file name next to the worker API socket.
pub const SCRIPT_NAME: &str = "preflight.py";

/// One rank's answer over the worker API: a report (local rank 0 of every node), a reason it
/// skipped (no torch), or the error that stopped it (any rank). The script runs in every case.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Outcome {
    /// Global rank.
    pub rank: u32,
    /// The job's measurements.
    #[serde(default)]
    pub report: Option<Report>,
    /// Why it did not measure (one line).
    #[serde(default)]
    pub skipped: Option<String>,
    /// What went wrong (one line).
    #[serde(default)]
    pub error: Option<String>,
}

/// The whole job's measurements (every node's report holds all of them).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Report {
    /// `gloo` or `nccl`.
    pub backend: String,
    /// Ranks measured.
    pub world_size: u32,
    /// Nodes measured.
    pub nodes: u32,
    /// The all-ranks `all_reduce`.
    pub all_reduce: AllReduce,
    /// The node-to-node ring, by source node rank.
    pub links: Vec<Link>,
    /// Wall time of the check, seconds (process group set-up to tear-down).
    pub seconds: f64,
    /// Seconds spent measuring (every rank connected to the last link's slot): bounded by the
    /// check's budgets whatever the links.
    #[serde(default)]
    pub measure_seconds: f64,
    /// Every node's all_reduce among its own ranks (none when a node has a single rank).
    #[serde(default)]
    pub within: Vec<Within>,
}

/// The `all_reduce` test: median of 5 timed runs after a warm-up.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct AllReduce {
    /// Buffer size, bytes.
    pub bytes: u64,
    /// Median time of one `all_reduce`, seconds.
    pub seconds: f64,
    /// Algorithm bandwidth (size / time), Gbit/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth (algorithm bandwidth × 2(n−1)/n, as nccl-tests), Gbit/s.
    pub busbw_gbps: f64,
}

/// One directed link of the ring, between the local ranks 0 of two nodes.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Link {
    /// Sending node rank.
    pub src: u32,
    /// Receiving node rank.
    pub dst: u32,
    /// Sending node's hostname.
    pub src_host: String,
    /// Receiving node's hostname.
    pub dst_host: String,
    /// Bulk transfer bandwidth, Gbit/s.
    pub gbps: f64,
    /// Half the median round trip of a one-element message, microseconds.
    pub latency_us: f64,
    /// Bytes the link moved in its time slot.
    #[serde(default)]
    pub bytes: u64,
    /// Seconds from the slot's start until its last chunk arrived.
    #[serde(default)]
    pub seconds: f64,
}

/// Why a link is named slow, one phrase; `None` for a link that is fine.
pub type Slow = Option<String>;

/// Judges every link of `links` (same order): under `min_gbps` (`--preflight-min-gbps`),
/// touching a node of [`slow_nodes`] (both of that node's links say so, whichever of them is
/// also under the median rule: a trial read two reasons for one slow node), or under half the
/// median bandwidth of all links (with at least two links).
pub fn judge(links: &[Link], min_gbps: Option<f64>) -> Vec<Slow> {
    let median = median(links.iter().map(|l| l.gbps).collect());
    let nodes = slow_nodes(links);
    links
        .iter()
        .map(|l| {
            let node = nodes.iter().find(|n| n.node == l.src || n.node == l.dst);
            match (min_gbps, median, node) {
                (Some(min), _, _) if l.gbps < min => {
                    Some(format!("below --preflight-min-gbps {min}"))
                }
                (_, _, Some(n)) => Some(format!(
                    "node {} is slow (under half the links between the other nodes, {:.2} Gbit/s)",
                    n.node, n.others
                )),
                (_, Some(m), None) if links.len() >= 2 && l.gbps < m / 2.0 => {
                    Some(format!("below half the median link ({m:.2} Gbit/s)"))
                }
                _ => None,
            }
        })
        .collect()
}

/// A node to blame for its slow links.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowNode {
    /// Node rank.
    pub node: u32,
    /// Its host.
    pub host: String,
    /// Bandwidth of its incoming and outgoing ring links, Gbit/s.
    pub gbps_in: f64,
    /// See `gbps_in`.
    pub gbps_out: f64,
    /// The median of the links between the other nodes, Gbit/s.
    pub others: f64,
}

/// The nodes to blame: in a ring of at least 3 nodes, a node whose incoming and outgoing links
/// are both under half the median of the links between the other nodes (a slow NIC, cable or
/// host explains both). With 2 nodes both links touch both nodes and nothing can be told apart.
/// This also finds the node of a 3-node ring, where its 2 slow links are the median.
pub fn slow_nodes(links: &[Link]) -> Vec<SlowNode> {
    let mut out = Vec::new();
    for out_link in links {
        let k = out_link.src;
        let Some(in_link) = links.iter().find(|l| l.dst == k) else {
            continue;
        };
        let others = links
            .iter()
            .filter(|l| l.src != k && l.dst != k)
            .map(|l| l.gbps)
            .collect();
        let Some(m) = median(others) else { continue };
        if out_link.gbps < m / 2.0 && in_link.gbps < m / 2.0 {
            out.push(SlowNode {
                node: k,
                host: out_link.src_host.clone(),
                gbps_in: in_link.gbps,
                gbps_out: out_link.gbps,
                others: m,
            });
        }
    }
    out.sort_by_key(|n| n.node);
    out
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Why `--preflight` cannot run with this entrypoint and worker store, if it cannot.
pub fn unsupported(entry: &Entrypoint, agent_store: bool) -> Option<&'static str> {
    if entry.kind == EntryKind::Binary {
        Some("--no-python runs no interpreter to measure in")
    } else if !agent_store {
        Some("it needs the agent-hosted worker store (--worker-store agent, the default)")
    } else {
        None
    }
}

/// The worker argv (after the interpreter) that runs the check in `script`, then the
/// entrypoint's target with its arguments (local rank macros substituted).
pub fn argv(entry: &Entrypoint, script: &Path, local_rank: u32) -> Vec<String> {
    let mode = match entry.kind {
        EntryKind::Module => "module",
        EntryKind::RunPath => "run-path",
        EntryKind::Script | EntryKind::Binary => "script",
    };
    let user = entry.argv(local_rank);
    let args = &user[entry.leading.len()..];
    [
        "-u".to_string(),
        script.display().to_string(),
        mode.into(),
        entry.script.clone(),
    ]
    .into_iter()
    .chain(args.iter().cloned())
    .collect()
}

/// Writes the script into `dir` (the worker API socket's private directory).
///
/// # Errors
/// The file cannot be written.
pub fn install(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join(SCRIPT_NAME);
    std::fs::write(&path, SCRIPT)?;
    Ok(path)
}

#[cfg(test)]
mod tests;
