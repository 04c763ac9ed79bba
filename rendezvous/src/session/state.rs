//! The session's state as data: its [`Phase`], the lease and the last generation, a pending
//! retry, and the [`Input`]s and [`Effect`]s of its pure [`step`](super::step::step).
//!
//! # The states
//!
//! * [`Phase::Idle`] — holding a lease (or none, after a failed round), neither waiting nor
//!   running: after the session opened, after a generation ended (re-form, end of the run).
//! * [`Phase::Waiting`] — joined the round with this join, since then; the driver holds the
//!   round's future beside the state and reports its decision as [`Input::Decided`].
//! * [`Phase::Running`] — a member of a running generation; its deadlines (the successor's
//!   start, the scale-up window and save, the checkpoint interval, the silence wait) live in
//!   [`Running`]; the driver holds the generation's watch beside the state.
//! * [`Phase::StandingBy`] — sent away by a partition, the agent stands by; the run is looked
//!   at again at `at`.
//! * [`Phase::Fenced`] — the lease is gone (expired, revoked, given up): no longer a member.
//!   The next join starts over with a new lease.
//! * [`Phase::Abandoned`] — the agent's stream ended without a Leave (server-side): after the
//!   reconnect grace its lease is revoked, unless it came back elsewhere, the run ended, or the
//!   whole run is silent (this server is more likely cut off: the lease is held).
//! * [`Phase::Left`] — the agent left, or its stream ended: the session ends.
//!
//! Beside the phase: the lease (`None`: fenced, released, or not granted yet), the last
//! generation this node ran or was fenced from (the next world must be newer), and a
//! [`Retry`] — a store operation that failed transiently and is tried again at its deadline.
//! While a retry is pending the session reads nothing but the lease keeper and the clock: the
//! agent's requests stay in order behind it.
//!
//! # The inputs
//!
//! An agent's [`Request`], the end of the agent's stream, the round's decision, a watch event
//! of the running generation (classified into [`generation::Input`]) or a broken watch, the
//! keeper's lost lease, the clock ([`Input::Tick`]), and the outcomes of the store work the
//! driver carried out for an [`Effect`] ([`Input::Tried`], [`Input::Executed`],
//! [`Input::Seen`]).

use std::time::Duration;

use tokio::time::Instant;

use super::generation::{self, Rules, Running};
use super::keeper::Lost;
use super::liveness::Knock;
use super::protocol::{Event, Request, RunEnd};
use super::standby::{Look, Seen};
use crate::decisions::root_cause::RootCause;
use crate::round::Restarts;
use crate::store::LeaseId;
use crate::{Join, Plan};

/// How long a store operation that failed transiently waits before it is tried again.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// How many times an agent's request is tried while the store does not answer (~10 s).
pub(crate) const REQUEST_TRIES: u32 = 20;

/// How often a worker failure looks again for a member's loss within the attribution window.
pub(crate) const ATTRIBUTION_POLL: Duration = Duration::from_millis(100);

/// What [`step`](super::step::step) needs besides the state: this node and the rules of its
/// running generations.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Params {
    /// This node.
    pub node: String,
    /// The generation core's rules.
    pub rules: Rules,
    /// The lease is renewed on a timer whatever the agent does (agent-side sessions); `false`:
    /// only while the agent talks (server-side), and a vanished agent's lease is revoked.
    pub renews_itself: bool,
    /// The keep-alive period.
    pub keep_alive: Duration,
}

/// An agent whose stream ended without a Leave, on a server: when to look next whether it is
/// gone, and whether its lease is held because the whole run is silent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Abandoned {
    /// The lease to revoke.
    pub lease: LeaseId,
    /// When to look next (`None`: a knock or a look is under way).
    pub at: Option<Instant>,
    /// Its host said nothing listens on its probe port: its process is gone.
    pub gone: bool,
    /// The lease is held: no agent of the run is heard either.
    pub held: bool,
}

/// Where the session is. Data and deadlines only: the round's future and the generation's
/// watch are the driver's.
// One value per session, moved between states: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) enum Phase {
    /// Neither waiting nor running.
    #[default]
    Idle,
    /// Joined the round with `join` at `since`.
    Waiting {
        /// The join this node waits with.
        join: Join,
        /// When it joined.
        since: Instant,
    },
    /// A member of a running generation.
    Running(Running),
    /// Sent away by a partition, the agent stands by (`standby.rs`).
    StandingBy {
        /// When to look at the run next.
        at: Instant,
        /// What the agent heard last.
        told: Option<Look>,
    },
    /// The lease is gone: this node is no longer a member.
    Fenced {
        /// Why, as the agent was told.
        reason: String,
    },
    /// The agent's stream ended without a Leave: its lease goes after the reconnect grace.
    Abandoned(Abandoned),
    /// The agent left (or its stream ended): the session ends.
    Left,
}

