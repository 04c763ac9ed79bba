//! The agent's Prometheus metrics (`drun --metrics-port PORT`): [`AgentMetrics`] owns the
//! families ([`families`]) and what they are computed from, and is told by the agent's loop
//! what happened — formations, re-form reasons, spawns, stops, worker exits, commits, seals
//! and step beacons. Worker memory and CPU are read from `/proc` ([`procs`]) and goodput is
//! computed when `/metrics` is scraped; the HTTP side is `drun_rendezvous::server::metrics::http`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use drun_rendezvous::server::metrics::reform_cause;
use drun_rendezvous::Plan;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::os::spawn::ExitKind;
use crate::phases::RestartClock;

pub mod families;
pub mod procs;
pub mod work;

use families::{CauseLabel, ExitLabels, Families, PhaseLabel, RankLabel};
use work::WorkClock;

/// The agent's metrics: shared by the agent's loop (which records) and the HTTP server (which
/// renders). Every method is cheap and never fails.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    f: Families,
    started: Instant,
    t: Mutex<Tracker>,
}

/// What the families are computed from.
#[derive(Debug, Default)]
struct Tracker {
    /// The generation of the last formation.
    last_gen: Option<u64>,
    /// The last re-form cause the session announced, and for which generation.
    reason: Option<(u64, &'static str)>,
    /// Job-wide restart counters (failures, membership) as of the last plan.
    restarts: (u32, u32),
    /// The running generation's steps.
    work: Option<WorkClock>,
    /// The work the last stopped generation threw away (seconds, steps), counted when the
    /// next generation forms (a run that ends loses nothing).
    lost: Option<(std::time::Duration, u64)>,
    /// A restart's spawn, waiting for the first step beacon.
    spawned_at: Option<Instant>,
    /// The resume point's verification started.
    verifying_since: Option<Instant>,
    /// The running workers: rank, pid.
    workers: Vec<(u32, i32)>,
    /// CPU seconds last seen per (rank, pid).
    cpu_seen: HashMap<(u32, i32), f64>,
}

impl AgentMetrics {
    /// Fresh metrics; the agent's wall time (for goodput) starts now.
    pub fn new() -> Arc<Self> {
        let f = Families::new();
        let mut registry = Registry::with_prefix("drun");
        f.register(&mut registry);
        registry.register(
            "lease_keepalive_failures",
            "Lease keep-alives that failed in this process's sessions (--rdzv-backend etcd, embedded store)",
            drun_rendezvous::server::metrics::global().keepalive_failures.clone(),
        );
        // The checkpoint interval is decided by node rank 0's session: in this process for
        // --rdzv-backend etcd and the embedded store (a drun-rendezvous server exposes its own).
        let r = drun_rendezvous::server::metrics::global();
        for (name, help, f) in [
            (
                "ckpt_interval_seconds",
                "Checkpoint interval in force (--ckpt-interval), decided here",
                &r.ckpt_interval,
            ),
            (
                "ckpt_save_cost_seconds",
                "Save cost C the checkpoint interval uses: the time the training waited",
                &r.ckpt_save_cost,
            ),
            (
                "ckpt_persist_seconds",
                "--ckpt-memory: time staged checkpoints take to reach --ckpt-dir behind the training; 0 without",
                &r.ckpt_persist,
            ),
            (
                "mtbf_seconds",
                "Mean time between failures M the checkpoint interval uses",
                &r.mtbf,
            ),
            (
                "ckpt_expected_loss_seconds",
                "Expected work lost per failure: interval/2 + restart cost",
                &r.ckpt_expected_loss,
            ),
            (
                "reform_lost_work_seconds",
                "Work the last re-form lost after the checkpoint it resumed from",
                &r.reform_lost_work,
            ),
        ] {
            registry.register(name, help, f.clone());
        }
        Arc::new(Self {
            registry,
            f,
            started: Instant::now(),
            t: Mutex::new(Tracker::default()),
        })
    }

