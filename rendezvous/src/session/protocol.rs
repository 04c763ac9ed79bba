//! The session's protocol: the requests an agent sends, the events it receives, and the records a session writes.

use std::time::Duration;

use crate::decisions::root_cause::RootCause;
use crate::ledger::{CommitOutcome, NodeCommit, Retention};
use crate::round::Restarts;
use crate::store::LeaseId;
use crate::{Join, Plan, RoundConfig};

pub use crate::store::records::{RunEnd, SaveRequest};

/// Settings of one node's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Run id.
    pub run_id: String,
    /// This node's identity.
    pub node_id: String,
    /// Completion rules of each round.
    pub round: RoundConfig,
    /// Lease time-to-live (etcd rounds it up to whole seconds); default 10 s.
    pub lease_ttl: Duration,
    /// Keep-alive period; default TTL/3.
    pub keep_alive_interval: Duration,
    /// Job-wide worker-failure restart budget (`--max-restarts`).
    pub max_restarts: u32,
    /// Renew the lease on a timer (agent-side). `false`: only on [`Request::KeepAlive`].
    pub auto_keep_alive: bool,
    /// `--on-scale-up checkpoint`: before a newcomer below MAX re-forms the group, ask every
    /// rank for a coordinated checkpoint and wait this long at most for its seal (lost work
    /// stays under one step; `docs/architecture.md` §4). `None`: re-form at once (torchrun's behaviour).
    pub scale_up_save: Option<Duration>,
    /// `--ckpt-interval`, `--expected-mtbf`: node rank 0's session asks every rank for a
    /// checkpoint when the interval since the last seal has passed ([`crate::decisions::ckpt_interval`]).
    pub ckpt_interval: crate::decisions::ckpt_interval::IntervalConfig,
}

/// State carried over when an agent reconnects to another server replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The lease the agent holds.
    pub lease: LeaseId,
    /// Generation the agent runs workers of (0: none).
    pub generation: u64,
    /// The join the agent is waiting with, if it is waiting.
    pub waiting: Option<Join>,
}

/// From the agent to its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Ask to be admitted to the generation after the given one (the last this agent ran
    /// workers of, 0 for none). Duplicates are ignored: while already waiting, or when the
    /// session already runs a newer generation than the agent has seen.
    Join(Join, u64),
    /// Renew the lease (server-side sessions).
    KeepAlive,
    /// Every local worker of generation `g` exited 0.
    Succeeded(u64),
    /// A local worker of generation `generation` failed.
    Failed {
        /// Generation.
        generation: u64,
        /// One line: which rank, which exit.
        description: String,
        /// The failed worker in detail, when a worker failed (not for a partial success).
        cause: Option<RootCause>,
    },
    /// Leave the run: revoke the lease (survivors re-form).
    Leave,
    /// This node stands by after generation `g`, sent away by a partition: tell it whom it must
    /// reach before it joins again, or that the run ended ([`Event::StandBy`], `standby.rs`).
    StandBy(u64),
    /// Ask every rank of generation `generation` for a coordinated checkpoint (once per
    /// generation; every member gets [`Event::SaveRequested`]).
    Preempt {
        /// Generation.
        generation: u64,
        /// Why, one line.
        reason: String,
    },
    /// Record this node's checkpoint report of a step; answered by [`Event::Committed`].
    Commit {
        /// The node's batched report.
        commit: NodeCommit,
        /// Retention policy applied when this commit seals the step.
        retention: Retention,
    },
    /// Record what this node learned for `status` (see [`crate::store::reports`]); not answered.
    Report {
        /// What it is about.
        kind: crate::store::reports::ReportKind,
        /// The report, JSON (at most [`crate::store::reports::MAX_REPORT`] bytes).
        json: String,
    },
    /// This node cannot take part and the run's size is fixed (its GPUs failed their health
    /// check): end the run for every agent ([`RunEnd::unfit`](crate::session::RunEnd)), with
    /// `reason` (one line naming the node, the GPUs and the fix) as the run's end.
    Unfit {
        /// One line.
        reason: String,
    },
    /// The resume point of generation `generation` failed verification on this node: mark
    /// manifest `id` bad and re-form (onto the previous manifest).
    MarkBad {
        /// Generation whose plan carried the manifest.
        generation: u64,
        /// Manifest id.
        id: String,
        /// One line: which file, what differed.
        reason: String,
    },
}