impl Phase {
    /// The generation running, if any.
    pub fn running_generation(&self) -> Option<u64> {
        match self {
            Phase::Running(r) => Some(r.generation()),
            _ => None,
        }
    }

    /// Whether the session waits in a round.
    pub fn is_waiting(&self) -> bool {
        matches!(self, Phase::Waiting { .. })
    }

    /// Whether the session runs a generation.
    pub fn is_running(&self) -> bool {
        matches!(self, Phase::Running(_))
    }

    /// Whether the session is over.
    pub fn is_left(&self) -> bool {
        matches!(self, Phase::Left)
    }

    /// Whether a [`Request::StandBy`] starts standing by here (idle or fenced, not yet).
    pub fn can_stand_by(&self) -> bool {
        matches!(self, Phase::Idle | Phase::Fenced { .. })
    }
}

/// A store operation the driver carries out for the session, tried again when the store did
/// not answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Attempt {
    /// An agent's request (not a keep-alive, a stand-by or a duplicate join: those are the
    /// step's alone).
    Request(Request),
    /// Enter generation `plan.generation` (membership key, watch, what happened before the
    /// watch): `announce` tells the agent the plan (first entry after the round); `before`:
    /// the session's view of it, on a re-watch.
    Enter {
        /// The generation's plan.
        plan: Plan,
        /// The view before a re-watch.
        before: Option<Box<Running>>,
        /// First entry: the agent hears [`Event::Formed`].
        announce: bool,
    },
    /// Join the round again after the store failed while waiting.
    Join(Join),
    /// Look once whether a worker failure coincides with a member's loss ([`crate::decisions::loss`]).
    Attribute(Attribution),
    /// One stage of deciding a worker failure against the job-wide restart budget.
    Budget {
        /// The failure.
        spending: Spending,
        /// Which stage.
        stage: BudgetStage,
    },
}

/// A worker failure decided against the job-wide restart budget, once no member's loss
/// explained it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spending {
    /// Generation of the failure.
    pub generation: u64,
    /// One line: which rank, which exit.
    pub description: String,
    /// The failed worker in detail, when a worker failed.
    pub cause: Option<RootCause>,
}

/// The store work of deciding a failure against the budget: read, then spend or end. The
/// verdict between them is [`crate::session::verdicts::failure_verdict`]'s, in the step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum BudgetStage {
    /// Read the counters, the current generation and whether it is closed.
    Read,
    /// Close the generation and count one restart in one transaction, guarded on the
    /// revisions read (a lost race reads again).
    Spend {
        /// `gen/current`'s revision as read.
        gen_rev: i64,
        /// The counters' revision as read.
        restarts_rev: i64,
        /// The counters after spending.
        next: Restarts,
        /// The close reason.
        closed: String,
    },
    /// End the run as failed: the budget is spent.
    End {
        /// The run's end (its root cause this failure's).
        end: RunEnd,
        /// The counters with this failure in the history.
        last: Restarts,
    },
}

/// What the budget's store work brought back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum BudgetSeen {
    /// What [`BudgetStage::Read`] read.
    Read {
        /// The counters and their revision.
        restarts: (Restarts, i64),
        /// `gen/current` and its revision.
        current: (u64, i64),
        /// `gen/<g>/closed`'s reason, when closed.
        closed: Option<String>,
        /// The wall clock (ms since the epoch), for a run end.
        at_ms: u64,
    },
    /// The spend transaction: whether it won; the counters and reason it wrote.
    Spent {
        /// It won (no other session spent or closed meanwhile).
        won: bool,
        /// The counters after spending.
        next: Restarts,
        /// The close reason.
        closed: String,
    },
    /// The run was ended as failed; its root cause as recorded (another node's when its
    /// failure ended the run first).
    Ended {
        /// The counters with this failure in the history.
        last: Restarts,
        /// The run's root cause.
        cause: Option<RootCause>,
    },
}

