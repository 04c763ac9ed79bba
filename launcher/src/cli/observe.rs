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

    /// Check this node's GPUs before it joins a generation (`nvidia-smi` and the kernel log),
    /// again when one of its workers failed, and every SECONDS while it trains or stands by. A
    /// GPU that `nvidia-smi` cannot reach, with uncorrectable ECC errors, with memory held by
    /// another process, with clocks held back by a hardware or thermal slowdown, or with a
    /// hardware Xid in the last 10 minutes keeps the node out: it stands by, naming the GPU,
    /// and joins once the GPU passes (a run of a fixed size ends instead, exit 6). A check that
    /// cannot be made holds nothing back; a node without an NVIDIA GPU skips it in one line.
    /// `off` disables it. Default: 30.
    #[arg(
        long = "gpu-health",
        env = "DRUN_GPU_HEALTH",
        value_name = "SECONDS|off",
        default_value = "30",
        help_heading = "Metrics"
    )]
    pub gpu_health: String,
}
