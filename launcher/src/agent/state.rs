//! The agent's state ([`Machine`], [`Phase`]), what drives it ([`Input`]) and what it asks the
//! loop to do ([`Effect`]). The transitions are in [`super::step()`].

use std::path::PathBuf;
use std::time::Duration;

use drun_rendezvous::decisions::root_cause::RootCause;
use drun_rendezvous::round::Restarts;
use drun_rendezvous::session::{Request, RunEnd};
use drun_rendezvous::{Event, Plan};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::hang::{self, Beacons};
use super::straggler::{self, Detector};
use crate::metrics::work::RankClock;
use crate::phases::RestartClock;
use crate::AgentExit;

/// How long teardown waits for SIGKILLed workers (e.g. in uninterruptible sleep) to be reaped.
pub const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long a node whose failure the loss of another node caused waits for the session to say
/// why the generation closed.
pub const REFORM_REASON_WAIT: Duration = Duration::from_secs(2);
/// How long a fenced node waits before it joins again.
pub const REJOIN_PAUSE: Duration = Duration::from_millis(200);
/// Signals relayed to workers without tearing anything down.
pub const RELAYED: [Signal; 2] = [Signal::SIGUSR1, Signal::SIGUSR2];

/// Job control: Ctrl-Z (SIGTSTP) stops the workers, then the agent; `fg`/`bg` (SIGCONT, which
/// the shell sends to the agent's process group only) resumes them. Workers run in sessions of
/// their own, so without this the terminal would stop the agent alone — torchrun's workers share
/// its process group and stop with it.
pub const JOB_CONTROL: [Signal; 2] = [Signal::SIGTSTP, Signal::SIGCONT];

/// What the transitions need to know about the launch (plain values: tests build them).
#[derive(Debug, Clone)]
pub struct Params {
    /// This run (`--rdzv-id`).
    pub run_id: String,
    /// This node.
    pub node_id: String,
    /// `--max-restarts` (for the log lines; the session decides).
    pub max_restarts: u32,
    /// `--peer-exit-wait`.
    pub peer_exit_wait: Duration,
    /// `--shutdown-timeout`.
    pub shutdown_timeout: Duration,
    /// `--preempt-signal`, when `--on-preempt checkpoint` (else `None`: no preemption warning).
    pub preempt_signal: Option<Signal>,
    /// `--requeue`.
    pub requeue: bool,
    /// `--hang-timeout`: the step beacons are judged for hangs.
    pub hang_timeout: Option<hang::Timeout>,
    /// `--straggler-factor` (> 0: the step beacons are judged for stragglers).
    pub straggler_factor: f64,
}

/// The whole state of the agent.
#[derive(Debug)]
pub struct Machine {
    /// Where the run is.
    pub phase: Phase,
    /// The first teardown signal received, if any: once set, the agent exits 128+N instead
    /// of joining again.
    pub interrupted: Option<Signal>,
    /// A preemption warning whose checkpoint is not sealed yet (the reason line), kept across
    /// re-forms: each new generation is asked again until the seal stops the workers.
    pub preempt_pending: Option<String>,
    /// The restart under way, timed phase by phase (printed once its workers are spawned).
    pub clock: Option<RestartClock>,
    /// Suspended by SIGTSTP (Ctrl-Z) and not resumed yet: the SIGCONT that resumes it says so.
    /// Any other SIGCONT is relayed without a word: Slurm's `scancel` and `timeout(1)` send one
    /// before their SIGTERM.
    pub suspended: bool,
}

