//! The agent's metric families and their registration (`drun_` prefix, base units, `_total`
//! counters); the names, types and labels are listed in `docs/operating/metrics.md`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A float gauge.
pub type GaugeF = Gauge<f64, AtomicU64>;
/// A float counter.
pub type CounterF = Counter<f64, AtomicU64>;

/// Buckets of the duration histograms, in seconds (10 ms to 10 min).
pub const SECONDS_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0,
];

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

/// `{cause}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    /// For re-forms one of `drun_rendezvous::server::metrics::CAUSES`; for restarts `failure` or
    /// `membership`.
    pub cause: String,
}

/// `{phase}`: `stop`, `form`, `spawn` or `first_progress`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// The restart phase.
    pub phase: String,
}

/// `{rank}`: a global rank of this node.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankLabel {
    /// The global rank (`RANK`).
    pub rank: u32,
}

/// `{code, signal}`: one of them set, the other empty.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExitLabels {
    /// Exit status, or empty when killed by a signal.
    pub code: String,
    /// Signal name (`SIGKILL`), or empty for an exit status.
    pub signal: String,
}

/// `{src_node, dst_node}`: a directed link of `--preflight`'s ring.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LinkLabel {
    /// Sending node rank.
    pub src_node: u32,
    /// Receiving node rank.
    pub dst_node: u32,
}

/// Every family of the agent.
#[derive(Debug)]
pub struct Families {
    pub(super) generation: Gauge,
    pub(super) waiting: Gauge,
    pub(super) members: Gauge,
    pub(super) world_size: Gauge,
    pub(super) reforms: Family<CauseLabel, Counter>,
    pub(super) restarts: Family<CauseLabel, Counter>,
    pub(super) phases: Family<PhaseLabel, Histogram, fn() -> Histogram>,
    pub(super) restart_seconds: Histogram,
    pub(super) worker_exits: Family<ExitLabels, Counter>,
    pub(super) ckpt_commits: Counter,
    pub(super) ckpt_seals: Counter,
    pub(super) ckpt_verify: Histogram,
    pub(super) ckpt_persisted: Counter,
    pub(super) ckpt_replicated: Counter,
    pub(super) ckpt_replica_bytes: Gauge,
    pub(super) ckpt_staged_bytes: Gauge,
    pub(super) ckpt_persist_lag: GaugeF,
    pub(super) lost_seconds: CounterF,
    pub(super) lost_steps: Counter,
    pub(super) committed_seconds: CounterF,
    pub(super) goodput: GaugeF,
    pub(super) rank_step_seconds: Family<RankLabel, GaugeF>,
    pub(super) rank_steps: Family<RankLabel, Counter>,
    pub(super) rank_samples: Family<RankLabel, GaugeF>,
    pub(super) rank_straggler: Family<RankLabel, Gauge>,
    pub(super) worker_rss: Family<RankLabel, Gauge>,
    pub(super) worker_cpu: Family<RankLabel, CounterF>,
    pub(super) preflight_seconds: GaugeF,
    pub(super) preflight_busbw: GaugeF,
    pub(super) preflight_link_bw: Family<LinkLabel, GaugeF>,
    pub(super) preflight_link_latency: Family<LinkLabel, GaugeF>,
    pub(super) preflight_link_slow: Family<LinkLabel, Gauge>,
    pub(super) gpu_unhealthy: Gauge,
}

impl Default for Families {
    fn default() -> Self {
        Self::new()
    }
}

impl Families {
    /// Every family, empty.
    pub fn new() -> Self {
        Self {
            generation: Gauge::default(),
            waiting: Gauge::default(),
            members: Gauge::default(),
            world_size: Gauge::default(),
            reforms: Family::default(),
            restarts: Family::default(),
            phases: Family::new_with_constructor(seconds_histogram),
            restart_seconds: seconds_histogram(),
            worker_exits: Family::default(),
            ckpt_commits: Counter::default(),
            ckpt_seals: Counter::default(),
            ckpt_verify: seconds_histogram(),
            ckpt_persisted: Counter::default(),
            ckpt_replicated: Counter::default(),
            ckpt_replica_bytes: Gauge::default(),
            ckpt_staged_bytes: Gauge::default(),
            ckpt_persist_lag: GaugeF::default(),
            lost_seconds: CounterF::default(),
            lost_steps: Counter::default(),
            committed_seconds: CounterF::default(),
            goodput: GaugeF::default(),
            rank_step_seconds: Family::default(),
            rank_steps: Family::default(),
            rank_samples: Family::default(),
            rank_straggler: Family::default(),
            worker_rss: Family::default(),
            worker_cpu: Family::default(),
            preflight_seconds: GaugeF::default(),
            preflight_busbw: GaugeF::default(),
            preflight_link_bw: Family::default(),
            preflight_link_latency: Family::default(),
            preflight_link_slow: Family::default(),
            gpu_unhealthy: Gauge::default(),
        }
    }

