//! The agent's one loop: `select!`s over its inputs (session events, SIGCHLD, handled signals,
//! worker API requests, the phase's deadline, the monitor tick, the resume verification),
//! steps the [`Machine`] and carries out the effects it returns.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drun_rendezvous::{Join, Plan, RendezvousError};
use nix::sys::signal::Signal;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::state::{Checked, Effect, End, Input, Level, Machine, Params, Workers};
use super::{step, Agent};
use crate::ckpt::api::{refused, ApiCall};
use crate::ckpt::node::NodeLedger;
use crate::ckpt::resume::{self, Verdict};
use crate::group::WorkerGroup;
use crate::os::ports::ReservedPort;
use crate::rdzv::Link;
use crate::slurm::OnPreempt;
use crate::summary::{self};
use crate::worker_store::WorkerStore;
use crate::{AgentExit, LaunchError};

/// How long some local ranks may wait for the others to commit a step before the agent says so.
const STALLED_COMMIT: Duration = Duration::from_secs(30);
/// How often a stopping agent reaps, in case a SIGCHLD was coalesced.
const STOP_POLL: Duration = Duration::from_millis(100);
/// How often a held first join looks whether the warm interpreters imported torch: the join
/// goes within this of the import's end, not within a monitor interval.
const HELD_JOIN_POLL: Duration = Duration::from_millis(10);
/// How often the step beacons are checked for a hang (with `--hang-timeout`).
const HANG_CHECK: Duration = Duration::from_millis(250);
/// How often a node reports its ranks' pace and learns the job's (straggler median).
const PACE_EVERY: Duration = Duration::from_secs(5);
/// How often the peer probes' verdict is looked at (a change is said and reported).
const PEERS_EVERY: Duration = crate::peers::PROBE_EVERY;
/// How often a peers report naming silent peers goes again while they stay silent.
const REPORT_AGAIN: Duration = Duration::from_secs(2);

mod api;
mod gpu_check;
mod hang_dump;
mod import_wait;
mod join;
pub(super) mod replicas;
pub(super) mod stage;
mod standby;
mod workers;

/// What the effects act on: the workers, the ports and the checkpoint ledger. Their generation's
/// plan is the machine's ([`Machine::plan`]), handed to the effects that need it.
#[derive(Default)]
struct World {
    group: Option<WorkerGroup>,
    resume_file: Option<PathBuf>,
    ledger: Option<NodeLedger>,
    /// Highest step the local ranks announced in the previous generation (lost-work report).
    reached_before: Option<u64>,
    reserved: Option<ReservedPort>,
    /// Served from the plan's arrival until the next join.
    worker_store: Option<WorkerStore>,
    candidate: Option<Join>,
    verifying: Option<JoinHandle<Verdict>>,
    /// The error a [`End::Fatal`] ends with.
    fatal: Option<LaunchError>,
    /// The workers as last reported to the machine.
    workers: Option<Workers>,
    /// When the first worker exited 0 (wall clock), as an [`Instant`].
    first_success: Option<(SystemTime, Instant)>,
    /// The API request being answered.
    call: Option<ApiCall>,
    /// The peers (node ranks) of this generation last said not to answer the probes.
    silent_peers: Vec<u32>,
    /// When this node's peers report last went out.
    peers_reported: Option<Instant>,
    /// Sent away by a partition, and standing by.
    partition: standby::Partition,
    /// The first join, held while the warm interpreters import torch (`import_wait`).
    held_join: Option<(Join, u64)>,
    /// The checks of this node's GPUs (`--gpu-health`; `None`: off or no NVIDIA GPU).
    gpus: Option<gpu_check::Gpus>,
    /// The running ranks' flight recorder dumps, taken at half the hang timeout.
    flight_snapshot: Option<super::hang::FlightSnapshot>,
    /// Checkpoints staged in memory (`--ckpt-memory`), and the persister's outcomes.
    stage: Option<stage::Stage>,
    stage_done: Option<tokio::sync::mpsc::UnboundedReceiver<crate::ckpt::memory::persist::Done>>,
    /// What the loop hears of replicas (`--ckpt-replicas 1`).
    replica_notes: Option<tokio::sync::mpsc::UnboundedReceiver<replicas::Note>>,
    /// Session events read while the machine did not (the workers stopping while the ledger's
    /// answers to persisted steps were awaited), in order, for the machine once it reads again;
    /// `None`: the session closed.
    deferred: std::collections::VecDeque<Option<drun_rendezvous::Event>>,
}

