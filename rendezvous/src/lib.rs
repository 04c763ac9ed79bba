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
//! Keys live under `/drun/v1/<run>/` (see `design.md` §3 in the shared docs).

pub mod core;
pub mod error;
pub mod etcd;
pub mod human;
pub mod keys;
pub mod ledger;
pub mod loss;
pub mod memory;
pub mod plan;
pub mod round;
pub mod service;
pub mod session;
pub mod store;
pub mod wire;

pub use crate::core::{decide, Candidate, Decision, RoundConfig};
pub use error::{RendezvousError, StoreError};
pub use etcd::EtcdStore;
pub use ledger::{
    CommitOutcome, Cursor, Ledger, LedgerError, Manifest, NodeCommit, Retention, ShardFile,
};
pub use memory::MemoryStore;
pub use plan::{assign, Member, Plan};
pub use round::Round;
pub use session::{spawn_session, Event, Request, Resume, RunEnd, SessionConfig};
pub use store::{Compare, KeyValue, LeaseId, Op, Store, Txn, TxnResponse, WatchEvent};