/// Where the agent is.
#[derive(Debug)]
pub enum Phase {
    /// Joined the rendezvous; waiting for a plan. After a fence, joins again at `rejoin_at`.
    Forming {
        /// When to send the Join again (after a fence), if at all.
        rejoin_at: Option<Instant>,
        /// The generation this node was last part of (`None`: never part of one): a Join
        /// says "after this one", and the peer probes report on it until the next plan.
        after: Option<Box<Plan>>,
    },
    /// The plan's resume point is being verified; the workers start once it passes.
    Verifying {
        /// The new generation.
        plan: Box<Plan>,
        /// Coordinated checkpoints requested meanwhile.
        save: Save,
    },
    /// The resume point failed verification and was marked bad: waiting for the re-form.
    AwaitingReform {
        /// The generation that will not run.
        plan: Box<Plan>,
    },
    /// The workers run.
    Running {
        /// Their generation.
        plan: Box<Plan>,
        /// Coordinated checkpoints requested of them.
        save: Save,
        /// Some local workers exited 0 and others still run: when that becomes a failure,
        /// and the line saying so.
        partial: Option<(Instant, String)>,
        /// What their step beacons told so far.
        progress: Progress,
    },
    /// The workers are being stopped; `then` says what comes next.
    Stopping(Stopping),
    /// A worker failure was reported: waiting for the job-wide decision.
    Reporting(Reporting),
    /// Every local worker exited 0: waiting for the run to end (the exit barrier) until
    /// `deadline` (`--peer-exit-wait`).
    AwaitingEnd {
        /// The generation that finished here.
        plan: Box<Plan>,
        /// When the other nodes are late.
        deadline: Instant,
    },
    /// The agent is done.
    Done(End),
}

/// Coordinated checkpoints requested of the running generation (`should_save` is true while
/// one is). Each holds `ckpt/latest` at the time of the request: a later seal fulfils it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Save {
    /// None requested.
    #[default]
    Idle,
    /// The checkpoint interval passed (`--ckpt-interval`): its seal only ends the request.
    Interval {
        /// `ckpt/latest` when requested.
        latest_before: String,
    },
    /// Before admitting a newcomer (`--on-scale-up checkpoint`): its seal only ends the request.
    ScaleUp {
        /// `ckpt/latest` when requested.
        latest_before: String,
    },
    /// For a preemption: its seal stops the workers (exit 5).
    Preempt {
        /// `ckpt/latest` when requested.
        latest_before: String,
    },
}

impl Save {
    /// Whether this node's ranks are still asked to save, given the newest step this node
    /// staged in memory (`--ckpt-memory`; its manifest id, `"<step>-<generation>"`): a request
    /// is answered for them by a staged step newer than the request — its seal follows once it
    /// is persisted, and ends the request (a preemption's stops the workers, exit 5) — so they
    /// do not save again at every step while the disk catches up. A preemption's step is
    /// persisted at full speed ([`Effect::PersistNow`]), so its seal comes within the grace; so
    /// is a scale-up's, which the newcomer waits for.
    pub fn asks(&self, newest_staged: Option<&str>) -> bool {
        match self {
            Save::Idle => false,
            Save::Interval { latest_before }
            | Save::ScaleUp { latest_before }
            | Save::Preempt { latest_before } => {
                newest_staged.is_none_or(|id| id <= latest_before.as_str())
            }
        }
    }
}

/// What the running generation's step beacons (`drun.progress(step)`) tell: hangs
/// (`--hang-timeout`) and stragglers (`--straggler-factor`), judged by [`super::step()`].
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The last beacon of each local rank (with `--hang-timeout`).
    pub beacons: Beacons,
    /// The local ranks' step times and straggler verdicts (with `--straggler-factor` > 0).
    pub stragglers: Option<(RankClock, Detector)>,
}

impl Progress {
    /// A new generation's: nothing heard yet.
    pub fn new(p: &Params) -> Self {
        Self {
            beacons: Beacons::default(),
            stragglers: (p.straggler_factor > 0.0)
                .then(|| (RankClock::default(), Detector::new(p.straggler_factor))),
        }
    }
}

/// Stopping the workers: the signal went to every process group; SIGKILL after the grace.
#[derive(Debug)]
pub struct Stopping {
    /// The generation being stopped.
    pub plan: Box<Plan>,
    /// Where teardown is.
    pub stage: StopStage,
    /// SIGINTs received (a second one kills at once).
    pub sigints: usize,
    /// What follows.
    pub then: Then,
}

/// Where teardown is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopStage {
    /// Signalled; SIGKILL at `deadline` (`--shutdown-timeout`).
    Grace {
        /// End of the grace period.
        deadline: Instant,
    },
    /// SIGKILLed; waiting for the reaping until `deadline` at most.
    Killing {
        /// When the agent gives up waiting.
        deadline: Instant,
    },
    /// Every worker is gone: descendants swept, output drained.
    Cleaning,
}