/// Where a session's events go, as it emits them: a channel to the agent's driver
/// ([`super::spawn_session`]), or a server's stream, which turns each into its wire message at
/// once ([`super::spawn_server_session`]).
pub type Emit = std::sync::Arc<dyn Fn(Event) + Send + Sync>;

/// From the session to the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The session holds `lease`.
    Opened {
        /// Lease id.
        lease: LeaseId,
    },
    /// Rendezvous progress (e.g. "waiting for 1 more node (1/2)").
    Waiting(String),
    /// The group formed and this node is a member.
    Formed(Plan),
    /// The running generation ended; stop workers and join again.
    Reform {
        /// The generation that ended.
        generation: u64,
        /// Why.
        reason: String,
    },
    /// The run ended (or had already ended when the session opened).
    Finished(RunEnd),
    /// Answer to [`Request::Failed`]: restart (budget left) or not.
    FailureDecision {
        /// Whether the group restarts.
        restart: bool,
        /// Counters after the decision.
        restarts: Restarts,
        /// When the run ends: its root cause as recorded, which may be another node's failure
        /// that ended it first.
        cause: Option<RootCause>,
    },
    /// The lease is gone: this node is no longer a member.
    Fenced(String),
    /// The rendezvous failed for good (e.g. join timeout); one line.
    Error(String),
    /// A coordinated checkpoint was requested for the running generation.
    SaveRequested(SaveRequest),
    /// A checkpoint was sealed (`ckpt/latest` moved to this manifest id).
    Sealed(String),
    /// Answer to [`Request::Commit`].
    Committed {
        /// Generation of the commit.
        generation: u64,
        /// Step of the commit.
        step: u64,
        /// What it achieved, or why it was refused.
        result: Result<CommitOutcome, CommitRefused>,
    },
    /// The answer to a pace [`Request::Report`]: every rank's median seconds per step in the
    /// reporting node's generation, job-wide.
    Pace(std::collections::BTreeMap<u32, f64>),
    /// Answer at once (with a [`Request::KeepAlive`]): a peer says this node does not answer its
    /// probes, and the node is given up if its agent stays silent too (`session::silence`).
    Ping,
    /// To a node standing by ([`Request::StandBy`]): join once every one of these nodes answers
    /// its probes; none: join now. Said again when it changes.
    StandBy(Vec<super::standby::Reach>),
}

/// Why a checkpoint commit was refused, as the agent hears it in [`Event::Committed`]. Its
/// line crosses the wire as it is; an answer read back from the wire keeps only the line
/// ([`CommitRefused::Said`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitRefused {
    /// The commit's generation does not run on the committing node's session.
    #[error("stale commit: generation {generation} is not running on node {node}")]
    NotRunning {
        /// The commit's generation.
        generation: u64,
        /// The committing node.
        node: String,
    },
    /// The ledger refused it: its [`crate::LedgerError`]'s line.
    #[error("{0}")]
    Ledger(String),
    /// The rendezvous backend keeps no checkpoint ledger (`static`).
    #[error(
        "the static rendezvous backend has no checkpoint ledger; use the embedded, drun, c10d or etcd backend"
    )]
    NoLedger,
    /// The agent could not persist the step it staged in memory (`--ckpt-memory`): the
    /// commit never reached the ledger; why.
    #[error("{0}")]
    NotPersisted(String),
    /// The refusal as it came over the wire.
    #[error("{0}")]
    Said(String),
    /// An answer that came over the wire but did not decode.
    #[error("undecodable commit answer: {0}")]
    Undecodable(String),
}
