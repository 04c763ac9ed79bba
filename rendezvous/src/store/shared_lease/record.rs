//! The registry record of an agent lease (`/drun/leases/<id>`: its TTL and the keys attached to
//! it), written beside every write under the lease so that another replica can adopt it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::LeaseId;

/// Prefix of the agent leases' registry records.
pub const REGISTRY_PREFIX: &str = "/drun/leases/";

/// The registry key of agent lease `lease`.
pub fn registry_key(lease: LeaseId) -> String {
    format!("{REGISTRY_PREFIX}{lease:016x}")
}

/// The registry record of one agent lease.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Record {
    /// The lease's TTL, milliseconds.
    pub(super) ttl_ms: u64,
    /// Keys that may be attached to it.
    pub(super) keys: Vec<String>,
}

/// The encoded registry record of a lease living `ttl` with `keys`.
pub(super) fn record(ttl: Duration, keys: &[String]) -> Vec<u8> {
    serde_json::to_vec(&Record {
        ttl_ms: ttl.as_millis() as u64,
        keys: keys.to_vec(),
    })
    .expect("a record serializes")
}