/// What follows a stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Then {
    /// The local workers succeeded: tell the session, await the end.
    AwaitEnd,
    /// Report the worker failure (`partial`: a partial success, with its description).
    Report {
        /// A partial success's or a hang's description; `None`: a worker failed (summary on
        /// the end).
        partial: Option<String>,
    },
    /// Join the next generation.
    Rejoin,
    /// The run ended.
    Finished(RunEnd),
    /// A handled signal: exit 128+N.
    Exit(Signal),
    /// The preemption checkpoint was sealed: requeue (rank 0, `--requeue`), exit 5.
    Preempted,
    /// The workers could not be started (this description): report it as this node's worker
    /// failure; if the run ends, it ends with the error the loop holds.
    ReportUnstarted(String),
}

/// Waiting for the job-wide decision on a reported failure.
#[derive(Debug)]
pub struct Reporting {
    /// The generation that failed.
    pub plan: Box<Plan>,
    /// One line: which rank, which exit (or the partial success).
    pub description: String,
    /// The failed worker in detail, when one failed.
    pub cause: Option<RootCause>,
    /// What the end prints if the run ends with this failure.
    pub ending: Ending,
    /// Why the generation closed, when the session said (before or after the decision).
    pub reform: Option<String>,
    /// A decision to re-form without spending the budget, waiting up to `deadline` for the
    /// reason of the re-form.
    pub decided: Option<(Restarts, Instant)>,
    /// The run's end, when the session said the run ended before it answered this report
    /// (another node's failure ended it first): the decision if the session closes unanswered.
    pub ended: Option<Box<RunEnd>>,
}

/// What a node whose failure ends the run prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The failure summary (a worker failed).
    Summary,
    /// The description, one line (a partial success).
    Line,
    /// The error the loop holds (the workers could not be started): [`End::Fatal`].
    Fatal,
}

/// How the agent ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// With this exit status.
    Exit(AgentExit),
    /// The run had already ended before this node ever joined it.
    RunFinished(RunEnd),
    /// The rendezvous failed for good (one line).
    RendezvousFailed(String),
    /// The session closed while forming.
    SessionEnded,
    /// With the error the loop holds (the workers could not start, the resume point is
    /// unusable).
    Fatal,
}

/// What the local workers look like after the last reaping.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Workers {
    /// Some still run.
    pub running: bool,
    /// Some failed on their own.
    pub failed: bool,
    /// All exited 0.
    pub all_succeeded: bool,
    /// Some exited 0 while others still run: when the first did, and the line saying so.
    pub first_success: Option<(Instant, String)>,
    /// The global ranks that exited 0 (a finished rank is not judged for a hang).
    pub finished: Vec<u32>,
}

/// What drives the machine.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // moved once, straight into `step`
pub enum Input {
    /// From the rendezvous session.
    Event(Event),
    /// The session's channel closed.
    SessionClosed,
    /// A handled signal.
    Signal(Signal),
    /// The workers after a reaping.
    Workers(Workers),
    /// Time passed (a deadline of the phase may be due).
    Tick,
    /// `--monitor-interval` tick.
    Monitor,
    /// The verdict on the resume point.
    Verified(Checked),
    /// The workers were spawned.
    Spawned,
    /// The workers could not all be spawned: why, one line (the loop holds the error).
    SpawnFailed(String),
    /// Teardown finished; the root-cause line when a worker failed.
    Stopped {
        /// "rank 1 (pid 42) exited with 1 on node n1".
        failure: Option<String>,
        /// That failure in detail (reported to the session as the generation's root cause).
        cause: Option<RootCause>,
    },
    /// A worker API request (the loop holds it and its reply).
    Api,
    /// A local rank announced a step (`drun.progress(step)`, accepted by the ledger).
    Beacon {
        /// Its global rank.
        rank: u32,
        /// The step.
        step: u64,
    },
    /// Time to judge the step beacons for a hang (`--hang-timeout`).
    HangCheck,
    /// Local ranks sent no step beacon for `--hang-timeout` (their stacks were dumped): the
    /// hang's line, naming them and their last steps.
    Hung(String),
    /// Time to report this node's pace (its ranks' median step times) to the job.
    PaceDue,
}

