//! drun's rendezvous: who is in the group, with which ranks, in which generation.
//!
//! # The folders
//!
//! One concern per folder, from what serves down to what touches the store; imports point down
//! this list but for the few that `docs/architecture.md` §7 (*Layers*) names. This is the
//! crate's module map (§7 places it in the repository); `.ci/cycles` checks that no two files
//! import one another but for its short allow-list.
//!
//! * [`server`] — **what serves**: the `drun-rendezvous` program as a library ([`server::run`],
//!   [`server::serve`], [`server::ServerError`] and its exit code; the binary only parses and
//!   installs logging), the gRPC service ([`server::service`], one session per agent stream),
//!   the `drun.v1` conversions ([`server::wire`]), what a server accepts from an agent
//!   ([`server::validate`]), tokens ([`server::auth`] and its token files), TLS
//!   ([`server::tls`], its PEM checks in [`server::pem_check`]), the Prometheus families and the
//!   `GET /metrics` server both binaries use ([`server::metrics`]), and how many runs it serves
//!   at once ([`server::run_limit`]).
//! * [`status`] — a run's state as `status` shows it: the document ([`status::read_status`],
//!   the `Status` RPC's answer), its 80-column view ([`status::view`]), and the status client
//!   that asks a server or reads etcd for `drun-rendezvous status` and `drun --status` alike
//!   ([`status::client`]); the server imports nothing of the launcher for it.
//! * [`client`] — what every client of a server shares: names resolved afresh ([`client::dns`]),
//!   what listens on an endpoint that fails the gRPC handshake ([`client::foreign`]), the token a
//!   client sends ([`client::token`]).
//! * [`session`] — **what drives** one node's side of a run: an actor per agent stream (its
//!   states below).
//! * [`round`] — what drives one run's rendezvous through the store: read a snapshot, judge it
//!   purely (`round/judge.rs`), write once.
//! * [`ledger`] — checkpoints: the ledger (commit, seal, retention, the resume point; its rules
//!   pure in [`ledger::seal`], [`ledger::retention`], [`ledger::resume`]) and the job-wide
//!   failure history the checkpoint interval reads ([`ledger::failure_log`]).
//! * [`decisions`] — **what decides**, pure functions of a snapshot, the time and the
//!   configuration, with a reason: [`decisions::core`] (when a waiting set forms),
//!   [`decisions::plan`] (ranks), [`decisions::envcheck`] (do the environments agree; the door a
//!   newcomer is judged against), [`decisions::loss`] (naming a lost node),
//!   [`decisions::root_cause`] (a run's first failure), [`decisions::partition`] (which side of
//!   a partition leaves), [`decisions::ckpt_interval`] (the automatic checkpoint interval),
//!   [`decisions::formation`] (the work a re-form threw away), [`decisions::names`] (node lists
//!   in the lines every agent receives, bounded).
//! * [`store`] — **what touches the store**: the [`Store`] trait (an etcd-shaped key-value API:
//!   revisions, leases, transactions, watches), [`MemoryStore`] (embedded, for one machine),
//!   [`EtcdStore`] with its sharing and batching ([`store::etcd`]), a server's agent leases on a
//!   few shared etcd leases ([`store::shared_lease`]), the key layout ([`store::keys`]), the
//!   records a run keeps with their one encoding ([`store::records`], [`store::reports`]), and
//!   **the door** ([`store::run_state`]): the only library code that reads and writes a run's
//!   keys, with a named transaction for each decision's write (`tests/source_layout.rs` keeps
//!   it so).
//! * Leaves every folder may use, importing none of them: [`error`] (the crate's error types),
//!   [`clock`] (the one wall clock), [`human`] (durations for people), [`log_format`]
//!   (`--log-format`, both binaries), [`probe`] (the peer probe datagram of the session and the
//!   launcher's peers).
//!
//! # Theory of operation
//!
//! * [`store`] is the state. Every decision is re-checked inside a transaction, never taken from
//!   a read.
//! * [`decisions::core`] is the decision: a pure function of the waiting candidates, the time
//!   and the configuration that says "form now", "wait" or "fail", with a human-readable reason.
//!   It sleeps on nothing and is tested with synthetic instants.
//! * [`decisions::plan`] turns an admitted set of nodes into the assignment every agent
//!   receives: node ranks (pinned ranks are an order, so losing any node still forms),
//!   contiguous global ranks per node, world size, master address and port.
//! * [`round`] drives one run through the store: join, decide, write the plan of generation `g`
//!   under a compare on `gen/current`, re-form into `g + 1`; or publish a failed round's verdict
//!   to every node waiting in it.
//!
//! * [`session`] is one node's side of a run: an actor that holds the node's lease, joins rounds
//!   on its behalf and turns store changes into events for the agent. Its decisions while a
//!   generation runs live in the pure generation core (`session/generation.rs`).
//!
//! Keys live under `/drun/v1/<run>/` (`docs/architecture.md` §3); the rules are in §2.
//!
//! ## The session's states
//!
//! Every transition is one pure `session::step` over the session's state (`session/state.rs`:
//! the phase, the lease, the last generation, a pending retry); the actor only turns I/O into
//! inputs and carries out the effects.
//!
//! ```text
//!              open (fresh lease, or a reconnect's resume)
//!                         │
//!                         ▼
//!   ┌─────────────────▶ Idle        Fenced { reason } ◀── lease lost (keeper, a join's txn),
//!   │                     │ Join       │ Join (new lease)   given up, sent away by a split
//!   │                     ▼ ◀──────────┘
//!   │         Waiting { join, since } ── round failed / run finished ──▶ Idle (Error / Finished)
//!   │                     │ plan of g formed: members/<g>/<node>, watch gen/<g>/…
//!   │                     ▼
//!   │   Running(Running { plan, successor_deadline, scale_up, arrivals, save_clock, silence })
//!   │     │  watch event or deadline ──▶ generation::step ──▶ effects (close g, ask a save…)
//!   │     │  Failed  ──▶ failure_verdict: spend one restart and close g │ end the run
//!   │     │  Succeeded ──▶ exit_barrier: the last node writes `finished`
//!   └─────┤  gen/<g>/closed ──▶ Reform          finished ──▶ Finished
//!         └─ Leave ──▶ Left (lease revoked; the session ends)
//!
//!   Idle | Fenced ── StandBy ──▶ StandingBy { at, told } ── the run ended ──▶ Idle (Finished)
//!   the agent's stream ends (server) ──▶ Abandoned { lease, at, gone, held } ──▶ Left
//!   a store that does not answer ──▶ Retry { what, tries, at } beside the phase
//! ```
//!
//! Where the decisions live: forming a round — [`decisions::core::decide`] (including "no
//! second world beside a running generation"); ranks — [`decisions::plan::assign`]; a running
//! generation's re-form, scale-up admission, successor start, failure budget and exit barrier —
//! the session's generation core; node loss wording — [`decisions::loss`]; checkpoints —
//! [`ledger`].

pub mod client;
pub mod clock;
pub mod decisions;
pub mod error;
pub mod human;
pub mod ledger;
pub mod log_format;
pub mod probe;
pub mod round;
pub mod server;
pub mod session;
pub mod status;
pub mod store;

#[cfg(any(test, fuzzing))]
pub mod checks;
#[cfg(test)]
mod props;

pub use decisions::core::{decide, Candidate, Decision, Join, RoundConfig};
pub use decisions::plan::{assign, Member, Plan};
pub use error::{endpoint_url, RendezvousError, ServiceError, StoreError};
pub use ledger::{
    merge_files, CommitOutcome, Cursor, FileConflict, Ledger, LedgerError, Manifest, NodeCommit,
    Retention, ShardFile,
};
pub use log_format::LogFormat;
pub use round::Round;
pub use session::{spawn_session, CommitRefused, Event, Request, Resume, RunEnd, SessionConfig};
pub use store::etcd::EtcdStore;
pub use store::memory::MemoryStore;
pub use store::records::{DigestKind, HeldStep, MemoryResume};
pub use store::{Compare, KeyValue, LeaseId, Op, Store, Txn, TxnResponse, WatchEvent};
