//! The agent loop: rendezvous → spawn → supervise → restart or exit.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use drun_rendezvous::human::duration as human;
use drun_rendezvous::session::{Event, Request, RunEnd};
use drun_rendezvous::{Candidate, Plan};
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::ckpt::api::{refused, ApiCall, ApiRequest, ApiServer};
use crate::ckpt::node::{resume_answer, NodeLedger};
use crate::ckpt::{self, verify, VerifyMode};
use crate::group::{GroupContext, WorkerGroup};
use crate::os::guard::Guard;
use crate::os::ports::{self, ReservedPort};
use crate::os::spawn::{self, Spawner};
use crate::os::{LinuxOs, Os};
use crate::rdzv::{self, Link};
use crate::slurm::OnPreempt;
use crate::summary::{self, root_cause};
use crate::{AgentExit, LaunchConfig, LaunchError, RendezvousMode};

/// How long teardown waits for SIGKILLed workers (e.g. in uninterruptible sleep) to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long the agent waits for output readers after the workers are gone.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// How long some local ranks may wait for the others to commit a step before the agent says so.
const STALLED_COMMIT: Duration = Duration::from_secs(30);

mod failure;

/// Signals relayed to workers without tearing anything down.
const RELAYED: [Signal; 2] = [Signal::SIGUSR1, Signal::SIGUSR2];

/// How supervision of a generation ended.
enum Outcome {
    Succeeded,
    Failed,
    /// Some local workers exited 0, others still ran after `--peer-exit-wait`.
    PartialSuccess(String),
    Signal(Signal),
    Reform(String),
    Fenced(String),
    Finished(RunEnd),
    /// The coordinated checkpoint asked for by a preemption warning was sealed.
    Preempted(String),
}

/// Whether the plan's resume point can be used.
enum ResumeCheck {
    /// Yes; the manifest file, if there is a resume point.
    Use(Option<PathBuf>),
    /// It failed verification and was marked bad: join the re-formed group.
    Rejoin,
    /// The run ended or a signal arrived while waiting for the re-form.
    Exit(AgentExit),
}

/// What happened while a node that finished waited for the others.
enum EndWait {
    Exit(AgentExit),
    Reform,
    PeersLate(String),
}

/// Runs a validated launch to its end and returns the exit status. Errors are printed as one
/// line on stderr.
pub async fn run(cfg: LaunchConfig) -> AgentExit {
    use tracing::Instrument as _;
    // In a multi-node run every agent line names its node (`node=n2`).
    let span = if cfg.max_nodes > 1 {
        tracing::info_span!("agent", node = %cfg.node_id)
    } else {
        tracing::Span::none()
    };
    run_agent(cfg).instrument(span).await
}

async fn run_agent(cfg: LaunchConfig) -> AgentExit {
    let mut agent = match Agent::new(cfg).await {
        Ok(a) => a,
        Err(e) => {
            crate::say!("drun: error: {e}");
            return e.exit();
        }
    };
    let exit = match agent.run().await {
        Ok(exit) => exit,
        Err(e) => {
            crate::say!("drun: error: {e}");
            e.exit()
        }
    };
    agent.close(exit).await;
    exit
}

struct Agent {
    cfg: LaunchConfig,
    os: Arc<dyn Os>,
    guard: Option<Mutex<Guard>>,
    agent_id: String,
    hostname: String,
    inherited: BTreeMap<OsString, OsString>,
    run_log_dir: PathBuf,
    temp_log_dir: bool,
    signals: mpsc::UnboundedReceiver<Signal>,
    sigchld: tokio::signal::unix::Signal,
    /// First teardown signal received, if any.
    interrupted: Option<Signal>,
    /// Secondary problems, printed as "also: ..." after the primary error.
    also: Vec<String>,
    /// The worker API socket (`DRUN_AGENT_SOCK`); `None` if it could not be opened.
    api: Option<ApiServer>,
    /// Worker API requests.
    api_rx: mpsc::UnboundedReceiver<ApiCall>,
    /// The running generation's view of the checkpoint ledger.
    ledger: Option<NodeLedger>,
    /// Highest step the local ranks announced in the previous generation (lost-work report).
    reached_before: Option<u64>,
    /// A coordinated save was requested for a preemption (the `should_save` answer):
    /// `ckpt/latest` at the time. Its seal stops the workers (exit 5).
    save_requested: Option<String>,
    /// A preemption warning whose checkpoint is not sealed yet (the reason line), kept across
    /// re-forms: each new generation is asked again until the seal stops the workers.
    preempt_pending: Option<String>,
    /// Why the `--ckpt-resume-from` checkpoint could not be read at the last join, if it could
    /// not.
    adoption_failed: Option<String>,
    /// A coordinated save was requested before admitting a newcomer (`--on-scale-up
    /// checkpoint`): `ckpt/latest` at the time. Its seal only ends the request.
    scale_up_save: Option<String>,
    /// The restart under way, timed phase by phase (printed once its workers are spawned).
    restart_clock: Option<crate::phases::RestartClock>,
}

