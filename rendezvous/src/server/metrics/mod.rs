//! Prometheus metrics of the rendezvous side, served at `drun-rendezvous serve
//! --metrics-addr HOST:PORT` (see `docs/operating/metrics.md`).
//!
//! The families live in one process-wide [`RendezvousMetrics`] ([`global`]): the sessions,
//! the lease keeper and the etcd client count into it wherever they run — in a server, or
//! inside an agent for `--rdzv-backend etcd` and the embedded store. Label cardinality is
//! bounded: a run id and a cause from [`CAUSES`], never a node id.
//!
//! * [`cause`] — the re-form reason as a label;
//! * [`http`] — the tiny `GET /metrics` server both binaries use.

use std::sync::OnceLock;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

mod cause;
pub mod http;

pub use cause::{reform_cause, CAUSES};

use crate::Plan;

/// `{run}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabel {
    /// The run id (`--rdzv-id`).
    pub run: String,
}

/// `{run, cause}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReformLabels {
    /// The run id.
    pub run: String,
    /// One of [`CAUSES`].
    pub cause: String,
}

/// The rendezvous side's metric families (names as exposed, `drun_rdzv_` prefix).
#[derive(Debug)]
pub struct RendezvousMetrics {
    registry: Registry,
    /// `drun_rdzv_sessions{run}`: agent sessions open on this process.
    pub sessions: Family<RunLabel, Gauge>,
    /// `drun_rdzv_waiting{run}`: sessions here whose agent asked to join and has no plan yet
    /// (standbys while a generation runs; nodes gathering before a formation).
    pub waiting: Family<RunLabel, Gauge>,
    /// `drun_rdzv_generation{run}`: the newest generation a session here announced.
    pub generation: Family<RunLabel, Gauge>,
    /// `drun_rdzv_members{run}`: nodes in that generation.
    pub members: Family<RunLabel, Gauge>,
    /// `drun_rdzv_world_size{run}`: workers in that generation.
    pub world_size: Family<RunLabel, Gauge>,
    /// `drun_rdzv_reforms_total{run,cause}`: generations this process closed for a re-form.
    pub reforms: Family<ReformLabels, Counter>,
    /// `drun_rdzv_lease_keepalive_failures_total`: lease renewals that failed — an agent's
    /// (retried until its TTL, then it is fenced) or a server's shared carrier lease.
    pub keepalive_failures: Counter,
    /// `drun_rdzv_etcd_request_errors_total`: etcd requests that failed (each attempt).
    pub etcd_errors: Counter,
    /// `drun_rdzv_ckpt_interval_seconds{run}`: the `--ckpt-interval` in force (node rank 0's
    /// session decides it).
    pub ckpt_interval: Family<RunLabel, SecondsGauge>,
    /// `drun_rdzv_ckpt_save_cost_seconds{run}`: C, the save cost the interval uses.
    pub ckpt_save_cost: Family<RunLabel, SecondsGauge>,
    /// `drun_rdzv_ckpt_persist_seconds{run}`: `--ckpt-memory`, how long staged checkpoints take
    /// to reach `--ckpt-dir` behind the training (C is then the stall alone); 0 without.
    pub ckpt_persist: Family<RunLabel, SecondsGauge>,
    /// `drun_rdzv_mtbf_seconds{run}`: M, the mean time between failures it uses.
    pub mtbf: Family<RunLabel, SecondsGauge>,
    /// `drun_rdzv_ckpt_expected_loss_seconds{run}`: expected work lost per failure.
    pub ckpt_expected_loss: Family<RunLabel, SecondsGauge>,
    /// `drun_rdzv_reform_lost_work_seconds{run}`: the work the last re-form lost.
    pub reform_lost_work: Family<RunLabel, SecondsGauge>,
}

/// A gauge of seconds (fractions kept).
pub type SecondsGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

