//! Metrics and detection flags (`--metrics-port`, `--straggler-factor`, `--preflight`),
//! flattened into [`super::Args`].

use clap::Args;

/// The metrics and detection flags, raw.
#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// Serve Prometheus metrics at `http://<this host>:PORT/metrics`, on all interfaces
    /// (OpenMetrics text: generation, members, re-forms and restarts by cause, restart-phase
    /// durations in seconds, worker exits, checkpoint commits/seals, lost work, goodput,
    /// per-rank seconds per step and samples/s, worker memory in bytes and CPU seconds; see
    /// docs/operating/metrics.md). 0 picks a free port; the address is printed at start.
    /// Default: off.
    #[arg(
        long = "metrics-port",
        env = "DRUN_METRICS_PORT",
        value_name = "PORT",
        help_heading = "Metrics"
    )]
    pub metrics_port: Option<u16>,

    /// Report a straggler: a rank whose median step time over its last 20 step beacons
    /// (`drun.progress`) exceeds FACTOR × the median of the job's other ranks (every node
    /// shares its ranks' pace through the rendezvous every 5 s, up to 64 nodes; beyond, the
    /// other ranks on its node) for 20 steps in a row. One warning line names the rank, node, host, its seconds per step and
    /// the median; another when it recovers (under 0.9 × FACTOR). 0 turns it off; otherwise
    /// > 1. Default: 1.5.
    #[arg(
        long = "straggler-factor",
        env = "DRUN_STRAGGLER_FACTOR",
        value_name = "FACTOR",
        default_value_t = 1.5,
        help_heading = "Metrics"
    )]
    pub straggler_factor: f64,

    /// Before the run's first generation trains, measure the interconnect with the job's own
    /// backend (gloo on CPU, NCCL on GPU): an `all_reduce` over all ranks, then a ring of
    /// node-to-node links. Node rank 0 prints one table (bandwidth and latency per link, the
    /// slow ones named, the check's total time); the script then runs in the same process.
    /// Needs torch in the worker interpreter (else it says so and skips); re-forms skip it.
    #[arg(long, env = "DRUN_PREFLIGHT", help_heading = "Metrics")]
    pub preflight: bool,

    /// With `--preflight`: name every link slower than this many Gbit/s (besides those under
    /// half the median link, which are always named).
    #[arg(
        long = "preflight-min-gbps",
        env = "DRUN_PREFLIGHT_MIN_GBPS",
        value_name = "GBIT_PER_S",
        help_heading = "Metrics"
    )]
    pub preflight_min_gbps: Option<f64>,
}
