//! The records a run keeps in the store, each with its one encoding: every type stored under
//! `/drun/v1/<run>/` is defined here (or, for a leaf module that defines nothing else the store
//! layer needs, re-exported from it), so the store's door ([`crate::store::run_state`]) and the
//! decisions both import records from here and imports only point down.
//!
//! A value that does not decode is [`StoreError::Corrupt`], never a silent default.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::StoreError;

mod ckpt;
mod join;
mod members;
mod run;

pub use crate::decisions::ckpt_interval::Interval;
pub use crate::decisions::root_cause::RootCause;
pub use crate::store::reports::ReportKind;
pub use ckpt::{
    describe_id, manifest_id, parse_id, Cursor, DigestKind, Manifest, NodeCommit, ShardFile,
};
pub use join::{
    Candidate, Door, EnvCheck, Fingerprint, HeldStep, Join, MemoryResume, Plan, FULL_PLAN_NODES,
};
pub use members::{Member, Members};
pub use run::{
    FailureRecord, Formation, LostWork, RestartCause, Restarts, RoundFailure, RunEnd, SaveRequest,
};

/// Encodes a generation number for `gen/current`.
pub fn encode_generation(g: u64) -> Vec<u8> {
    g.to_string().into_bytes()
}

/// Decodes `gen/current` (stored at `key`).
pub fn decode_generation(key: &str, value: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(value)
        .map_err(|e| e.to_string())
        .and_then(|s| s.parse::<u64>().map_err(|e| e.to_string()))
        .map_err(|reason| StoreError::Corrupt {
            key: key.to_string(),
            reason,
        })
}

/// Encodes a JSON record (plans, restart counters, the run's end, …).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("run records serialize")
}

/// Decodes a JSON record stored at `key`.
pub fn decode<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}