/// The verdict on the resume point ([`crate::ckpt::resume::Verdict`] less the error, which
/// the loop holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Start from it; the manifest file to hand the workers, if there is a resume point.
    Use(Option<PathBuf>),
    /// This run's checkpoint failed verification: mark it bad, wait for the re-form.
    Bad {
        /// Manifest id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The run cannot start (exit with the error the loop holds), after marking this
    /// manifest (id, reason) bad, if set.
    Refuse(Option<(String, String)>),
}

/// Log levels of [`Effect::Log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `tracing::info!`.
    Info,
    /// `tracing::warn!`.
    Warn,
    /// `tracing::error!`.
    Error,
}

/// What the loop does for the machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// One log line (with the generation, if any).
    Log(Level, Option<u64>, String),
    /// One line on stderr (`drun: ...`).
    Say(String),
    /// A request to the session.
    Send(Request),
    /// Join the generation after `after`: with a freshly reserved port (`fresh`), or the
    /// candidate of the last Join again (after a fence while forming).
    Join {
        /// Reserve a new port, build a new candidate.
        fresh: bool,
        /// The last generation this node ran.
        after: u64,
    },
    /// A plan arrived: announce it, serve the workers' store (node rank 0), check its resume
    /// point (answered by [`Input::Verified`]).
    Formed(Box<Plan>),
    /// Spawn the workers (answered by [`Input::Spawned`] or [`Input::SpawnFailed`]).
    Spawn(Option<PathBuf>),
    /// Send the signal to every running worker.
    Relay(Signal),
    /// Stop the agent itself (SIGSTOP), after its workers were stopped.
    SuspendSelf,
    /// Mark the group stopping and send it the signal (the ledger closes).
    Stop(Signal),
    /// SIGKILL every worker still running.
    Kill,
    /// Sweep descendants, drain output (answered by [`Input::Stopped`]).
    Cleanup,
    /// Release the reserved MASTER_PORT.
    ReleasePort,
    /// Pass the session's answer to a commit to the ledger.
    Committed {
        /// Generation.
        generation: u64,
        /// Step.
        step: u64,
        /// The answer.
        result: Result<drun_rendezvous::CommitOutcome, drun_rendezvous::CommitRefused>,
    },
    /// Warn about ranks that wait on a commit the others have not made.
    CheckStalled,
    /// Persist staged checkpoints at full speed from now on (a preemption: its step must reach
    /// the disk within the grace; there is no training left to spare).
    PersistNow,
    /// Answer the held API request (`should_save` as given).
    Serve {
        /// A coordinated checkpoint is requested.
        should_save: bool,
    },
    /// Refuse the held API request: no worker group runs.
    Refuse,
    /// A secondary problem, printed after the primary error.
    Also(String),
    /// Print the failure summary (earlier failures: `history` less its last line).
    Summarize(Vec<String>),
    /// Print the failure summary of a run that another node's worker failure ended.
    RemoteCause(RootCause),
    /// `scontrol requeue` the Slurm job.
    Requeue,
    /// Dump the stacks of these hung local ranks (global ranks), then answer with
    /// [`Input::Hung`] and the hang's line.
    DumpStacks {
        /// The stuck ranks.
        ranks: Vec<u32>,
        /// The hang's line.
        line: String,
    },
    /// Ask every running local rank for its flight recorder's dump and keep the dumps: a local
    /// rank has been silent for half the hang timeout in a generation of several nodes
    /// ([`crate::agent::hang::Beacons::snapshot_due`]).
    FlightSnapshot,
    /// Report the kept flight recorder dumps to the job: the group stops (a worker failed, or
    /// the job stops it) while the silence they were taken in goes on, before this node judged
    /// it a hang. Its ranks most likely waited in a collective that another node's hang verdict
    /// broke; `status` judges every node's dumps together.
    ReportFlightSnapshot,
    /// A local rank's straggler verdict changed: say it, count it, report the node's
    /// stragglers (these: rank, seconds per step, the median then) to the job.
    Straggler {
        /// The change.
        event: straggler::Event,
        /// Every local rank flagged now.
        stragglers: Vec<(u32, f64, f64)>,
    },
}