impl Agent {
    fn params(&self) -> Params {
        Params {
            run_id: self.cfg.run_id.clone(),
            node_id: self.cfg.node_id.clone(),
            max_restarts: self.cfg.supervision.max_restarts,
            peer_exit_wait: self.cfg.supervision.peer_exit_wait,
            shutdown_timeout: self.cfg.supervision.shutdown_timeout,
            preempt_signal: (self.cfg.scheduler.on_preempt == OnPreempt::Checkpoint)
                .then_some(self.cfg.scheduler.preempt_signal),
            requeue: self.cfg.scheduler.requeue,
            hang_timeout: self.cfg.observe.hang_timeout,
            straggler_factor: self.cfg.observe.straggler_factor,
        }
    }

    /// Runs the machine to its end.
    pub(super) async fn drive(&mut self, link: &mut Link) -> Result<AgentExit, LaunchError> {
        let p = self.params();
        let mut w = World {
            gpus: self.gpu_checks(),
            ..World::default()
        };
        if let (Some(budget), Some(dir)) = (self.cfg.ckpt.memory, self.cfg.ckpt.dir.as_deref()) {
            stage::sweep_leftovers(dir);
            if let Some((mut s, done)) = stage::Stage::open(budget, dir) {
                if let Some(listener) = self.replica_listener.take() {
                    w.replica_notes = s.start_replicas(
                        listener,
                        &self.cfg.run_id,
                        &self.cfg.node_id,
                        self.cfg.security.rdzv_token_text(),
                    );
                } else if self.cfg.ckpt.replicas > 0 {
                    tracing::info!(
                        "--ckpt-replicas: a run of one node keeps its checkpoints on that node"
                    );
                }
                w.stage = Some(s);
                w.stage_done = Some(done);
            }
        }
        crate::warm::prestart(&self.warm, &self.os, &self.cfg, &self.inherited).await;
        let (mut m, fx) = Machine::start();
        m = self.carry_out(m, fx, &mut w, link, &p).await?;
        let mut monitor = tokio::time::interval(self.cfg.supervision.monitor_interval);
        let mut poll = tokio::time::interval(STOP_POLL);
        let mut held_join = tokio::time::interval(HELD_JOIN_POLL);
        let mut hang_check = tokio::time::interval(HANG_CHECK);
        let mut pace = tokio::time::interval(PACE_EVERY);
        let mut peers = tokio::time::interval(PEERS_EVERY);
        let probing = self.peers.is_some();
        while !m.is_done() {
            let deadline = m.deadline();
            let stopping = matches!(m.phase, super::Phase::Stopping(_));
            if m.reads_session() {
                if let Some(ev) = w.deferred.pop_front() {
                    let input = self.session_event(ev, &mut w, link);
                    m = self.feed(m, input, &mut w, link, &p).await?;
                    continue;
                }
            }
            // The end of the workers waits for the ledger's answers to the steps persisted
            // behind them: the session is read for those while the machine does not read it.
            let awaits_answers = w.stage.as_ref().is_some_and(stage::Stage::awaits_answers)
                && !w.deferred.back().is_some_and(Option::is_none);
            let input = tokio::select! {
                ev = link.rx.recv(), if m.reads_session() || awaits_answers => {
                    if let Some(drun_rendezvous::Event::Ping) = &ev {
                        // A peer does not hear this node: the session asks whether it is there.
                        let _ = link.tx.send(drun_rendezvous::Request::KeepAlive);
                        continue;
                    }
                    if let Some(drun_rendezvous::Event::Committed { generation, step, result }) = &ev {
                        // The answer to a step persisted behind the training, in any phase.
                        self.answered(*generation, *step, result, w.stage.as_mut(), w.ledger.as_ref());
                    }
                    if !m.reads_session() {
                        w.deferred.push_back(ev);
                        continue;
                    }
                    self.session_event(ev, &mut w, link)
                }
                _ = pace.tick(), if self.cfg.observe.straggler_factor > 0.0 => Some(Input::PaceDue),
                _ = peers.tick(), if probing => {
                    self.check_peers(&m, &mut w, link);
                    self.join_when_reachable(&mut w.partition, link);
                    None
                }
                Some(call) = self.api_rx.recv(), if m.reads_session() => {
                    w.call = Some(call);
                    Some(Input::Api)
                }
                Some(sig) = self.signals.recv(), if m.reads_signals() => Some(Input::Signal(sig)),
                _ = self.sigchld.recv() => None,
                _ = poll.tick(), if stopping => None,
                _ = held_join.tick(), if w.held_join.is_some() => {
                    self.release_first_join(&mut w, link);
                    None
                }
                _ = monitor.tick() => {
                    if let (Some(m), Some(s)) = (&self.metrics, &w.stage) {
                        let (held, lag) = s.lag();
                        m.staging(held, lag, 0);
                    }
                    self.warm.lock().expect("warm pool mutex poisoned").poll();
                    self.release_first_join(&mut w, link);
                    Some(Input::Monitor)
                }
                _ = hang_check.tick(), if self.cfg.observe.hang_timeout.is_some() => Some(Input::HangCheck),
                _ = sleep_until(deadline), if deadline.is_some() => Some(Input::Tick),
                ev = gpu_check::next(&mut w.gpus) => {
                    if let Some((cand, after)) = self.on_gpus(ev, &mut w.gpus, w.group.as_ref().is_some_and(WorkerGroup::any_running), link)? {
                        self.send_join(cand, after, &mut w, link);
                    }
                    None
                }
                Some(done) = stage::next_done(&mut w.stage_done) => {
                    self.persisted(done, w.stage.as_mut(), w.ledger.as_mut(), link);
                    None
                }
                Some(note) = replicas::next(&mut w.replica_notes) => {
                    self.replica_note(note, w.stage.as_mut(), w.ledger.as_ref(), link);
                    None
                }
                v = join(&mut w.verifying), if w.verifying.is_some() => {
                    w.verifying = None;
                    Some(Input::Verified(self.checked(v, &mut w)))
                }
            };
            m = self.feed(m, input, &mut w, link, &p).await?;
            if let Some(probes) = &self.peers {
                probes.health().set_keeps_generation(m.keeps_generation());
            }
        }
        let super::Phase::Done(end) = m.phase else {
            unreachable!("the loop ends when the machine is done")
        };
        self.ended(end, &mut w)
    }