    /// Registers every family in `r` (which adds the `drun_` prefix).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "generation",
            "Generation this node runs (the fencing token)",
            self.generation.clone(),
        );
        r.register(
            "waiting",
            "1 while this node asked to join and has no plan yet (a standby while a generation runs)",
            self.waiting.clone(),
        );
        r.register(
            "members",
            "Nodes in this node's generation",
            self.members.clone(),
        );
        r.register(
            "world_size",
            "Workers (ranks) in this node's generation",
            self.world_size.clone(),
        );
        r.register(
            "reforms",
            "Re-forms this node went through, by cause",
            self.reforms.clone(),
        );
        r.register(
            "restarts",
            "Job-wide group restarts, by cause (failure: spends --max-restarts; membership: free)",
            self.restarts.clone(),
        );
        r.register("restart_phase_seconds", "Duration of each restart phase: stop (failure detected to workers stopped), form (to group formed), spawn (to workers spawned), first_progress (to the first step beacon)", self.phases.clone());
        r.register(
            "restart_seconds",
            "Duration of a restart, failure detected to workers spawned",
            self.restart_seconds.clone(),
        );
        r.register(
            "worker_exits",
            "Worker process exits, by exit code or signal",
            self.worker_exits.clone(),
        );
        r.register(
            "ckpt_commits",
            "Checkpoint commits this node sent (one per step, its ranks batched)",
            self.ckpt_commits.clone(),
        );
        r.register(
            "ckpt_seals",
            "Checkpoints sealed while this node ran",
            self.ckpt_seals.clone(),
        );
        r.register(
            "ckpt_verify_seconds",
            "Verification of the resume point before spawning",
            self.ckpt_verify.clone(),
        );
        r.register(
            "ckpt_persisted",
            "Checkpoint steps staged in memory that this node persisted to --ckpt-dir (--ckpt-memory)",
            self.ckpt_persisted.clone(),
        );
        r.register(
            "ckpt_replicated",
            "Checkpoint steps staged in memory that this node copied to its ring neighbour's agent, verified there (--ckpt-replicas)",
            self.ckpt_replicated.clone(),
        );
        r.register(
            "ckpt_replica_bytes",
            "Bytes of other nodes' checkpoints this node holds in memory as replicas (--ckpt-replicas)",
            self.ckpt_replica_bytes.clone(),
        );
        r.register(
            "ckpt_staged_bytes",
            "Bytes of checkpoints this node holds in memory (--ckpt-memory)",
            self.ckpt_staged_bytes.clone(),
        );
        r.register(
            "ckpt_persist_lag_seconds",
            "Age of the oldest staged checkpoint not yet persisted to --ckpt-dir (0: none)",
            self.ckpt_persist_lag.clone(),
        );
        r.register(
            "lost_work_seconds",
            "Wall time since the last sealed checkpoint, thrown away at re-forms",
            self.lost_seconds.clone(),
        );
        r.register(
            "lost_work_steps",
            "Steps since the last sealed checkpoint, thrown away at re-forms",
            self.lost_steps.clone(),
        );
        r.register(
            "committed_step_seconds",
            "Wall time of this node's steps that a sealed checkpoint made durable",
            self.committed_seconds.clone(),
        );
        r.register(
            "goodput_ratio",
            "committed_step_seconds over the agent's wall time (0..1)",
            self.goodput.clone(),
        );
        r.register(
            "rank_step_seconds",
            "Seconds per step of each local rank, between its last two step beacons",
            self.rank_step_seconds.clone(),
        );
        r.register(
            "rank_steps",
            "Steps each local rank advanced, from its step beacons",
            self.rank_steps.clone(),
        );
        r.register(
            "rank_samples_per_second",
            "Samples per second of each local rank (beacons that carry samples)",
            self.rank_samples.clone(),
        );
        r.register(
            "rank_straggler",
            "1 while a local rank is a straggler (--straggler-factor), else 0",
            self.rank_straggler.clone(),
        );
        r.register(
            "worker_resident_memory_bytes",
            "Resident memory of each running worker process",
            self.worker_rss.clone(),
        );
        r.register(
            "worker_cpu_seconds",
            "CPU time (user + system) of each rank's worker processes",
            self.worker_cpu.clone(),
        );
        self.register_preflight(r);
    }

    fn register_preflight(&self, r: &mut Registry) {
        r.register(
            "preflight_seconds",
            "Wall time of the --preflight check",
            self.preflight_seconds.clone(),
        );
        r.register(
            "preflight_allreduce_bus_bytes_per_second",
            "--preflight all_reduce bus bandwidth over all ranks (as nccl-tests)",
            self.preflight_busbw.clone(),
        );
        r.register(
            "preflight_link_bytes_per_second",
            "--preflight bandwidth of the ring links this node sends on",
            self.preflight_link_bw.clone(),
        );
        r.register(
            "preflight_link_latency_seconds",
            "--preflight one-way latency of the ring links this node sends on",
            self.preflight_link_latency.clone(),
        );
        r.register(
            "preflight_link_slow",
            "1 for a link --preflight named slow, else 0",
            self.preflight_link_slow.clone(),
        );
        r.register(
            "gpu_unhealthy",
            "GPUs of this node that failed the last health check (--gpu-health); 0 when all pass",
            self.gpu_unhealthy.clone(),
        );
    }
}