impl Machine {
    /// A new agent: forming its first generation (and the Join that starts it).
    pub fn start() -> (Self, Vec<Effect>) {
        let m = Self {
            phase: Phase::Forming {
                rejoin_at: None,
                after: None,
            },
            interrupted: None,
            preempt_pending: None,
            clock: None,
            suspended: false,
        };
        (
            m,
            vec![Effect::Join {
                fresh: true,
                after: 0,
            }],
        )
    }

    /// The next instant at which [`Input::Tick`] is due, if any.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Forming { rejoin_at, .. } => *rejoin_at,
            Phase::Running { partial, .. } => partial.as_ref().map(|(d, _)| *d),
            Phase::Stopping(s) => match s.stage {
                StopStage::Grace { deadline } | StopStage::Killing { deadline } => Some(deadline),
                StopStage::Cleaning => None,
            },
            Phase::Reporting(r) => r.decided.as_ref().map(|(_, d)| *d),
            Phase::AwaitingEnd { deadline, .. } => Some(*deadline),
            Phase::Verifying { .. } | Phase::AwaitingReform { .. } | Phase::Done(_) => None,
        }
    }

    /// The generation the agent is in, or (forming) was last part of.
    /// The coordinated checkpoint requested of the running workers, if they run.
    pub fn save(&self) -> Option<&Save> {
        match &self.phase {
            Phase::Running { save, .. } => Some(save),
            _ => None,
        }
    }

    pub fn plan(&self) -> Option<&Plan> {
        match &self.phase {
            Phase::Forming { after, .. } => after.as_deref(),
            Phase::Verifying { plan, .. }
            | Phase::AwaitingReform { plan }
            | Phase::Running { plan, .. }
            | Phase::AwaitingEnd { plan, .. } => Some(plan),
            Phase::Stopping(s) => Some(&s.plan),
            Phase::Reporting(r) => Some(&r.plan),
            Phase::Done(_) => None,
        }
    }

    /// Whether the loop reads session events and API requests now: not while stopping (they
    /// wait for the phase that follows, as does a failure's re-form reason).
    pub fn reads_session(&self) -> bool {
        !matches!(self.phase, Phase::Stopping(_) | Phase::Done(_))
    }

    /// Whether the loop reads signals now.
    pub fn reads_signals(&self) -> bool {
        !matches!(self.phase, Phase::Done(_))
    }

    /// Whether the agent is done.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done(_))
    }

    /// Whether this node holds on to its generation: its workers train it, or their failure
    /// waits for the job's decision. Either is the state a rendezvous outage leaves as it is
    /// while the generation's peers answer (see `crate::peers`), even before the link took the
    /// failure report: a report sent while no server answers waits in the link's queue.
    pub fn keeps_generation(&self) -> bool {
        matches!(self.phase, Phase::Running { .. } | Phase::Reporting(_))
    }

    /// Whether the user forced the end (a second SIGINT while stopping): the workers are
    /// killed, and the end no longer waits for the staged checkpoints to reach the disk.
    pub fn end_forced(&self) -> bool {
        matches!(&self.phase, Phase::Stopping(s) if s.sigints >= 2)
    }

    /// Whether the local workers' end (none runs any more) waits for their staged checkpoints
    /// to reach `--ckpt-dir`, bounded by `--shutdown-timeout`: when what follows may be the
    /// run's end or this agent's exit — the workers succeeded, or failed on their own (the
    /// failure is reported after the wait: with the restart budget spent it ends the run, and
    /// with restarts left the next generation resumes the newest *sealed* step, which a staged
    /// step becomes once persisted; only with `--ckpt-replicas` does a join report the steps
    /// held in memory for a resume from them), a signal, a preemption, the run finished. Not
    /// when they were stopped for a re-form (a node lost or arrived, a fence): the agent lives
    /// on with its staged copies, the next generation resumes from them, and the persister
    /// carries on behind its training.
    pub fn end_waits_for_disk(&self) -> bool {
        match &self.phase {
            Phase::Running { .. } => true,
            Phase::Stopping(s) => !matches!(s.then, Then::Rejoin),
            _ => false,
        }
    }
}
