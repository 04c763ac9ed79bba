//! drun's rendezvous: who is in the group, with which ranks, in which generation.
//!
//! # Theory of operation
//!
//! * [`store`] is the state: an etcd-shaped key-value API (revisions, leases, transactions,
//!   watches). [`MemoryStore`] is the embedded default for one machine; the etcd store joins it for
//!   multi-node runs. Every decision is re-checked inside a transaction, never taken from a read.
//! * [`decisions::core`] is the decision: a pure function of the waiting candidates, the time and the
//!   configuration that says "form now", "wait" or "fail", with a human-readable reason. It sleeps
//!   on nothing and is tested with synthetic instants.
//! * [`decisions::plan`] turns an admitted set of nodes into the assignment every agent receives: node
//!   ranks (pinned ranks are an order, so losing any node still forms), contiguous global ranks
//!   per node, world size, master address and port.
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
//! ```text
//!              open (fresh lease, or a reconnect's resume)
//!                         │
//!                         ▼
//!   ┌─────────────────▶ Idle ◀──────────── Fenced (lease lost: keeper, or a join's txn)
//!   │                     │ Join(candidate, after)
//!   │                     ▼
//!   │                 Waiting ── round failed / run finished ──▶ Idle (Error / Finished)
//!   │                     │ plan of g formed: members/<g>/<node>, watch gen/<g>/…
//!   │                     ▼
//!   │   Running { plan, successor_deadline, scale_up: Option<PendingScaleUp> }
//!   │     │  watch event or deadline ──▶ generation::step ──▶ effects (close g, ask a save…)
//!   │     │  Failed  ──▶ failure_verdict: spend one restart and close g │ end the run
//!   │     │  Succeeded ──▶ exit_barrier: the last node writes `finished`
//!   └─────┤  gen/<g>/closed ──▶ Reform          finished ──▶ Finished
//!         └─ Leave ──▶ Left (lease revoked; the session ends)
//! ```
//!
//! Where the decisions live: forming a round — [`decisions::core::decide`] (including "no second world
//! beside a running generation"); ranks — [`decisions::plan::assign`]; a running generation's re-form,
//! scale-up admission, successor start, failure budget and exit barrier — the session's
//! generation core; node loss wording — [`decisions::loss`]; checkpoints — [`ledger`].

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
    merge_files, CommitOutcome, Cursor, Ledger, LedgerError, Manifest, NodeCommit, Retention,
    ShardFile,
};
pub use log_format::LogFormat;
pub use round::Round;
pub use session::{spawn_session, Event, Request, Resume, RunEnd, SessionConfig};
pub use store::etcd::EtcdStore;
pub use store::memory::MemoryStore;
pub use store::{Compare, KeyValue, LeaseId, Op, Store, Txn, TxnResponse, WatchEvent};