/// A worker failure of this node that may be a lost member's doing: looked at again every
/// [`ATTRIBUTION_POLL`] until `until` ([`crate::decisions::loss::ATTRIBUTION_WINDOW`] after it came),
/// then decided against the restart budget.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Attribution {
    /// Generation of the failure.
    pub generation: u64,
    /// One line: which rank, which exit.
    pub description: String,
    /// The failed worker in detail, when a worker failed.
    pub cause: Option<RootCause>,
    /// The end of the attribution window.
    pub until: Instant,
    /// The other members' agents were knocked on already.
    pub knocked: bool,
}

impl Attribution {
    /// The failure to decide against the budget, once no loss explains it.
    pub fn decide(self) -> Spending {
        Spending {
            generation: self.generation,
            description: self.description,
            cause: self.cause,
        }
    }
}

/// What one look for a member's loss saw.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LossLook {
    /// The failure is the workers' own: a single-node group, a re-form already under way (it
    /// is decided there), or every other member's agent answers.
    NotALoss,
    /// A member is gone: the generation was closed as a membership restart; the counters.
    Lost(Restarts),
    /// The other members' agents were knocked on and not all answered: look again at once.
    Knocked,
    /// Nothing yet.
    Unseen,
}

/// A store operation to try again at `at`; `tries` so far.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Retry {
    /// What.
    pub what: Attempt,
    /// Tries so far.
    pub tries: u32,
    /// When to try again.
    pub at: Instant,
}

/// Why a store operation failed, as the step needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The store did not answer (worth another try).
    pub transient: bool,
    /// One line.
    pub message: String,
}

/// What store work did to the session's lease, reported back for the step to apply: the
/// driver grants, revokes and renews, the state says which lease the session holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseChange {
    /// A lease was granted (or a reconnecting agent's taken over) and its keeper started.
    Granted(LeaseId),
    /// The lease was revoked, or found gone, and its keeper stopped: the session holds none.
    Released,
}

impl LeaseChange {
    /// The lease held after this change.
    pub fn held(self) -> Option<LeaseId> {
        match self {
            LeaseChange::Granted(l) => Some(l),
            LeaseChange::Released => None,
        }
    }
}

/// How opening the session went: the first phase (`None`: the run had ended, the agent was
/// told) and the last generation the agent reconnected from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Opened {
    /// The first phase.
    pub phase: Option<Phase>,
    /// The last generation this node ran or was fenced from.
    pub last_gen: u64,
}

/// What one of the generation core's effects read (or wrote) that the core judges next:
/// its input, and the effects of the same step still to carry out after what it decides.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Read {
    /// The generation core's next input.
    pub input: generation::Input,
    /// The effects after the one that read, in order.
    pub rest: Vec<generation::Effect>,
}

/// What the round this node waited in decided.
// One per round: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decided {
    /// The group formed with this node.
    Plan(Plan),
    /// The run had ended (a standby or a late joiner).
    RunFinished,
    /// The store failed while waiting (the whole error, one line).
    StoreError(String),
    /// The round failed for good (join timeout, refused), one line.
    Failed(String),
}

/// The session's state: its phase and what outlives phases.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Session {
    /// Where it is.
    pub phase: Phase,
    /// The lease it holds (`None`: fenced, released, or not granted yet).
    pub lease: Option<LeaseId>,
    /// The last generation this node ran or was fenced from: the next world must be newer.
    pub last_gen: u64,
    /// A store operation to try again.
    pub retry: Option<Retry>,
}

impl Session {
    /// The earliest instant at which a [`Input::Tick`] can change anything.
    pub fn wake_at(&self) -> Option<Instant> {
        if let Some(r) = &self.retry {
            return Some(r.at);
        }
        match &self.phase {
            Phase::Running(run) => run.wake_at(),
            Phase::StandingBy { at, .. } => Some(*at),
            Phase::Abandoned(a) => a.at,
            _ => None,
        }
    }

    /// Whether the driver reads the agent's requests now (not behind a retry, not once the
    /// stream ended).
    pub fn reads_requests(&self) -> bool {
        self.retry.is_none() && !matches!(self.phase, Phase::Left | Phase::Abandoned(_))
    }

    /// Whether the driver reads the round's decision and the generation's watch now.
    pub fn reads_round(&self) -> bool {
        self.retry.is_none()
    }
}