impl RendezvousMetrics {
    /// A fresh set of families, registered under `drun_rdzv_`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("drun_rdzv");
        let m = Self {
            registry: Registry::default(),
            sessions: Family::default(),
            waiting: Family::default(),
            generation: Family::default(),
            members: Family::default(),
            world_size: Family::default(),
            reforms: Family::default(),
            keepalive_failures: Counter::default(),
            etcd_errors: Counter::default(),
            ckpt_interval: Family::default(),
            ckpt_save_cost: Family::default(),
            ckpt_persist: Family::default(),
            mtbf: Family::default(),
            ckpt_expected_loss: Family::default(),
            reform_lost_work: Family::default(),
        };
        for (name, help, f) in [
            (
                "ckpt_interval_seconds",
                "Checkpoint interval in force (--ckpt-interval)",
                &m.ckpt_interval,
            ),
            (
                "ckpt_save_cost_seconds",
                "Save cost C the interval uses: the time the training waited (first rank's save start to seal, or to the staged answer with --ckpt-memory), mean of the newest",
                &m.ckpt_save_cost,
            ),
            (
                "ckpt_persist_seconds",
                "--ckpt-memory: time staged checkpoints take to reach --ckpt-dir behind the training (staged answer to seal), mean of the newest; 0 without",
                &m.ckpt_persist,
            ),
            (
                "mtbf_seconds",
                "Mean time between failures M the interval uses",
                &m.mtbf,
            ),
            (
                "ckpt_expected_loss_seconds",
                "Expected work lost per failure: interval/2 + restart cost",
                &m.ckpt_expected_loss,
            ),
            (
                "reform_lost_work_seconds",
                "Work the last re-form lost (running time after the checkpoint resumed from)",
                &m.reform_lost_work,
            ),
        ] {
            registry.register(name, help, f.clone());
        }
        registry.register(
            "sessions",
            "Agent sessions open on this process",
            m.sessions.clone(),
        );
        registry.register(
            "waiting",
            "Agents here waiting to join: standbys while a generation runs, or nodes gathering",
            m.waiting.clone(),
        );
        registry.register(
            "generation",
            "Newest generation formed (the fencing token)",
            m.generation.clone(),
        );
        registry.register(
            "members",
            "Nodes in the newest generation",
            m.members.clone(),
        );
        registry.register(
            "world_size",
            "Workers (ranks) in the newest generation",
            m.world_size.clone(),
        );
        registry.register(
            "reforms",
            "Generations closed for a re-form by this process, by cause",
            m.reforms.clone(),
        );
        registry.register(
            "lease_keepalive_failures",
            "Lease keep-alives that failed (agent leases, and the server's shared carrier leases)",
            m.keepalive_failures.clone(),
        );
        registry.register(
            "etcd_request_errors",
            "etcd requests that failed (every attempt)",
            m.etcd_errors.clone(),
        );
        Self { registry, ..m }
    }

    /// The checkpoint interval of `run` was (re-)evaluated.
    pub fn interval(&self, run: &str, i: &crate::decisions::ckpt_interval::Interval) {
        let l = RunLabel { run: run.into() };
        self.ckpt_interval.get_or_create(&l).set(i.interval_s);
        self.ckpt_save_cost.get_or_create(&l).set(i.cost_s);
        self.ckpt_persist
            .get_or_create(&l)
            .set(i.persist_s.unwrap_or(0.0));
        self.mtbf.get_or_create(&l).set(i.mtbf_s);
        self.ckpt_expected_loss
            .get_or_create(&l)
            .set(i.expected_loss_s);
    }

    /// A generation formed: its number, nodes and ranks for its run (never moves back).
    pub fn formed(&self, plan: &Plan) {
        let l = RunLabel {
            run: plan.run_id.clone(),
        };
        let g = i64::try_from(plan.generation).unwrap_or(i64::MAX);
        if self.generation.get_or_create(&l).get() > g {
            return;
        }
        self.generation.get_or_create(&l).set(g);
        self.members.get_or_create(&l).set(plan.node_count() as i64);
        self.world_size
            .get_or_create(&l)
            .set(i64::from(plan.world_size));
    }

    /// This process closed a generation of `run` for a re-form, with `reason`.
    pub fn reformed(&self, run: &str, reason: &str) {
        self.reforms
            .get_or_create(&ReformLabels {
                run: run.to_string(),
                cause: reform_cause(reason).to_string(),
            })
            .inc();
    }

    /// An agent session of `run` opened (`+1`) or closed (`-1`).
    pub fn session(&self, run: &str, delta: i64) {
        self.sessions
            .get_or_create(&RunLabel {
                run: run.to_string(),
            })
            .inc_by(delta);
    }

    /// An agent session of `run` started (`+1`) or stopped (`-1`) waiting for a plan.
    pub fn waiting(&self, run: &str, delta: i64) {
        self.waiting
            .get_or_create(&RunLabel {
                run: run.to_string(),
            })
            .inc_by(delta);
    }

    /// The OpenMetrics text of every family (ends with `# EOF`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("encoding into a String cannot fail");
        out
    }
}

impl Default for RendezvousMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The process-wide families.
pub fn global() -> &'static RendezvousMetrics {
    static GLOBAL: OnceLock<RendezvousMetrics> = OnceLock::new();
    GLOBAL.get_or_init(RendezvousMetrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{assign, Candidate};

    fn plan(g: u64, nodes: &[&str]) -> Plan {
        let c: Vec<Candidate> = nodes
            .iter()
            .map(|id| Candidate {
                node_id: id.to_string(),
                advertise_addr: id.to_string(),
                slots: 2,
                requested_node_rank: None,
                master_port: 1,
                probe_port: 0,
            })
            .collect();
        assign("r1", g, &c, 0, 0).unwrap()
    }

    #[test]
    fn families_encode_with_prefix_labels_and_total_suffix() {
        let m = RendezvousMetrics::new();
        m.session("r1", 1);
        m.waiting("r1", 1);
        m.waiting("r1", -1);
        m.formed(&plan(2, &["a", "b", "c"]));
        m.formed(&plan(1, &["a"])); // late news of an older generation changes nothing
        m.reformed("r1", "node c (c, ranks 4-5) lost: lease expired");
        m.keepalive_failures.inc();
        let text = m.render();
        for line in [
            "drun_rdzv_sessions{run=\"r1\"} 1",
            "drun_rdzv_waiting{run=\"r1\"} 0",
            "drun_rdzv_generation{run=\"r1\"} 2",
            "drun_rdzv_members{run=\"r1\"} 3",
            "drun_rdzv_world_size{run=\"r1\"} 6",
            "drun_rdzv_reforms_total{run=\"r1\",cause=\"node_lost\"} 1",
            "drun_rdzv_lease_keepalive_failures_total 1",
            "drun_rdzv_etcd_request_errors_total 0",
            "# TYPE drun_rdzv_reforms counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