    /// A session event for the machine (its answer to a commit already handed to the staging
    /// driver): a standby's reach and a fence's reason are noted first.
    fn session_event(
        &mut self,
        ev: Option<drun_rendezvous::Event>,
        w: &mut World,
        link: &Link,
    ) -> Option<Input> {
        if let Some(drun_rendezvous::Event::StandBy(reach)) = &ev {
            self.told_whom(&mut w.partition, reach, link);
            return None;
        }
        if let Some(drun_rendezvous::Event::Fenced(why)) = &ev {
            w.partition.sent_away = why.starts_with(drun_rendezvous::session::split::PARTITIONED);
        }
        Some(ev.map_or(Input::SessionClosed, Input::Event))
    }

    fn ended(&self, end: End, w: &mut World) -> Result<AgentExit, LaunchError> {
        match end {
            End::Exit(exit) => Ok(exit),
            End::RunFinished(end) if end.unfit => Err(LaunchError::GpuUnhealthy(end.reason)),
            End::RunFinished(end) if end.retryable => {
                Err(LaunchError::RendezvousFailed(end.reason))
            }
            End::RunFinished(end) => Err(LaunchError::RunFinished {
                run: self.cfg.run_id.clone(),
                at: summary::format_time(UNIX_EPOCH + Duration::from_millis(end.at_ms)),
                outcome: if end.success {
                    "succeeded".into()
                } else {
                    format!("failed: {}", end.reason)
                },
            }),
            End::RendezvousFailed(e) => Err(LaunchError::RendezvousFailed(e)),
            End::SessionEnded => Err(LaunchError::Rendezvous(RendezvousError::Assignment(
                "the rendezvous session ended".into(),
            ))),
            End::Fatal => Err(w
                .fatal
                .take()
                .expect("a fatal end follows an error the loop kept")),
        }
    }

