//! The leases' open keep-alive streams on etcd, kept from one renewal to the next
//! ([`super::renew`] renews through them).
//!
//! Opening a keep-alive stream already sends the lease's first keep-alive; after that each
//! renewal is one message each way on the open stream. A stream that fails or times out is
//! dropped, and the next renewal opens a new one on whichever member answers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use etcd_client as etcd;

use crate::store::LeaseId;

/// A lease's open keep-alive stream: its sender and its answers.
pub(super) type KeepAlive = (etcd::LeaseKeeper, etcd::LeaseKeepAliveStream);

/// The open keep-alive streams by lease, with when each was last used. A lease nobody renews
/// any more (its session ended without revoking it) has its stream closed within
/// [`KEEP_ALIVE_IDLE`].
#[derive(Default)]
pub(super) struct KeepAlives {
    open: HashMap<LeaseId, (KeepAlive, Instant)>,
    swept: Option<Instant>,
    /// The TTL (seconds) of each lease this process granted.
    ttls: HashMap<LeaseId, i64>,
}

/// A keep-alive stream unused this long is closed (renewals come every TTL/3).
const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(120);

impl KeepAlives {
    /// Notes the TTL of a lease just granted.
    pub(super) fn granted(&mut self, lease: LeaseId, ttl_secs: i64) {
        self.ttls.insert(lease, ttl_secs);
    }

    pub(super) fn ttl(&self, lease: LeaseId) -> Option<i64> {
        self.ttls.get(&lease).copied()
    }

    /// Forgets a revoked lease: its stream closes.
    pub(super) fn forget(&mut self, lease: LeaseId) {
        self.open.remove(&lease);
        self.ttls.remove(&lease);
    }

    pub(super) fn take(&mut self, lease: LeaseId) -> Option<KeepAlive> {
        self.open.remove(&lease).map(|(pair, _)| pair)
    }

    pub(super) fn put(&mut self, lease: LeaseId, pair: KeepAlive) {
        let now = Instant::now();
        self.open.insert(lease, (pair, now));
        if self.swept.is_none_or(|t| now - t >= KEEP_ALIVE_IDLE / 4) {
            self.open
                .retain(|_, (_, used)| now - *used < KEEP_ALIVE_IDLE);
            let open = &self.open;
            self.ttls.retain(|lease, _| open.contains_key(lease));
            self.swept = Some(now);
        }
    }
}
