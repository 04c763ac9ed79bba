//! What the agent's effects touch besides the workers: the rendezvous link's opening and
//! closing, the candidate, the announcement of a plan, the teardown sweep, the failure summary,
//! the log directory at exit.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use drun_rendezvous::decisions::root_cause::RootCause;
use drun_rendezvous::human::duration as human;
use drun_rendezvous::session::Request;
use drun_rendezvous::{Candidate, Join, Plan};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::rank_table::{rank_table, LocalWorker};
use super::state::KILL_WAIT;
use super::Agent;
use crate::ckpt::resume;
use crate::fingerprint;
use crate::group::WorkerGroup;
use crate::os::ports;
use crate::rdzv;
use crate::summary::{self, root_cause};
use crate::{AgentExit, LaunchError, RendezvousMode};

impl Agent {
    pub(super) async fn run(&mut self) -> Result<AgentExit, LaunchError> {
        for note in &self.cfg.notes {
            tracing::warn!("{note}");
        }
        if let Some(binding) = &self.cfg.workers.numa {
            tracing::info!("{}", binding.describe());
        }
        if let Some(line) = &self.cfg.scheduler.slurm_line {
            tracing::info!(
                "{line}; shutdown grace {}",
                human(self.cfg.supervision.shutdown_timeout)
            );
        }
        if let Some(job) = &self.cfg.scheduler.k8s {
            for w in &job.warnings {
                tracing::warn!("{w}");
            }
        }
        if let Some(n) = self.cfg.scheduler.container_restarts {
            tracing::info!(
                "container start {} on --state-dir (restarts so far: {n})",
                n + 1
            );
        }
        if crate::container::is_pid1() {
            tracing::info!(
                "running as PID 1: signals are handled, every orphan in the container is reaped"
            );
        }
        if let Some(line) = &self.cfg.scheduler.k8s_line {
            tracing::info!(
                "{line}; shutdown grace {}",
                human(self.cfg.supervision.shutdown_timeout)
            );
        }
        if self.cfg.workers.nproc_per_node > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
            tracing::info!(
                "OMP_NUM_THREADS is unset; setting it to 1 for each worker, as torchrun does \
                 (export it to tune)"
            );
        }
        let t = self.cfg.rdzv.timing;
        let session = self.cfg.session_config();
        if self.cfg.rdzv.max_nodes > 1
            || !matches!(self.cfg.rdzv.mode, RendezvousMode::Embedded { .. })
        {
            tracing::info!(
                run = %self.cfg.run_id,
                "rendezvous {}; nnodes {}:{}, join_timeout {}, last_call {}, lease_ttl {}, keep_alive {}",
                self.cfg.rdzv.mode,
                self.cfg.rdzv.min_nodes,
                self.cfg.rdzv.max_nodes,
                human(t.join_timeout),
                human(session.round.last_call),
                human(t.lease_ttl),
                human(t.keep_alive_interval)
            );
        }
        self.collect_fingerprint().await;
        self.start_peer_probes().await;
        let health = self.peers.as_ref().map(crate::peers::Prober::health);
        let mut link = rdzv::open(&self.cfg, session, health).await?;
        let result = self.drive(&mut link).await;
        if !matches!(result, Ok(AgentExit::Success | AgentExit::WorkerFailure)) {
            // Not after a preemption: every agent of the job saves and exits for the requeue on
            // its own, and one still waiting for the save must not end as a rendezvous failure.
            if let (Err(LaunchError::GpuUnhealthy(why)), true) =
                (&result, self.cfg.rdzv.max_nodes > 1)
            {
                // A run of a fixed size cannot form without this node: it ends for every agent
                // now, naming the GPUs, instead of leaving them waiting for the join timeout.
                match &link.hosted {
                    Some(h) => h.end_run_unfit(&self.cfg.run_id, why.clone()).await,
                    None => {
                        let _ = link.tx.send(Request::Unfit {
                            reason: why.clone(),
                        });
                    }
                }
            } else if let (Some(h), false) =
                (&link.hosted, matches!(result, Ok(AgentExit::Preempted)))
            {
                h.end_run(&self.cfg.run_id, host_stopped(&self.cfg.node_id, &result))
                    .await;
            }
        }
        // Leaving (not ending) the run: survivors of a run that goes on re-form without this
        // node. After the run's end too: what the agent sent without waiting for an answer (a
        // hang's flight recorder dumps, a report) is carried out before the process exits.
        let left = link.leave().await;
        if !left {
            tracing::debug!("the rendezvous did not confirm the leave in time");
        }
        if let Some(h) = link.hosted.take() {
            // An ended run whose size is fixed: every node must learn it, also those that have
            // not connected yet.
            let unfit = matches!(result, Err(LaunchError::GpuUnhealthy(_)));
            let nodes = if unfit {
                self.cfg.rdzv.max_nodes as usize
            } else {
                0
            };
            h.shutdown(nodes, !left).await;
        }
        result
    }

    /// Collects this node's fingerprint for the environment check, unless the group can only
    /// ever be this one node (nothing to compare). Collected with `--env-check off` too: the
    /// strictest setting among the nodes wins, and a launch-config mismatch is refused whatever
    /// the setting.
    async fn collect_fingerprint(&mut self) {
        if self.cfg.rdzv.max_nodes <= 1
            || matches!(self.cfg.rdzv.mode, RendezvousMode::Static { .. })
        {
            return;
        }
        let cfg = self.cfg.clone();
        let env: std::collections::BTreeMap<String, String> = self
            .inherited
            .iter()
            .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v.to_str()?.to_string())))
            .collect();
        let started = std::time::Instant::now();
        let collected = tokio::task::spawn_blocking(move || fingerprint::collect(&cfg, &env))
            .await
            .unwrap_or_default();
        tracing::debug!(
            keys = collected.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "environment fingerprint collected"
        );
        self.fingerprint = collected;
    }

    /// False inside a Slurm job that is not a requeued one (job ids are reused).
    pub(super) fn may_resume_files(&self) -> bool {
        self.cfg
            .scheduler
            .slurm
            .as_ref()
            .is_none_or(|j| j.may_resume_files())
    }

    /// Starts the peer probes of a run that may span nodes through a rendezvous that can be
    /// away (a server, a c10d host, etcd), bound to `--local-addr` when this host holds it.
    /// Without them the agent fences itself when the rendezvous is gone, as before.
    async fn start_peer_probes(&mut self) {
        if self.cfg.rdzv.max_nodes <= 1
            || matches!(
                self.cfg.rdzv.mode,
                RendezvousMode::Embedded { .. } | RendezvousMode::Static { .. }
            )
        {
            return;
        }
        let ip = self
            .cfg
            .rdzv
            .advertise_addr
            .as_deref()
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
            .filter(|ip| ports::holds_address(*ip))
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let started = if self.cfg.ckpt.replicas > 0 {
            // Replicas arrive over TCP on the probe port's number: one published port per
            // agent for the agents' own traffic.
            match super::driver::replicas::bind_pair(ip) {
                Ok((udp, tcp)) => {
                    self.replica_listener = Some(tcp);
                    tokio::net::UdpSocket::from_std(udp).and_then(|u| {
                        crate::peers::Prober::start_on(u, &self.cfg.run_id, &self.cfg.node_id)
                    })
                }
                Err(e) => {
                    crate::say!("drun: warning: --ckpt-replicas: cannot open the replica port: {e}; this node's checkpoints stay on this node only");
                    crate::peers::Prober::start(ip, &self.cfg.run_id, &self.cfg.node_id).await
                }
            }
        } else {
            crate::peers::Prober::start(ip, &self.cfg.run_id, &self.cfg.node_id).await
        };
        match started {
            Ok(p) => self.peers = Some(p),
            Err(e) => tracing::warn!(
                error = %e,
                "cannot open the peer probe socket: a rendezvous outage will fence this node \
                 even while its peers answer"
            ),
        }
    }

    /// This node's Join: its candidacy and, apart from it, the checkpoint it could resume from.
    pub(super) fn candidate(&mut self, master_port: u16) -> Join {
        let advertise_addr = match &self.cfg.rdzv.mode {
            RendezvousMode::Embedded { master_addr, .. } => master_addr.clone(),
            RendezvousMode::Static { master_addr, .. } => master_addr.clone(),
            // Empty: the server fills in the address it sees the agent connect from.
            RendezvousMode::Server { .. } | RendezvousMode::C10d { .. } => {
                self.cfg.rdzv.advertise_addr.clone().unwrap_or_default()
            }
            RendezvousMode::Etcd { endpoints } => self
                .cfg
                .rdzv
                .advertise_addr
                .clone()
                .or_else(|| endpoints.first().and_then(|e| ports::route_local_ip(e)))
                .unwrap_or_else(|| self.hostname.clone()),
        };
        let candidate = Candidate {
            node_id: self.cfg.node_id.clone(),
            advertise_addr,
            slots: self.cfg.workers.nproc_per_node,
            requested_node_rank: self.cfg.rdzv.requested_node_rank,
            master_port,
            probe_port: self.peers.as_ref().map_or(0, crate::peers::Prober::port),
        };
        Join {
            candidate,
            resume_hint: resume::hint(
                resume::Source {
                    run_id: &self.cfg.run_id,
                    ckpt: &self.cfg.ckpt,
                    may_resume_files: self.may_resume_files(),
                },
                &mut self.adoption_failed,
            ),
            fingerprint: self.fingerprint.clone(),
            env_check: Some(self.cfg.rdzv.env_check),
            held: Vec::new(),
        }
    }

    pub(super) fn announce(&self, plan: &Plan) {
        // From here on every record of the agent's span names this generation (JSON logs; a
        // span without the field ignores it).
        tracing::Span::current().record("gen", plan.generation);
        tracing::info!(
            run = %plan.run_id,
            gen = plan.generation,
            "world formed: {} node(s){}, world size {}, master {}:{}, restarts {}/{} (+{} membership)",
            plan.node_count(),
            node_list(plan),
            plan.world_size,
            plan.master_addr,
            plan.master_port,
            plan.restarts_failures,
            self.cfg.supervision.max_restarts,
            plan.restarts_membership
        );
        if plan.generation > 1 && !plan.formed_because.is_empty() {
            tracing::info!(run = %plan.run_id, gen = plan.generation, "formed now: {}", plan.formed_because);
        }
        for note in &plan.notes {
            tracing::warn!(run = %plan.run_id, gen = plan.generation, "{note}");
        }
        if let Some(m) = plan.member(&self.cfg.node_id) {
            for lr in 0..m.slots {
                tracing::debug!(
                    rank = m.base_rank + lr,
                    local_rank = lr,
                    node_rank = m.node_rank,
                    "rank assignment"
                );
            }
        }
        tracing::debug!(logs = %self.run_log_dir.display(), "worker log directory");
    }

    /// Node rank 0's rank table of the generation it just started (see [`super::rank_table`]):
    /// at info level for a multi-node group, at debug level for one node.
    pub(super) fn print_rank_table(&self, plan: &Plan, group: &WorkerGroup) {
        if plan
            .member(&self.cfg.node_id)
            .is_none_or(|m| m.node_rank != 0)
        {
            return;
        }
        let local: Vec<LocalWorker> = group
            .workers
            .iter()
            .map(|w| LocalWorker {
                local_rank: w.local_rank,
                pid: w.pid.as_raw(),
            })
            .collect();
        let devices = self
            .inherited
            .get(std::ffi::OsStr::new("CUDA_VISIBLE_DEVICES"))
            .and_then(|v| v.to_str());
        let table = rank_table(plan, &self.cfg.node_id, &local, devices);
        if plan.node_count() > 1 {
            tracing::info!(run = %plan.run_id, gen = plan.generation, "{table}");
        } else {
            tracing::debug!(run = %plan.run_id, gen = plan.generation, "{table}");
        }
    }

    /// SIGKILLs whatever the workers left behind: children re-parented to the agent and any
    /// process carrying this agent's DRUN_AGENT_ID. Bounded: gives up after `KILL_WAIT`.
    pub(super) async fn sweep_descendants(&mut self) {
        let guard_pid = self.guard().lock().expect("guard mutex poisoned").pid();
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            // The warm interpreters wait for the next generation: not leftovers.
            let mut spared = self.warm.lock().expect("warm pool mutex poisoned").pids();
            spared.push(guard_pid);
            let left = self.os.descendants(&self.agent_id, &spared);
            self.reap_others();
            if left.is_empty() || Instant::now() >= deadline {
                if !left.is_empty() {
                    tracing::error!(?left, "could not kill every descendant");
                }
                return;
            }
            tracing::debug!(?left, "killing leftover descendants");
            for p in left {
                self.os.signal_process(p, Signal::SIGKILL);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The failure summary of the last group (`history`: the run's failures, this one last).
    pub(super) fn summarize(&mut self, group: &WorkerGroup, history: &[String]) {
        let mut failures = group.failures();
        let Some(root) = root_cause(&failures) else {
            return;
        };
        let root = failures[root].clone();
        self.cause = Some(format!("{} on {}", root.one_line(), self.hostname));
        if self.temp_log_dir {
            for f in failures.iter_mut().filter(|f| f.error.is_some()) {
                f.error_file = PathBuf::from(format!(
                    "{} (removed at exit; pass --log-dir DIR to keep it)",
                    f.error_file.display()
                ));
            }
        }
        crate::say_raw!(
            "{}",
            summary::format_summary(
                &self.cfg.workers.entrypoint.script,
                &self.hostname,
                &failures,
                history.split_last().map_or(&[][..], |(_, earlier)| earlier)
            )
        );
        if self.cfg.workers.entrypoint.kind != crate::command::EntryKind::Binary {
            if let Some(line) = summary::missing_module_hint(
                &root.traceback(),
                &self.cfg.workers.entrypoint.program,
                self.cfg.workers.python_source,
            ) {
                crate::say!("{line}");
            }
        }
        self.write_root_cause(&root);
        self.print_also();
    }

    /// The summary of a run another node's worker failure ended: that failure, `cause`.
    pub(super) fn summarize_remote(&mut self, cause: &RootCause) {
        self.cause = Some(format!(
            "rank {} (local_rank {}) on {} exited with {} (pid {}), generation {}",
            cause.rank, cause.local_rank, cause.host, cause.exitcode, cause.pid, cause.generation
        ));
        let at = UNIX_EPOCH + Duration::from_millis(cause.at_ms);
        crate::say_raw!(
            "{}",
            cause.block(
                &self.cfg.workers.entrypoint.script,
                &summary::format_time(at)
            )
        );
    }

    /// Secondary problems after the primary error, one line each.
    fn print_also(&mut self) {
        for a in self.also.drain(..) {
            crate::say!("drun: also: {a}");
        }
    }

    fn write_root_cause(&self, root: &summary::Failure) {
        let Some(path) = std::env::var_os("TORCHELASTIC_ERROR_FILE").filter(|p| !p.is_empty())
        else {
            return;
        };
        let json = summary::root_cause_json(root);
        if let Err(e) = std::fs::write(
            &path,
            serde_json::to_vec_pretty(&json).expect("json serializes"),
        ) {
            tracing::warn!(path = %PathBuf::from(&path).display(), error = %e, "cannot write TORCHELASTIC_ERROR_FILE");
        }
    }

    /// Reaps exited children that are not the group's workers (the warm interpreters are told).
    fn reap_others(&self) {
        let mut warm = self.warm.lock().expect("warm pool mutex poisoned");
        for (pid, exit) in self.os.reap() {
            warm.exited(pid, exit);
        }
    }

    /// Kills the warm interpreters and reaps them (bounded by [`KILL_WAIT`]).
    async fn kill_warm(&mut self) {
        let mut left = self
            .warm
            .lock()
            .expect("warm pool mutex poisoned")
            .kill_all();
        let deadline = Instant::now() + KILL_WAIT;
        while !left.is_empty() && Instant::now() < deadline {
            let reaped: Vec<_> = self.os.reap().into_iter().map(|(p, _)| p).collect();
            let me = Some(nix::unistd::getpid());
            left.retain(|p| !reaped.contains(p) && crate::os::procs::parent_of(*p) == me);
            if !left.is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    pub(super) async fn close(&mut self, exit: AgentExit) {
        self.kill_warm().await;
        let _ = self.os.reap();
        if let Some(g) = self.guard.take() {
            g.into_inner().expect("guard mutex poisoned").disarm();
        }
        // Without --log-dir the directory is scratch: nothing is left behind in the temp dir
        // (the summary already showed the error file's content and the output tail).
        if self.temp_log_dir || !has_content(&self.run_log_dir) {
            let _ = std::fs::remove_dir_all(&self.run_log_dir);
        } else if exit != AgentExit::Success {
            tracing::info!(
                "worker logs and error files: {}",
                self.run_log_dir.display()
            );
        }
    }
}

/// Whether `dir` holds a non-empty file anywhere below it (empty log files and empty attempt
/// directories are not worth pointing at).
fn has_content(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| match e.file_type() {
            Ok(t) if t.is_dir() => has_content(&e.path()),
            Ok(_) => e.metadata().is_ok_and(|m| m.len() > 0),
            Err(_) => false,
        })
    })
}

/// ` [a, b, c]`: the nodes of `plan` as the "world formed" line names them; empty for a large
/// plan, which reaches the agent with its own entry only.
fn node_list(plan: &Plan) -> String {
    if !plan.complete() {
        return String::new();
    }
    let ids: Vec<&str> = plan.members.iter().map(|m| m.node_id.as_str()).collect();
    format!(" [{}]", ids.join(", "))
}

/// Why a run ends when the agent hosting its rendezvous stops (`result`: how the agent ends),
/// and what to do: one line for every other agent of the run.
fn host_stopped(node: &str, result: &Result<AgentExit, LaunchError>) -> String {
    let why = match result {
        Ok(AgentExit::Signal(n)) => match Signal::try_from(*n) {
            Ok(sig) => format!("stopped by {sig}"),
            Err(_) => format!("stopped by signal {n}"),
        },
        Ok(exit) => format!("ended with exit {}", exit.code()),
        Err(e) => format!("failed: {e}"),
    };
    format!(
        "the agent hosting the rendezvous ({node}) {why}; the run's state lived in its memory, so restart the job on every node (it resumes from the last checkpoint)"
    )
}