    /// The verdict on the resume point, less the error (kept for the end).
    fn checked(&self, v: Result<Verdict, tokio::task::JoinError>, w: &mut World) -> Checked {
        match v {
            Ok(Verdict::Use(file)) => {
                w.reached_before = None;
                Checked::Use(file)
            }
            Ok(Verdict::Bad { id, reason }) => Checked::Bad { id, reason },
            Ok(Verdict::Refuse { mark_bad, error }) => {
                w.fatal = Some(LaunchError::Config(error));
                Checked::Refuse(mark_bad)
            }
            Err(e) => {
                w.fatal = Some(LaunchError::os(
                    "the resume point check failed",
                    std::io::Error::other(e.to_string()),
                ));
                Checked::Refuse(None)
            }
        }
    }

    /// Steps the machine with `input` (if any), carries out the effects, then reports the
    /// workers' state when it changed — until nothing follows.
    async fn feed(
        &mut self,
        mut m: Machine,
        input: Option<Input>,
        w: &mut World,
        link: &mut Link,
        p: &Params,
    ) -> Result<Machine, LaunchError> {
        let mut next = input;
        loop {
            if let Some(input) = next.take() {
                let (after, fx) = self.step(m, input, w, p);
                m = self.carry_out(after, fx, w, link, p).await?;
            }
            match self.reaped(&m, w) {
                Some(workers) if !m.is_done() => next = Some(Input::Workers(workers)),
                _ => return Ok(m),
            }
        }
    }

    /// Carries out `fx` in order; an effect that answers (spawned, stopped) steps the machine.
    async fn carry_out(
        &mut self,
        mut m: Machine,
        fx: Vec<Effect>,
        w: &mut World,
        link: &mut Link,
        p: &Params,
    ) -> Result<Machine, LaunchError> {
        let mut queue = std::collections::VecDeque::from(fx);
        while let Some(effect) = queue.pop_front() {
            if let Some(input) = self.execute(effect, &m, w, link).await? {
                let (after, more) = self.step(m, input, w, p);
                m = after;
                queue.extend(more);
            }
        }
        Ok(m)
    }

    /// [`step`] at the current instant, telling the metrics (if any) what the input says.
    fn step(&self, m: Machine, input: Input, w: &World, p: &Params) -> (Machine, Vec<Effect>) {
        let now = Instant::now();
        if let Some(metrics) = &self.metrics {
            super::observe::input(metrics, &m, &input, w.group.as_ref(), now);
        }
        step(m, input, now, p)
    }