impl Agent {
    async fn new(cfg: LaunchConfig) -> Result<Self, LaunchError> {
        spawn::become_subreaper()
            .map_err(|e| LaunchError::os("cannot become a child subreaper", e))?;
        let spawner =
            Spawner::start().map_err(|e| LaunchError::os("cannot start the spawner thread", e))?;
        let os: Arc<dyn Os> = Arc::new(LinuxOs::new(spawner.clone()));
        let agent_id = uuid::Uuid::new_v4().to_string();
        let sigchld =
            signal(SignalKind::child()).map_err(|e| LaunchError::os("cannot watch SIGCHLD", e))?;
        let (tx, signals) = mpsc::unbounded_channel();
        let mut wanted: Vec<Signal> = cfg.signals.clone();
        wanted.extend(RELAYED);
        wanted.push(cfg.preempt_signal);
        wanted.sort_by_key(|s| *s as i32);
        wanted.dedup();
        // `nohup drun ...`: a signal ignored at start stays ignored, for drun and its workers.
        wanted.retain(|sig| {
            let ignored = spawn::is_ignored(*sig);
            if ignored {
                tracing::debug!(
                    "{} was ignored when drun started (nohup?): it stays ignored for drun and its workers",
                    sig.as_str()
                );
            }
            !ignored
        });
        for sig in wanted {
            let mut stream = signal(SignalKind::from_raw(sig as i32))
                .map_err(|e| LaunchError::os(format!("cannot handle {}", sig.as_str()), e))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(sig).is_err() {
                        return;
                    }
                }
            });
        }
        let mut guard = Guard::start(&spawner, &agent_id)
            .await
            .map_err(|e| LaunchError::os("cannot start the cleanup guard process", e))?;
        let hostname = os
            .hostname()
            .split('.')
            .next()
            .unwrap_or("localhost")
            .to_string();
        let (base, temp_log_dir) = match &cfg.log_dir {
            Some(d) => (d.clone(), false),
            None => (std::env::temp_dir(), true),
        };
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let run_log_dir = if temp_log_dir {
            base.join(format!("drun_{}_{suffix}", cfg.run_id))
        } else {
            base.join(format!("{}_{suffix}", cfg.run_id))
        };
        std::fs::create_dir_all(&run_log_dir).map_err(|source| {
            LaunchError::Config(crate::ConfigError::Path {
                what: "log directory",
                path: run_log_dir.clone(),
                source,
            })
        })?;
        if temp_log_dir {
            guard.scratch(&run_log_dir);
        }
        let (api, api_rx) = match ApiServer::start() {
            Ok((server, rx)) => {
                if let Some(dir) = server.path().parent() {
                    guard.scratch(dir);
                }
                (Some(server), rx)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the worker API socket; checkpoint commits are unavailable (DRUN_AGENT_SOCK unset)");
                (None, mpsc::unbounded_channel().1)
            }
        };
        Ok(Self {
            api,
            api_rx,
            ledger: None,
            reached_before: None,
            save_requested: None,
            scale_up_save: None,
            restart_clock: None,
            adoption_failed: None,
            preempt_pending: None,
            inherited: std::env::vars_os().collect(),
            cfg,
            os,
            guard: Some(Mutex::new(guard)),
            agent_id,
            hostname,
            run_log_dir,
            temp_log_dir,
            signals,
            sigchld,
            interrupted: None,
            also: Vec::new(),
        })
    }

    fn guard(&self) -> &Mutex<Guard> {
        self.guard.as_ref().expect("guard lives until close()")
    }

    async fn run(&mut self) -> Result<AgentExit, LaunchError> {
        for note in &self.cfg.notes {
            tracing::warn!("{note}");
        }
        if let Some(line) = &self.cfg.slurm_line {
            tracing::info!(
                "{line}; shutdown grace {}",
                human(self.cfg.shutdown_timeout)
            );
        }
        if self.cfg.nproc_per_node > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
            tracing::info!(
                "OMP_NUM_THREADS is unset; setting it to 1 for each worker, as torchrun does \
                 (export it to tune)"
            );
        }
        let t = self.cfg.timing;
        let session = self.cfg.session_config();
        if self.cfg.max_nodes > 1 || !matches!(self.cfg.rendezvous, RendezvousMode::Embedded { .. })
        {
            tracing::info!(
                run = %self.cfg.run_id,
                "rendezvous {}; nnodes {}:{}, join_timeout {}, last_call {}, lease_ttl {}, keep_alive {}",
                self.cfg.rendezvous,
                self.cfg.min_nodes,
                self.cfg.max_nodes,
                human(t.join_timeout),
                human(session.round.last_call),
                human(t.lease_ttl),
                human(t.keep_alive_interval)
            );
        }
        let mut link = rdzv::open(&self.cfg, session).await?;
        let result = self.generations(&mut link).await;
        if !matches!(result, Ok(AgentExit::Success | AgentExit::WorkerFailure)) {
            // Leaving (not ending) the run: survivors re-form without this node.
            let _ = link.tx.send(Request::Leave);
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while link.rx.recv().await.is_some() {}
            })
            .await;
        }
        if let Some(h) = link.hosted.take() {
            h.shutdown().await;
        }
        result
    }

    fn candidate(&mut self, master_port: u16) -> Candidate {
        let advertise_addr = match &self.cfg.rendezvous {
            RendezvousMode::Embedded { master_addr, .. } => master_addr.clone(),
            RendezvousMode::Static { master_addr, .. } => master_addr.clone(),
            // Empty: the server fills in the address it sees the agent connect from.
            RendezvousMode::Server { .. } | RendezvousMode::C10d { .. } => {
                self.cfg.advertise_addr.clone().unwrap_or_default()
            }
            RendezvousMode::Etcd { endpoints } => self
                .cfg
                .advertise_addr
                .clone()
                .or_else(|| endpoints.first().and_then(|e| ports::route_local_ip(e)))
                .unwrap_or_else(|| self.hostname.clone()),
        };
        Candidate {
            node_id: self.cfg.node_id.clone(),
            advertise_addr,
            slots: self.cfg.nproc_per_node,
            requested_node_rank: self.cfg.requested_node_rank,
            master_port,
            resume_hint: self.resume_hint(),
        }
    }

    /// What this node offers the rendezvous as a resume point for a store that knows no
    /// checkpoint: its own run's latest manifest file, else the `--ckpt-resume-from` one.
    fn resume_hint(&mut self) -> Option<Box<drun_rendezvous::Manifest>> {
        self.own_resume_hint().or_else(|| self.adopted_hint())
    }

    /// The `--ckpt-resume-from` checkpoint, relabelled as this run's (`adopted_from` keeps the
    /// run it came from). Re-read at each join: once this run seals its own checkpoints the
    /// ledger prefers those (they are later steps).
    fn adopted_hint(&mut self) -> Option<Box<drun_rendezvous::Manifest>> {
        let path = self.cfg.ckpt.resume_from.as_deref()?;
        match ckpt::read_adoptable(path) {
            Ok((_, mut m)) => {
                if m.run_id != self.cfg.run_id {
                    m.adopted_from =
                        Some(std::mem::replace(&mut m.run_id, self.cfg.run_id.clone()));
                }
                Some(Box::new(m))
            }
            Err(e) => {
                // Matters only while the run has no checkpoint of its own: then check_resume
                // refuses to start from the beginning, with this reason.
                self.adoption_failed
                    .get_or_insert_with(|| format!("no longer usable: {e}"));
                None
            }
        }
    }

    /// The manifest `--ckpt-dir`'s `latest` points at, when it belongs to this run (a manifest of
    /// another run is ignored, and said so once).
    fn own_resume_hint(&self) -> Option<Box<drun_rendezvous::Manifest>> {
        let dir = self.cfg.ckpt.dir.as_deref()?;
        // This run's own pointer first: another run sharing the directory moves `latest`.
        let m = ckpt::run_pointer_dir(dir, &self.cfg.run_id)
            .and_then(|d| ckpt::read_latest(d.as_path()))
            .filter(|m| m.run_id == self.cfg.run_id)
            .or_else(|| ckpt::read_latest(dir))?;
        if self
            .cfg
            .slurm
            .as_ref()
            .is_some_and(|j| !j.may_resume_files())
        {
            if self.cfg.ckpt.resume_from.is_some() {
                return None;
            }
            static FRESH: std::sync::Once = std::sync::Once::new();
            FRESH.call_once(|| {
                tracing::info!(
                    "{}/latest (run {}, step {}) is not resumed: this Slurm job is not a requeued one (SLURM_RESTART_COUNT unset), and job ids are reused",
                    dir.display(),
                    m.run_id,
                    m.step
                );
            });
            return None;
        }
        if m.run_id != self.cfg.run_id {
            if self.cfg.ckpt.resume_from.is_some() {
                return None;
            }
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::info!(
                    "{}/latest is a checkpoint of run {} (step {}), not of this run {}: not resuming from it (pass --rdzv-id {} to resume that run, or --ckpt-resume-from {} to start this one from it)",
                    dir.display(),
                    m.run_id,
                    m.step,
                    self.cfg.run_id,
                    m.run_id,
                    dir.display()
                );
            });
            return None;
        }
        Some(Box::new(m))
    }

    /// Joins and waits for a plan; `Ok(Err(exit))` when the run ended or a signal arrived first.
    async fn form(
        &mut self,
        link: &mut Link,
        cand: &Candidate,
        formed_before: bool,
        after: u64,
    ) -> Result<Result<Plan, AgentExit>, LaunchError> {
        let _ = link.tx.send(Request::Join(cand.clone(), after));
        loop {
            tokio::select! {
                ev = link.rx.recv() => match ev {
                    None => return Err(LaunchError::Rendezvous(drun_rendezvous::RendezvousError::Assignment("the rendezvous session ended".into()))),
                    Some(Event::Waiting(t)) => tracing::info!("{t}"),
                    Some(Event::Formed(p)) => return Ok(Ok(p)),
                    Some(Event::Finished(end)) if !formed_before => {
                        return Err(LaunchError::RunFinished {
                            run: self.cfg.run_id.clone(),
                            at: summary::format_time(UNIX_EPOCH + Duration::from_millis(end.at_ms)),
                            outcome: if end.success { "succeeded".into() } else { format!("failed: {}", end.reason) },
                        });
                    }
                    Some(Event::Finished(end)) => return Ok(Err(self.run_ended(&end))),
                    Some(Event::Error(e)) => return Err(LaunchError::RendezvousFailed(e)),
                    Some(Event::Fenced(r)) => {
                        tracing::warn!("{r}; joining again as a new member");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let _ = link.tx.send(Request::Join(cand.clone(), after));
                    }
                    Some(_) => {}
                },
                sig = self.next_teardown_signal() => return Ok(Err(AgentExit::Signal(sig as i32))),
            }
        }
    }

    fn run_ended(&self, end: &RunEnd) -> AgentExit {
        if end.success {
            tracing::info!(run = %self.cfg.run_id, "run finished: {}", end.reason);
            AgentExit::Success
        } else {
            crate::say!("drun: run {} failed: {}", self.cfg.run_id, end.reason);
            AgentExit::WorkerFailure
        }
    }

    async fn generations(&mut self, link: &mut Link) -> Result<AgentExit, LaunchError> {
        let mut formed_before = false;
        // The last generation this node ran workers of: a Join says "after this one".
        let mut last_gen = 0u64;
        loop {
            let fixed_port = match &self.cfg.rendezvous {
                RendezvousMode::Embedded { fixed_port, .. } => *fixed_port,
                RendezvousMode::Static { master_port, .. } => Some(*master_port),
                _ => None,
            };
            let mut reserved = match fixed_port {
                Some(_) => None,
                None => Some(
                    ReservedPort::new()
                        .map_err(|e| LaunchError::os("cannot reserve a MASTER_PORT", e))?,
                ),
            };
            let master_port =
                fixed_port.unwrap_or_else(|| reserved.as_ref().map_or(0, ReservedPort::port));
            let cand = self.candidate(master_port);
            let plan = match self.form(link, &cand, formed_before, last_gen).await? {
                Ok(p) => p,
                Err(exit) => return Ok(exit),
            };
            formed_before = true;
            last_gen = plan.generation;
            if let Some(c) = self.restart_clock.as_mut() {
                c.formed = Some(Instant::now());
            }
            self.announce(&plan);
            // Served until this iteration ends: through the wait for the other nodes after
            // local success; closed on a re-form and when the agent leaves.
            let _worker_store = crate::worker_store::host(
                self.cfg.worker_store,
                &plan,
                &self.cfg.node_id,
                &mut reserved,
            )
            .await?;
            let resume_file = match self.check_resume(link, &plan).await? {
                ResumeCheck::Use(file) => file,
                ResumeCheck::Rejoin => continue,
                ResumeCheck::Exit(exit) => return Ok(exit),
            };
            let ctx = GroupContext {
                agent_sock: self.api.as_ref().map(ApiServer::path),
                resume_manifest: resume_file.as_deref(),
                cfg: &self.cfg,
                os: self.os.clone(),
                guard: self.guard(),
                agent_id: &self.agent_id,
                hostname: &self.hostname,
                inherited: &self.inherited,
                run_log_dir: &self.run_log_dir,
            };
            let mut group = match WorkerGroup::start(&ctx, &plan, plan.restarts_failures).await {
                Ok(g) => g,
                Err((mut partial, e)) => {
                    self.stop(&mut partial, Signal::SIGKILL).await;
                    return Err(e);
                }
            };
            if let Some(c) = self.restart_clock.take() {
                tracing::info!(
                    run = %plan.run_id,
                    gen = plan.generation,
                    "{}",
                    c.line(plan.generation, Instant::now())
                );
            }
            self.ledger = Some(NodeLedger::new(
                &plan,
                &self.cfg.node_id,
                self.cfg.ckpt.dir.as_deref(),
            ));
            self.save_requested = None;
            self.scale_up_save = None;
            if let Some(reason) = &self.preempt_pending {
                // A preemption warning outlives a re-form that came before its checkpoint: the
                // new generation is asked again (once per generation; any member may ask).
                let _ = link.tx.send(Request::Preempt {
                    generation: plan.generation,
                    reason: reason.clone(),
                });
            }
            let outcome = self
                .supervise(&mut group, link, &plan, resume_file.as_deref())
                .await;
            self.restart_clock = Some(crate::phases::RestartClock::detected(Instant::now()));
            // Ranks still waiting on a commit are told the group is stopping.
            self.reached_before = self.ledger.take().and_then(|l| l.reached());
            match outcome {
                Outcome::Succeeded => {
                    self.stop(&mut group, Signal::SIGTERM).await;
                    drop(reserved);
                    if plan.members.len() > 1 {
                        tracing::info!(run = %self.cfg.run_id, gen = plan.generation, "local workers succeeded; waiting for the other nodes");
                    }
                    let _ = link.tx.send(Request::Succeeded(plan.generation));
                    match self.await_end(link).await? {
                        EndWait::Exit(exit) => return Ok(exit),
                        EndWait::Reform => continue,
                        EndWait::PeersLate(description) => {
                            if let Some(exit) =
                                self.fail_without_summary(link, &plan, description).await?
                            {
                                return Ok(exit);
                            }
                        }
                    }
                }
                Outcome::Signal(sig) => {
                    tracing::warn!(
                        "received {}; forwarding it to workers and shutting down",
                        sig.as_str()
                    );
                    self.stop(&mut group, sig).await;
                    return Ok(AgentExit::Signal(sig as i32));
                }
                Outcome::Reform(reason) => {
                    tracing::warn!(gen = plan.generation, "re-forming the group: {reason}");
                    self.stop(&mut group, Signal::SIGTERM).await;
                    if let Some(sig) = self.interrupted {
                        return Ok(AgentExit::Signal(sig as i32));
                    }
                }
                Outcome::Fenced(reason) => {
                    tracing::error!(
                        gen = plan.generation,
                        "fenced: {reason}; killing workers and joining again"
                    );
                    self.stop(&mut group, Signal::SIGKILL).await;
                }
                Outcome::Finished(end) => {
                    self.stop(&mut group, Signal::SIGTERM).await;
                    return Ok(self.run_ended(&end));
                }
                Outcome::Preempted(id) => {
                    crate::say!(
                        "drun: preempted: checkpoint {} sealed; stopping the workers (exit 5: requeue to resume from it)",
                        drun_rendezvous::ledger::describe_id(&id)
                    );
                    self.stop(&mut group, Signal::SIGTERM).await;
                    let first = plan
                        .member(&self.cfg.node_id)
                        .is_some_and(|m| m.node_rank == 0);
                    if self.cfg.requeue && first {
                        self.requeue();
                    }
                    return Ok(AgentExit::Preempted);
                }
                Outcome::PartialSuccess(description) => {
                    self.stop(&mut group, Signal::SIGTERM).await;
                    if let Some(sig) = self.interrupted {
                        return Ok(AgentExit::Signal(sig as i32));
                    }
                    if let Some(exit) = self.fail_without_summary(link, &plan, description).await? {
                        return Ok(exit);
                    }
                }
                Outcome::Failed => {
                    self.stop(&mut group, Signal::SIGTERM).await;
                    if let Some(sig) = self.interrupted {
                        return Ok(AgentExit::Signal(sig as i32));
                    }
                    let failures = group.failures();
                    let root =
                        &failures[root_cause(&failures).expect("a failed group has failures")];
                    let description = format!("{} on node {}", root.one_line(), self.cfg.node_id);
                    let (restart, history) =
                        match self.report_failure(link, &plan, description).await? {
                            Ok(d) => d,
                            Err(exit) => return Ok(exit),
                        };
                    if restart {
                        continue;
                    }
                    let mut failures = failures.clone();
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
                            &self.cfg.entrypoint.script,
                            &self.hostname,
                            &failures,
                            history.split_last().map_or(&[][..], |(_, earlier)| earlier)
                        )
                    );
                    self.write_root_cause(root);
                    self.print_also();
                    return Ok(AgentExit::WorkerFailure);
                }
            }
        }
    }

    /// After local success: waits for the run to end, to re-form, or for `--peer-exit-wait` to
    /// pass (a partial success across nodes).
    async fn await_end(&mut self, link: &mut Link) -> Result<EndWait, LaunchError> {
        let deadline = Instant::now() + self.cfg.peer_exit_wait;
        loop {
            tokio::select! {
                ev = link.rx.recv() => match ev {
                    Some(Event::Finished(end)) => return Ok(EndWait::Exit(self.run_ended(&end))),
                    Some(Event::Reform { reason, .. }) => {
                        tracing::warn!("the group re-forms after this node finished: {reason}");
                        return Ok(EndWait::Reform);
                    }
                    Some(Event::Fenced(reason)) => {
                        tracing::warn!("fenced after this node finished: {reason}");
                        return Ok(EndWait::Reform);
                    }
                    Some(Event::Error(e)) => return Err(LaunchError::RendezvousFailed(e)),
                    None => return Ok(EndWait::Exit(AgentExit::Success)),
                    Some(_) => {}
                },
                _ = tokio::time::sleep_until(deadline) => {
                    return Ok(EndWait::PeersLate(format!(
                        "partial success: the workers of node {} finished, the other nodes' did not within --peer-exit-wait {}",
                        self.cfg.node_id, human(self.cfg.peer_exit_wait)
                    )));
                }
                sig = self.next_teardown_signal() => return Ok(EndWait::Exit(AgentExit::Signal(sig as i32))),
            }
        }
    }

    fn announce(&self, plan: &Plan) {
        tracing::info!(
            run = %plan.run_id,
            gen = plan.generation,
            "world formed: {} node(s) [{}], world size {}, master {}:{}, restarts {}/{} (+{} membership)",
            plan.members.len(),
            plan.members.iter().map(|m| m.node_id.as_str()).collect::<Vec<_>>().join(", "),
            plan.world_size,
            plan.master_addr,
            plan.master_port,
            plan.restarts_failures,
            self.cfg.max_restarts,
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

    /// Waits for a signal that ends the job (relaying USR1/USR2 to nobody while no workers run).
    async fn next_teardown_signal(&mut self) -> Signal {
        loop {
            match self.signals.recv().await {
                Some(sig) if RELAYED.contains(&sig) => {
                    tracing::info!(
                        "received {} before workers started; nothing to relay",
                        sig.as_str()
                    );
                }
                Some(sig) => {
                    self.interrupted.get_or_insert(sig);
                    return sig;
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Verifies the plan's resume point (`--ckpt-verify`) and makes sure its manifest file is
    /// next to the checkpoint. A checkpoint that fails is marked bad for the whole group, which
    /// re-forms onto the previous one.
    async fn check_resume(
        &mut self,
        link: &mut Link,
        plan: &Plan,
    ) -> Result<ResumeCheck, LaunchError> {
        let Some(m) = plan.resume.clone() else {
            if let Some(f) = &self.cfg.ckpt.resume_from {
                if let Some(why) = self.adoption_failed.take() {
                    // Asked for explicitly: never a silent start from scratch.
                    return Err(LaunchError::Config(crate::error::ConfigError::Invalid {
                        flag: "--ckpt-resume-from",
                        value: f.display().to_string(),
                        why: format!(
                            "{why}; not starting run {} from the beginning instead (fix the checkpoint, name another one, or drop the flag)",
                            self.cfg.run_id
                        ),
                    }));
                }
                if plan.generation > 1 {
                    static LATE: std::sync::Once = std::sync::Once::new();
                    LATE.call_once(|| {
                        tracing::warn!(
                            "--ckpt-resume-from {} is not used: run {} had already started (generation {}) without it, and has no checkpoint yet",
                            f.display(),
                            self.cfg.run_id,
                            plan.generation
                        );
                    });
                }
            }
            if let Some(p) = self.reached_before.take() {
                tracing::warn!("no usable checkpoint: restarting from the beginning (the local ranks had reached step {p}; all of it is repeated)");
            }
            return Ok(ResumeCheck::Use(None));
        };
        if m.adopted_from.is_none() {
            if let Some(f) = &self.cfg.ckpt.resume_from {
                static OWN: std::sync::Once = std::sync::Once::new();
                OWN.call_once(|| {
                    tracing::info!(
                        "--ckpt-resume-from {} is not used: run {} has its own checkpoint (step {})",
                        f.display(),
                        self.cfg.run_id,
                        m.step
                    );
                });
            }
        }
        let mode = self.cfg.ckpt.verify;
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let checked = {
            let m = m.clone();
            tokio::task::spawn_blocking(move || verify::verify(&m, mode, threads))
                .await
                .unwrap_or_else(|e| Err(format!("verification panicked: {e}")))
        };
        match checked {
            Ok(v) => {
                let secs = v.took.as_secs_f64();
                if mode != VerifyMode::None {
                    tracing::info!(
                        "checkpoint step {} verified ({}): {} files, {:.1} MB in {:.3} s{}",
                        m.step,
                        if mode == VerifyMode::Digest {
                            "size and sha256"
                        } else {
                            "sizes"
                        },
                        v.files,
                        v.bytes as f64 / 1e6,
                        secs,
                        if mode == VerifyMode::Digest && secs > 0.0 {
                            format!(" ({:.0} MB/s)", v.bytes as f64 / 1e6 / secs)
                        } else {
                            String::new()
                        }
                    );
                }
                let lost = match self.reached_before.take() {
                    Some(p) if p > m.step => {
                        let samples = (p - m.step) * m.cursor.global_batch;
                        format!(
                            "; the local ranks had reached step {p}: {} step(s) repeated{}",
                            p - m.step,
                            if samples > 0 {
                                format!(", {samples} samples replayed")
                            } else {
                                String::new()
                            }
                        )
                    }
                    _ => String::new(),
                };
                let from = m
                    .adopted_from
                    .as_deref()
                    .map(|r| format!(" of run {r} (--ckpt-resume-from)"))
                    .unwrap_or_default();
                tracing::info!(
                    "resuming from checkpoint step {}{from} (saved by generation {} at world size {}, now {}); data: epoch {}, sample {} of its permutation{lost}",
                    m.step,
                    m.generation,
                    m.world_size,
                    plan.world_size,
                    m.cursor.epoch,
                    m.cursor.consumed_in_epoch
                );
                let file = if m.adopted_from.is_some() {
                    // The other run's own manifest file: never rewritten under this run's id.
                    self.cfg.ckpt.resume_from.clone()
                } else {
                    match ckpt::publish(&m, None) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            tracing::warn!("{e}");
                            None
                        }
                    }
                };
                Ok(ResumeCheck::Use(file))
            }
            Err(reason) if m.adopted_from.is_some() => {
                let _ = link.tx.send(Request::MarkBad {
                    generation: plan.generation,
                    id: m.id(),
                    reason: reason.clone(),
                });
                Err(LaunchError::Config(crate::error::ConfigError::Invalid {
                    flag: "--ckpt-resume-from",
                    value: self
                        .cfg
                        .ckpt
                        .resume_from
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    why: format!(
                        "checkpoint step {} of run {} failed verification: {reason}; not starting run {} from the beginning instead (fix the checkpoint, name another one, or drop the flag)",
                        m.step,
                        m.adopted_from.as_deref().unwrap_or_default(),
                        self.cfg.run_id
                    ),
                }))
            }
            Err(reason) => {
                crate::say!(
                    "drun: checkpoint step {} (generation {}) failed verification: {reason}; marked bad, falling back to the previous checkpoint",
                    m.step, m.generation
                );
                let _ = link.tx.send(Request::MarkBad {
                    generation: plan.generation,
                    id: m.id(),
                    reason,
                });
                loop {
                    tokio::select! {
                        ev = link.rx.recv() => match ev {
                            Some(Event::Reform { .. }) | Some(Event::Fenced(_)) => return Ok(ResumeCheck::Rejoin),
                            Some(Event::Finished(end)) => return Ok(ResumeCheck::Exit(self.run_ended(&end))),
                            Some(Event::Error(e)) => return Err(LaunchError::RendezvousFailed(e)),
                            None => return Err(LaunchError::RendezvousFailed("the rendezvous session ended".into())),
                            Some(_) => {}
                        },
                        sig = self.next_teardown_signal() => return Ok(ResumeCheck::Exit(AgentExit::Signal(sig as i32))),
                    }
                }
            }
        }
    }

    /// Answers one worker API request (see [`crate::ckpt::api`]).
    fn on_api(
        &mut self,
        req: ApiRequest,
        reply: tokio::sync::oneshot::Sender<serde_json::Value>,
        link: &Link,
        plan: &Plan,
        resume_file: Option<&std::path::Path>,
    ) {
        let Some(ledger) = self.ledger.as_mut() else {
            let _ = reply.send(refused("no worker group is running"));
            return;
        };
        match req {
            ApiRequest::Resume => {
                let _ = reply.send(resume_answer(plan, resume_file));
            }
            ApiRequest::ShouldSave { .. } => {
                let _ = reply
                    .send(serde_json::json!({"ok": true, "save": self.save_requested.is_some() || self.scale_up_save.is_some()}));
            }
            ApiRequest::Progress { rank, step } => {
                let _ = reply.send(ledger.progress(rank, step));
            }
            ApiRequest::Commit {
                rank,
                generation,
                step,
                files,
                cursor,
            } => {
                if let Some(batch) = ledger.commit(rank, generation, step, files, cursor, reply) {
                    let _ = link.tx.send(Request::Commit {
                        commit: batch,
                        retention: self.cfg.ckpt.retention,
                    });
                }
            }
        }
    }

    /// The rendezvous' answer to this node's commit of `step`.
    fn on_committed(
        &mut self,
        generation: u64,
        step: u64,
        result: Result<drun_rendezvous::CommitOutcome, String>,
    ) {
        let Some(ledger) = self
            .ledger
            .as_mut()
            .filter(|l| l.generation() == generation)
        else {
            return;
        };
        let mut file = None;
        match &result {
            Ok(drun_rendezvous::CommitOutcome::Sealed {
                manifest,
                dropped,
                garbage,
            }) => {
                match ckpt::publish(manifest, self.cfg.ckpt.dir.as_deref()) {
                    Ok(p) => file = Some(p),
                    Err(e) => {
                        tracing::warn!("checkpoint sealed, but {e}")
                    }
                }
                tracing::debug!(
                    "checkpoint step {step} sealed here: {} files, {:.1} MB, world size {}",
                    manifest.files.len(),
                    manifest.bytes() as f64 / 1e6,
                    manifest.world_size
                );
                if let Some(root) = self.cfg.ckpt.dir.as_deref() {
                    ckpt::remove_garbage(root, garbage, dropped);
                }
            }
            Ok(_) => {}
            Err(e) => crate::say!("drun: checkpoint commit of step {step} refused: {e}"),
        }
        ledger.answered(step, &result, file.as_deref());
    }

    fn reap_into(&self, group: &mut WorkerGroup) {
        for (pid, exit, ours) in group.reap() {
            if ours {
                self.guard()
                    .lock()
                    .expect("guard mutex poisoned")
                    .unwatch(pid);
                tracing::debug!(pid = pid.as_raw(), ?exit, "worker exited");
            } else {
                tracing::debug!(pid = pid.as_raw(), ?exit, "reaped a re-parented descendant");
            }
        }
    }

    async fn supervise(
        &mut self,
        group: &mut WorkerGroup,
        link: &mut Link,
        plan: &Plan,
        resume_file: Option<&std::path::Path>,
    ) -> Outcome {
        let mut tick = tokio::time::interval(self.cfg.monitor_interval);
        loop {
            self.reap_into(group);
            if group.has_failure() {
                return Outcome::Failed;
            }
            if group.all_succeeded() {
                return Outcome::Succeeded;
            }
            let partial_deadline = group.first_success_at().map(|at| {
                let waited = at.elapsed().unwrap_or_default();
                Instant::now() + self.cfg.peer_exit_wait.saturating_sub(waited)
            });
            if partial_deadline.is_some_and(|d| d <= Instant::now()) {
                return Outcome::PartialSuccess(format!(
                    "partial success on node {}: {}",
                    self.cfg.node_id,
                    group.partial_success_line(self.cfg.peer_exit_wait)
                ));
            }
            let partial = async {
                match partial_deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = partial => {}
                _ = self.sigchld.recv() => {}
                _ = tick.tick() => {
                    if let Some(l) = self.ledger.as_mut() {
                        for line in l.stalled(STALLED_COMMIT) {
                            tracing::warn!("{line}");
                        }
                    }
                }
                Some(sig) = self.signals.recv() => {
                    let preempt = sig == self.cfg.preempt_signal
                        && self.cfg.on_preempt == OnPreempt::Checkpoint;
                    if preempt {
                        tracing::warn!(
                            "{}: preemption warning; asking every rank of the job for a coordinated checkpoint",
                            sig.as_str()
                        );
                        let reason = format!("{} (preemption warning) on node {}", sig.as_str(), self.cfg.node_id);
                        self.preempt_pending.get_or_insert(reason.clone());
                        let _ = link.tx.send(Request::Preempt {
                            generation: plan.generation,
                            reason,
                        });
                    }
                    if preempt {
                        // Workers learn it through should_save; a script without a handler
                        // for the signal would die of it.
                    } else if RELAYED.contains(&sig) {
                        tracing::info!("relaying {} to workers", sig.as_str());
                        group.signal_running(sig);
                    } else {
                        self.interrupted.get_or_insert(sig);
                        return Outcome::Signal(sig);
                    }
                }
                Some((req, reply)) = self.api_rx.recv() => self.on_api(req, reply, link, plan, resume_file),
                ev = link.rx.recv() => match ev {
                    Some(Event::Committed { generation, step, result }) => self.on_committed(generation, step, result),
                    Some(Event::SaveRequested(req)) if req.scale_up => {
                        if self.scale_up_save.is_none() {
                            tracing::info!("coordinated checkpoint requested ({}); workers see should_save = true", req.reason);
                        }
                        self.scale_up_save = Some(req.latest_before);
                    }
                    Some(Event::SaveRequested(req)) => {
                        if self.save_requested.is_none() {
                            tracing::warn!("coordinated checkpoint requested ({}); workers see should_save = true", req.reason);
                        }
                        self.preempt_pending.get_or_insert(req.reason);
                        self.save_requested = Some(req.latest_before);
                    }
                    Some(Event::Sealed(id)) => {
                        tracing::info!("checkpoint {} sealed", drun_rendezvous::ledger::describe_id(&id));
                        if self.save_requested.as_ref().is_some_and(|before| id > *before) {
                            return Outcome::Preempted(id);
                        }
                        if self.scale_up_save.as_ref().is_some_and(|before| id > *before) {
                            self.scale_up_save = None;
                        }
                    }
                    Some(Event::Reform { reason, .. }) => return Outcome::Reform(reason),
                    Some(Event::Finished(end)) => return Outcome::Finished(end),
                    Some(Event::Fenced(reason)) => return Outcome::Fenced(reason),
                    Some(Event::Error(e)) => return Outcome::Fenced(format!("rendezvous error: {e}")),
                    None => return Outcome::Fenced("the rendezvous session ended".into()),
                    Some(_) => {}
                },
            }
        }
    }

    /// Stops the group: `sig` to every worker's process group once, up to `--shutdown-timeout`
    /// for them to exit, then SIGKILL; then kills re-parented descendants and drains output.
    /// A second SIGINT during the grace period escalates to SIGKILL at once.
    async fn stop(&mut self, group: &mut WorkerGroup, sig: Signal) {
        group.mark_stopping();
        self.reap_into(group);
        if group.any_running() {
            group.signal_running(sig);
            let deadline = Instant::now() + self.cfg.shutdown_timeout;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut sigints = usize::from(sig == Signal::SIGINT);
            loop {
                self.reap_into(group);
                if !group.any_running() || Instant::now() >= deadline {
                    break;
                }
                tokio::select! {
                    _ = self.sigchld.recv() => {}
                    _ = tick.tick() => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                    Some(s) = self.signals.recv() => {
                        if RELAYED.contains(&s) {
                            group.signal_running(s);
                        } else {
                            self.interrupted.get_or_insert(s);
                            if s == Signal::SIGINT {
                                sigints += 1;
                            }
                            if sigints >= 2 {
                                tracing::warn!("second SIGINT: killing workers now");
                                break;
                            }
                            tracing::info!("{} received while stopping; already forwarded once", s.as_str());
                        }
                    }
                }
            }
            if group.any_running() {
                tracing::warn!("workers still running; sending SIGKILL");
                group.signal_running(Signal::SIGKILL);
                let kill_deadline = Instant::now() + KILL_WAIT;
                while group.any_running() && Instant::now() < kill_deadline {
                    tokio::select! {
                        _ = self.sigchld.recv() => {}
                        _ = tick.tick() => {}
                    }
                    self.reap_into(group);
                }
            }
        }
        if let Some(c) = self.restart_clock.as_mut() {
            c.stopped.get_or_insert_with(Instant::now);
        }
        self.sweep_descendants().await;
        group.drain_output(Instant::now() + DRAIN_WAIT).await;
    }

    /// SIGKILLs whatever the workers left behind: children re-parented to the agent and any
    /// process carrying this agent's DRUN_AGENT_ID. Bounded: gives up after `KILL_WAIT`.
    async fn sweep_descendants(&mut self) {
        let guard_pid = self.guard().lock().expect("guard mutex poisoned").pid();
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            let left = self.os.descendants(&self.agent_id, guard_pid);
            let _ = self.os.reap();
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

    /// `scontrol requeue $SLURM_JOB_ID` (node rank 0 only, after a preemption checkpoint).
    fn requeue(&mut self) {
        let Some(job) = self.cfg.slurm.as_ref().map(|j| j.job_id.clone()) else {
            crate::say!("drun: --requeue: not inside a Slurm job; nothing to requeue");
            return;
        };
        match std::process::Command::new("scontrol")
            .args(["requeue", &job])
            .output()
        {
            Ok(o) if o.status.success() => {
                tracing::info!("requeued Slurm job {job} (scontrol requeue)");
            }
            Ok(o) => crate::say!(
                "drun: scontrol requeue {job} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => crate::say!("drun: cannot run scontrol requeue {job}: {e}"),
        }
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

    async fn close(&mut self, exit: AgentExit) {
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
