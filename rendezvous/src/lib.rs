//! drun's rendezvous: who is in the group, with which ranks, in which generation.
//!
//! # Theory of operation
//!
//! * [`store`] is the state: an etcd-shaped key-value API (revisions, leases, transactions,
//!   watches). [`MemoryStore`] is the embedded default for one machine; the etcd store joins it for
//!   multi-node runs. Every decision is re-checked inside a transaction, never taken from a read.
//! * [`core`] is the decision: a pure function of the waiting candidates, the time and the
//!   configuration that says "form now", "wait" or "fail", with a human-readable reason. It sleeps
//!   on nothing and is tested with synthetic instants.
//! * [`plan`] turns an admitted set of nodes into the assignment every agent receives: node
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
//! Where the decisions live: forming a round — [`core::decide`] (including "no second world
//! beside a running generation"); ranks — [`plan::assign`]; a running generation's re-form,
//! scale-up admission, successor start, failure budget and exit barrier — the session's
//! generation core; node loss wording — [`loss`]; checkpoints — [`ledger`].

pub mod auth;
pub mod ckpt_interval;
pub mod client_token;
pub mod clock;
pub mod core;
pub mod dns;
pub mod envcheck;
pub mod error;
pub mod etcd;
pub mod etcd_batch;
pub mod etcd_share;
pub mod failure_log;
pub mod foreign;
pub mod formation;
pub mod human;
pub mod keys;
pub mod ledger;
pub mod log_format;
pub mod loss;
pub mod memory;
pub mod metrics;
pub mod partition;
pub mod pem_check;
pub mod plan;
pub mod probe;
pub mod records;
pub mod reports;
pub mod root_cause;
pub mod round;
pub mod run_limit;
pub mod run_state;
pub mod server;
pub mod service;
pub mod session;
pub mod shared_lease;
pub mod status;
pub mod status_client;
pub mod status_view;
pub mod store;
pub mod tls;
pub mod token_files;
pub mod validate;
pub mod wire;

#[cfg(any(test, fuzzing))]
pub mod checks;
#[cfg(test)]
mod props;

pub use crate::core::{decide, Candidate, Decision, Join, RoundConfig};
pub use error::{endpoint_url, RendezvousError, ServiceError, StoreError};
pub use etcd::EtcdStore;
pub use ledger::{
    merge_files, CommitOutcome, Cursor, Ledger, LedgerError, Manifest, NodeCommit, Retention,
    ShardFile,
};
pub use log_format::LogFormat;
pub use memory::MemoryStore;
pub use plan::{assign, Member, Plan};
pub use round::Round;
pub use session::{spawn_session, Event, Request, Resume, RunEnd, SessionConfig};
pub use store::{Compare, KeyValue, LeaseId, Op, Store, Txn, TxnResponse, WatchEvent};