    /// One effect, for the machine `m` that asked for it; `Some(input)` when it answers the
    /// machine at once.
    async fn execute(
        &mut self,
        effect: Effect,
        m: &Machine,
        w: &mut World,
        link: &mut Link,
    ) -> Result<Option<Input>, LaunchError> {
        match effect {
            Effect::Log(level, gen, text) => log(level, gen, &self.cfg.run_id, &text),
            Effect::Say(line) => crate::say!("{line}"),
            Effect::Send(req) => {
                let _ = link.tx.send(req);
            }
            Effect::Join { fresh, after } => self.join(fresh, after, w, link)?,
            Effect::Formed(plan) => self.formed(plan, w).await?,
            Effect::Spawn(file) => {
                let plan = m.plan().expect("workers are spawned for a formed plan");
                return Ok(Some(self.spawn(file, plan, w).await));
            }
            Effect::Relay(sig) => {
                if let Some(g) = &w.group {
                    g.signal_running(sig);
                }
            }
            Effect::SuspendSelf => {
                // Continued by SIGCONT (fg, bg, kill -CONT), which the agent then relays.
                let _ = nix::sys::signal::raise(Signal::SIGSTOP);
            }
            Effect::Stop(sig) => self.stop(sig, w),
            Effect::Kill => {
                if let Some(g) = &w.group {
                    g.signal_running(Signal::SIGKILL);
                }
            }
            Effect::Cleanup => return Ok(Some(self.cleanup(w).await)),
            Effect::ReleasePort => w.reserved = None,
            Effect::Committed {
                generation,
                step,
                result,
            } => {
                if let Some(l) = w.ledger.as_mut() {
                    l.on_committed(generation, step, &result, self.cfg.ckpt.dir.as_deref());
                }
            }
            Effect::PersistNow => {
                if let Some(s) = w.stage.as_mut() {
                    s.hurry();
                }
            }
            Effect::CheckStalled => {
                if let Some(l) = w.ledger.as_mut() {
                    for line in l.stalled(STALLED_COMMIT) {
                        tracing::warn!("{line}");
                    }
                }
            }
            Effect::Serve { should_save } => {
                // A request this node already answered with a step staged in memory asks no more
                // (its seal follows once persisted).
                let newest = w.stage.as_ref().and_then(stage::Stage::newest);
                let should_save = should_save && m.save().is_none_or(|s| s.asks(newest.as_deref()));
                return Ok(self.serve(should_save, m.plan(), w, link));
            }
            Effect::Refuse => {
                if let Some((_, reply)) = w.call.take() {
                    let _ = reply.send(refused("no worker group is running"));
                }
            }
            Effect::Also(line) => self.also.push(line),
            Effect::Summarize(history) => {
                if let Some(g) = w.group.take() {
                    self.summarize(&g, &history);
                    w.group = Some(g);
                }
            }
            Effect::RemoteCause(c) => self.summarize_remote(&c),
            Effect::Requeue => crate::slurm::requeue(self.cfg.scheduler.slurm.as_ref()),
            Effect::DumpStacks { ranks, line } => {
                let nodes = m.plan().map_or(1, |p| p.node_count());
                self.dump_hung(&ranks, nodes, w, link).await;
                return Ok(Some(Input::Hung(line)));
            }
            Effect::FlightSnapshot => self.snapshot_flight(w).await,
            Effect::ReportFlightSnapshot => {
                let nodes = m.plan().map_or(1, |p| p.node_count());
                self.report_snapshot(nodes, w, link);
            }
            Effect::Straggler { event, stragglers } => {
                if let Some(plan) = m.plan() {
                    self.straggler(event, &stragglers, plan, link);
                }
            }
        }
        Ok(None)
    }

    /// A plan arrived: announce it, serve the workers' store, start the resume check.
    async fn formed(&mut self, plan: Box<Plan>, w: &mut World) -> Result<(), LaunchError> {
        // The worker store first: a MASTER_PORT another process holds is the user's error
        // (exit 2), and the world is not announced as formed before it.
        w.worker_store = crate::worker_store::host(
            self.cfg.workers.worker_store,
            &plan,
            &self.cfg.node_id,
            &mut w.reserved,
        )
        .await?;
        self.announce(&plan);
        if let Some(p) = &self.peers {
            p.follow(&plan);
        }
        if let Some(s) = w.stage.as_mut() {
            s.follow(&plan);
        }
        w.silent_peers.clear();
        // A resume from the survivors' copies in memory: gathered and verified here, not read
        // from --ckpt-dir.
        if let (Some(sources), Some(m)) = (plan.resume_memory.clone(), plan.resume.clone()) {
            w.verifying = Some(self.resume_from_peers(&plan, m, sources, w.stage.as_mut()));
            return Ok(());
        }
        let run_id = self.cfg.run_id.clone();
        let ckpt = self.cfg.ckpt.clone();
        let may_resume_files = self.may_resume_files();
        let reached = w.reached_before;
        let adoption_failed = self.adoption_failed.clone();
        let checked = plan.clone();
        w.verifying = Some(tokio::spawn(async move {
            let src = resume::Source {
                run_id: &run_id,
                ckpt: &ckpt,
                may_resume_files,
            };
            resume::check(src, &checked, reached, adoption_failed).await
        }));
        Ok(())
    }
}

/// One log line of the machine, with the run and generation when it names one.
fn log(level: Level, gen: Option<u64>, run: &str, text: &str) {
    match (level, gen) {
        (Level::Info, Some(gen)) => tracing::info!(run = %run, gen, "{text}"),
        (Level::Info, None) => tracing::info!("{text}"),
        (Level::Warn, Some(gen)) => tracing::warn!(run = %run, gen, "{text}"),
        (Level::Warn, None) => tracing::warn!("{text}"),
        (Level::Error, Some(gen)) => tracing::error!(run = %run, gen, "{text}"),
        (Level::Error, None) => tracing::error!("{text}"),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn join(h: &mut Option<JoinHandle<Verdict>>) -> Result<Verdict, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}