/// What happened to the session.
// One at a time, moved into the step: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(crate) enum Input {
    /// The agent asks.
    Request(Request),
    /// The session opened (a reconnecting agent's state taken over, or a fresh start).
    Opened(Opened),
    /// Store work changed the lease (granted, revoked, found gone); comes before the outcome
    /// of the work that changed it.
    Leased(LeaseChange),
    /// The agent's stream ended without a Leave.
    RequestsClosed,
    /// The round this node waited in decided.
    Decided(Decided),
    /// A line of the round this node waits in: who joined, who is awaited, when the last call
    /// ends (the round writes it as it waits; the agent prints it).
    Progress(String),
    /// The running generation's watch saw this.
    Watch(generation::Input),
    /// A watch of the running generation broke.
    WatchBroke,
    /// The keeper lost a lease (maybe an old one).
    LeaseLost(Lost),
    /// Time passed: deadlines at or before `now` are due.
    Tick,
    /// The driver tried `what` (`tries` before this one); `Some(phase)` replaces the phase.
    Tried {
        /// What was tried.
        what: Attempt,
        /// Tries before this one.
        tries: u32,
        /// How it went.
        result: Result<Option<Phase>, Failure>,
    },
    /// The driver carried out the generation core's effects on `run`; `Some(phase)`: the node
    /// was fenced meanwhile (given up).
    Executed {
        /// The generation's view, as the effects left it.
        run: Box<Running>,
        /// The generation is over for this session.
        ends: bool,
        /// How it went.
        result: Result<Option<Phase>, Failure>,
        /// A read for the generation core to judge before the rest of the effects go on.
        read: Option<Read>,
    },
    /// What a standing-by node's session read of the run (an error: the store did not answer).
    Seen(Result<Seen, Failure>),
    /// One stage of deciding a failure against the budget came back (`tries` before it that
    /// failed).
    Budgeted {
        /// The failure.
        spending: Spending,
        /// Tries before this one that the store did not answer.
        tries: u32,
        /// What it brought back.
        result: Result<BudgetSeen, Failure>,
    },
    /// The knock on an abandoned agent's probe port.
    Knocked(Knock),
    /// Whether this session still speaks for its node's lease (no other session resumed it and the
    /// run goes on), and how long no agent of the run was heard on this server (`None`: not
    /// known) — an abandoned agent's look.
    Speaks(Result<(bool, Option<Duration>), Failure>),
    /// One look for a member's loss behind a worker failure (`tries` before it that failed).
    Looked {
        /// The failure looked at.
        attribution: Attribution,
        /// Tries before this one that the store did not answer.
        tries: u32,
        /// What it saw.
        result: Result<LossLook, Failure>,
    },
}

/// What the driver must do.
// Short-lived, a few per step: the size of `Emit` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Tell the agent.
    Emit(Event),
    /// Try `what` once (the outcome comes back as [`Input::Tried`]).
    Try {
        /// What.
        what: Attempt,
        /// Tries before this one.
        tries: u32,
    },
    /// Carry out the generation core's effects on the running generation (the outcome comes
    /// back as [`Input::Executed`]).
    Generation {
        /// In order.
        effects: Vec<generation::Effect>,
        /// The generation is over for this session.
        ends: bool,
    },
    /// Stop renewing the lease.
    StopKeeper,
    /// Revoke `lease` (a failed round's node is no candidate any more); an error is only
    /// logged, the lease then expires.
    Release(LeaseId),
    /// Read the run's end and tell the agent (or that the run finished, without one).
    ReportFinished,
    /// Read the run for a standing-by node (the outcome comes back as [`Input::Seen`]).
    Look,
    /// Knock on the abandoned agent's probe port (the outcome comes back as
    /// [`Input::Knocked`]).
    Knock,
    /// Look whether this session still speaks for the node's `lease` (no session resumed it
    /// since) and how long the run was silent (the outcome comes back as [`Input::Speaks`]).
    CheckSpeaks {
        /// The abandoned agent's lease.
        lease: LeaseId,
    },
    /// Record that the agent is gone (`lost/<node>`) and revoke `lease`: the others re-form.
    RevokeAbandoned {
        /// The lease.
        lease: LeaseId,
        /// Why, for the operator.
        why: String,
    },
    /// A line for the operator.
    Warn(String),
    /// Generation `generation` was closed for a re-form with `reason` (the re-form metric).
    Reformed {
        /// The generation.
        generation: u64,
        /// The close reason.
        reason: String,
    },
    /// A line for the operator about generation `generation` (what the generation core
    /// judged of a read).
    Note {
        /// The generation.
        generation: u64,
        /// The line.
        line: String,
    },
}
