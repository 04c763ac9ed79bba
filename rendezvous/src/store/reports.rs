//! Node reports: what an agent learned about its run that is not rendezvous state but belongs
//! in `status` — the `--preflight` table and the node's current stragglers. An agent sends
//! [`crate::session::Request::Report`]; its session writes `reports/<kind>/<node>` (one key per
//! node and kind, overwritten; straggler and pace reports under the node's lease, so they go
//! with the node; the preflight report without, so it outlives node rank 0). The preflight is
//! written once per run, stragglers at each verdict change; the pace every few seconds, and
//! only in runs of at most [`PACE_MAX_NODES`] nodes.

use serde::{Deserialize, Serialize};

use crate::store::keys::RunKeys;

/// Largest report accepted, bytes of JSON (a 64-node preflight table is about 10 KiB).
pub const MAX_REPORT: usize = 64 << 10;

/// What a report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportKind {
    /// `--preflight`'s measurements and verdicts (node rank 0).
    Preflight,
    /// The node's current stragglers (empty list: none).
    Stragglers,
    /// The node's pace: its ranks' median seconds per step (`{"generation": G, "ranks":
    /// {"R": S, ...}}`), sent every few seconds by a node of a run of at most
    /// [`PACE_MAX_NODES`] nodes; answered with [`crate::session::Event::Pace`].
    Pace,
    /// The peers of the node's generation that do not answer its probes (`{"generation": G,
    /// "node_rank": R, "silent": [node ranks]}`; empty: all answer), sent at each change.
    Peers,
    /// A control-plane outage the node kept its generation through (`{"generation": G,
    /// "seconds": S, "ended_at_ms": T}`), sent when a server answers again.
    Outage,
    /// The node's GPUs that failed its last health check (`{"host": H, "failing": ["GPU 1
    /// (0000:3b:00.0): why", ...], "standing_by": bool}`; empty list: all pass), sent at each
    /// change of the verdict.
    Gpu,
    /// The node's ranks' flight recorder dumps after a hang, cut to what the verdict reads
    /// (`{"generation": G, "dumps": {"RANK": dump}}`, see
    /// [`crate::decisions::flight::compact`]); `status` judges every node's together.
    Flight,
    /// `--ckpt-memory`: the node's checkpoints in memory (`{"generation": G, "at_ms": T,
    /// "budget": B, "held": H, "lag_ms": L, "steps": [{"step": S, "generation": G, "state":
    /// "staged"|"persisting"|"persisted", "bytes": N}, ...]}`, `lag_ms` the age at `at_ms` of the
    /// oldest copy not yet on disk), sent at each change.
    Staging,
}

/// The largest run (nodes) whose agents exchange their pace: every node reads every other's
/// report each time it sends its own, O(N²) reads per interval.
pub const PACE_MAX_NODES: u32 = 64;

impl ReportKind {
    /// The key segment and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReportKind::Preflight => "preflight",
            ReportKind::Stragglers => "stragglers",
            ReportKind::Pace => "pace",
            ReportKind::Peers => "peers",
            ReportKind::Outage => "outage",
            ReportKind::Gpu => "gpu",
            ReportKind::Flight => "flight",
            ReportKind::Staging => "staging",
        }
    }

    /// Every kind.
    pub const ALL: [ReportKind; 8] = [
        ReportKind::Preflight,
        ReportKind::Stragglers,
        ReportKind::Pace,
        ReportKind::Peers,
        ReportKind::Outage,
        ReportKind::Gpu,
        ReportKind::Flight,
        ReportKind::Staging,
    ];

    /// The kind named `s` (the wire name), if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether the key goes with the node's lease (the preflight's and the flight recorder's
    /// outlive their nodes: they are read after the generation, or the run, ended).
    pub fn leased(self) -> bool {
        !matches!(self, ReportKind::Preflight | ReportKind::Flight)
    }
}

/// The key of `node`'s report of `kind`.
pub fn key(keys: &RunKeys, kind: ReportKind, node: &str) -> String {
    format!("{}reports/{}/{node}", keys.prefix(), kind.as_str())
}

/// Why a report is refused (size or JSON), if it is.
pub fn invalid(json: &str) -> Option<String> {
    if json.len() > MAX_REPORT {
        return Some(format!(
            "a node report of {} bytes exceeds {MAX_REPORT}",
            json.len()
        ));
    }
    serde_json::from_str::<serde_json::Value>(json)
        .err()
        .map(|e| format!("a node report is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_their_names_and_unknown_names_are_none() {
        for k in ReportKind::ALL {
            assert_eq!(ReportKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(ReportKind::parse("plan"), None);
        assert!(ReportKind::Stragglers.leased() && !ReportKind::Preflight.leased());
        assert!(ReportKind::Gpu.leased() && !ReportKind::Flight.leased());
    }

    #[test]
    fn oversized_or_non_json_reports_are_refused() {
        assert_eq!(invalid(r#"{"a":1}"#), None);
        assert!(invalid("{nope").unwrap().contains("not JSON"));
        let big = format!("\"{}\"", "x".repeat(MAX_REPORT));
        assert!(invalid(&big).unwrap().contains("exceeds"));
    }
}