    fn t(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.t.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A plan arrived: generation, members, world size, job-wide restarts; a re-form when an
    /// earlier generation ran here (its cause, the work it lost).
    pub fn formed(&self, plan: &Plan, now: Instant) {
        let mut t = self.t();
        let g = plan.generation;
        self.f.waiting.set(0);
        self.f.generation.set(i64::try_from(g).unwrap_or(i64::MAX));
        self.f.members.set(plan.node_count() as i64);
        self.f.world_size.set(i64::from(plan.world_size));
        if let Some(prev) = t.last_gen.filter(|&p| g > p) {
            let cause = match t.reason {
                Some((rg, c)) if rg >= prev => c,
                _ if plan.restarts_failures > t.restarts.0 => "worker_failure",
                _ => "other",
            };
            self.f.reforms.get_or_create(&cause_label(cause)).inc();
            if let Some((secs, steps)) = t.lost.take() {
                self.f.lost_seconds.inc_by(secs.as_secs_f64());
                self.f.lost_steps.inc_by(steps);
            }
        }
        let (failures, membership) = (plan.restarts_failures, plan.restarts_membership);
        for (cause, now_n, before) in [
            ("failure", failures, t.restarts.0),
            ("membership", membership, t.restarts.1),
        ] {
            let counter = self.f.restarts.get_or_create(&cause_label(cause));
            counter.inc_by(u64::from(now_n.saturating_sub(before)));
        }
        t.restarts = (failures.max(t.restarts.0), membership.max(t.restarts.1));
        t.last_gen = Some(g);
        t.verifying_since = plan.resume.is_some().then_some(now);
        // Ranks of an earlier world may be gone.
        self.f.rank_step_seconds.clear();
        self.f.rank_samples.clear();
        self.f.rank_straggler.clear();
    }

    /// This node asked to join the next generation.
    pub fn joining(&self) {
        self.f.waiting.set(1);
    }

    /// The last GPU health check found `n` GPUs that may not train.
    pub fn gpu_unhealthy(&self, n: usize) {
        self.f
            .gpu_unhealthy
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The session said generation `generation` closed, with `reason`.
    pub fn reform(&self, generation: u64, reason: &str) {
        self.t().reason = Some((generation, reform_cause(reason)));
    }

    /// The resume point was verified (or refused).
    pub fn verified(&self, now: Instant) {
        if let Some(since) = self.t().verifying_since.take() {
            self.f
                .ckpt_verify
                .observe(now.saturating_duration_since(since).as_secs_f64());
        }
    }

    /// The workers (rank, pid) of a generation resuming after `resume_step` were spawned at
    /// `now`; `clock`: the restart that led here, if one did.
    pub fn spawned(
        &self,
        clock: Option<&RestartClock>,
        resume_step: u64,
        workers: Vec<(u32, i32)>,
        now: Instant,
    ) {
        let mut t = self.t();
        if let Some(c) = clock {
            let stopped = c.stopped.unwrap_or(c.detected);
            let formed = c.formed.unwrap_or(stopped).max(stopped);
            for (phase, from, to) in [
                ("stop", c.detected, stopped),
                ("form", stopped, formed),
                ("spawn", formed, now),
            ] {
                self.phase(phase, to.saturating_duration_since(from));
            }
            self.f.restart_seconds.observe(c.total(now).as_secs_f64());
            t.spawned_at = Some(now);
        }
        t.work = Some(WorkClock::new(now, resume_step));
        t.workers = workers;
    }

    fn phase(&self, phase: &str, d: std::time::Duration) {
        self.f
            .phases
            .get_or_create(&PhaseLabel {
                phase: phase.to_string(),
            })
            .observe(d.as_secs_f64());
    }

    /// The workers are being stopped at `now`: what the generation would lose.
    pub fn stopping(&self, now: Instant) {
        let mut t = self.t();
        t.lost = t.work.take().map(|w| w.lost(now));
        t.spawned_at = None;
        t.workers.clear();
    }

    /// A worker process ended.
    pub fn worker_exit(&self, exit: ExitKind) {
        let labels = match exit {
            ExitKind::Code(c) => ExitLabels {
                code: c.to_string(),
                signal: String::new(),
            },
            ExitKind::Signal(s) => ExitLabels {
                code: String::new(),
                signal: s.as_str().to_string(),
            },
        };
        self.f.worker_exits.get_or_create(&labels).inc();
    }

    /// This node sent a checkpoint commit.
    pub fn committed(&self) {
        self.f.ckpt_commits.inc();
    }

    /// The checkpoints staged in memory (`--ckpt-memory`): `held` bytes, the oldest not yet
    /// persisted `lag` old, `persisted` more steps written to --ckpt-dir since the last call.
    pub fn staging(&self, held: u64, lag: std::time::Duration, persisted: u64) {
        self.f
            .ckpt_staged_bytes
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        self.f.ckpt_persist_lag.set(lag.as_secs_f64());
        self.f.ckpt_persisted.inc_by(persisted);
    }

    /// Replicas (`--ckpt-replicas`): `sent` more steps of this node verified on its ring
    /// neighbour since the last call; `held` bytes of other nodes' steps held here.
    pub fn replicas(&self, sent: u64, held: u64) {
        self.f.ckpt_replicated.inc_by(sent);
        self.f
            .ckpt_replica_bytes
            .set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// A checkpoint was sealed (`id`: its manifest id, `"<step>-<generation>"`).
    pub fn sealed(&self, id: &str) {
        self.f.ckpt_seals.inc();
        let mut t = self.t();
        let (Some((step, g)), Some(cur)) = (drun_rendezvous::ledger::parse_id(id), t.last_gen)
        else {
            return;
        };
        if g == cur {
            if let Some(w) = t.work.as_mut() {
                self.f
                    .committed_seconds
                    .inc_by(w.sealed(step).as_secs_f64());
            }
        }
    }

    /// Rank `rank`'s step beacon: it reached `step` (`samples`: per step, if it said).
    pub fn progress(&self, rank: u32, step: u64, samples: Option<u64>, now: Instant) {
        let mut t = self.t();
        if let Some(at) = t.spawned_at.take() {
            self.phase("first_progress", now.saturating_duration_since(at));
        }
        let Some(st) = t.work.as_mut().and_then(|w| w.beacon(rank, step, now)) else {
            return;
        };
        let l = RankLabel { rank };
        self.f.rank_step_seconds.get_or_create(&l).set(st.seconds);
        self.f.rank_steps.get_or_create(&l).inc_by(st.steps);
        if let Some(n) = samples.filter(|_| st.seconds > 0.0) {
            self.f
                .rank_samples
                .get_or_create(&l)
                .set(n as f64 / st.seconds);
        }
    }

    /// A rank became, or stopped being, a straggler.
    pub fn straggler(&self, ev: crate::agent::straggler::Event) {
        use crate::agent::straggler::Event;
        let (rank, on) = match ev {
            Event::Started { rank, .. } => (rank, 1),
            Event::Cleared { rank, .. } => (rank, 0),
        };
        self.f
            .rank_straggler
            .get_or_create(&RankLabel { rank })
            .set(on);
    }

    /// `--preflight`'s report: the check's time and `all_reduce` bus bandwidth, and the links
    /// node `node_rank` sends on with their verdicts.
    pub fn preflight(
        &self,
        r: &crate::preflight::Report,
        slow: &[crate::preflight::Slow],
        node_rank: u32,
    ) {
        self.f.preflight_seconds.set(r.seconds);
        self.f
            .preflight_busbw
            .set(r.all_reduce.busbw_gbps * 1e9 / 8.0);
        for (l, why) in r.links.iter().zip(slow).filter(|(l, _)| l.src == node_rank) {
            let label = families::LinkLabel {
                src_node: l.src,
                dst_node: l.dst,
            };
            let f = &self.f;
            f.preflight_link_bw
                .get_or_create(&label)
                .set(l.gbps * 1e9 / 8.0);
            f.preflight_link_latency
                .get_or_create(&label)
                .set(l.latency_us / 1e6);
            f.preflight_link_slow
                .get_or_create(&label)
                .set(i64::from(why.is_some()));
        }
    }

    /// The OpenMetrics text, after reading the workers' `/proc` entries and the goodput.
    pub fn render(&self) -> String {
        self.refresh(Instant::now());
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("encoding into a String cannot fail");
        out
    }

    fn refresh(&self, now: Instant) {
        let wall = now.saturating_duration_since(self.started).as_secs_f64();
        if wall > 0.0 {
            let ratio = self.f.committed_seconds.get() / wall;
            self.f.goodput.set(ratio.clamp(0.0, 1.0));
        }
        let mut t = self.t();
        self.f.worker_rss.clear();
        let workers = t.workers.clone();
        for (rank, pid) in workers {
            let Some(u) = procs::usage(pid) else { continue };
            let l = RankLabel { rank };
            self.f.worker_rss.get_or_create(&l).set(u.rss_bytes as i64);
            let seen = t.cpu_seen.entry((rank, pid)).or_insert(0.0);
            let delta = (u.cpu_seconds - *seen).max(0.0);
            *seen = seen.max(u.cpu_seconds);
            self.f.worker_cpu.get_or_create(&l).inc_by(delta);
        }
    }
}

fn cause_label(cause: &str) -> CauseLabel {
    CauseLabel {
        cause: cause.to_string(),
    }
}

#[cfg(test)]
mod tests;
