//! The background side of shared leases: the expiry sweep that deletes ended agent leases'
//! keys ([`super::delete`]) and the carriers' renewal, each a task started by the wrapper that
//! ends when the wrapper is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::delete::delete_ended;
use super::SharedLeases;
use crate::store::LeaseId;
use crate::StoreError;

/// How often the sweep looks for expired agent leases.
const TICK: Duration = Duration::from_millis(100);
/// A sweep this late means the process did not run (stopped, starved): deadlines move by the
/// gap instead of expiring leases nobody could renew (see [`super::table::LeaseTable::shift`]).
const STALL: Duration = Duration::from_secs(2);

impl SharedLeases {
    /// Starts the expiry sweep.
    pub(super) fn start_sweep(self: &Arc<Self>) {
        tokio::spawn(sweep(Arc::downgrade(self)));
    }

    /// Starts renewing carrier `c` of `ttl`.
    pub(super) fn start_keeping(self: &Arc<Self>, c: LeaseId, ttl: Duration) {
        tokio::spawn(keep_carrier(Arc::downgrade(self), c, ttl));
    }
}

/// Deletes the keys of expired agent leases until the wrapper is dropped.
async fn sweep(this: Weak<SharedLeases>) {
    let mut last = Instant::now();
    loop {
        tokio::time::sleep(TICK).await;
        let Some(this) = this.upgrade() else { return };
        let now = Instant::now();
        let late = now.saturating_duration_since(last);
        last = now;
        let ended = {
            let mut t = this.table();
            if late >= STALL {
                t.shift(late - TICK);
            }
            t.take_expired(now)
        };
        if ended.is_empty() {
            continue;
        }
        tracing::info!(
            leases = ended.len(),
            "agent leases expired: deleting their keys"
        );
        let inner = this.inner.clone();
        tokio::spawn(async move { delete_ended(&inner, ended).await });
    }
}

/// After a failed renewal, the next try comes this soon (or at the quarter TTL, if sooner): an
/// etcd leader election leaves a carrier only what is left of its TTL, and a quarter TTL of it
/// slept after each failure (1 s of a 4 s TTL) had lost carriers that a new leader would have
/// renewed.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(250);

/// The shortest time one renewal may take before it is given up and tried again (a quarter
/// TTL otherwise): a store's keep-alive round trip under load.
const ATTEMPT_AT_LEAST: Duration = Duration::from_millis(500);

/// Renews carrier `c` every quarter of its TTL until it is lost (or unrenewable for a TTL) or
/// the wrapper is dropped.
async fn keep_carrier(this: Weak<SharedLeases>, c: LeaseId, ttl: Duration) {
    let every = ttl / 4;
    let mut last_ok = Instant::now();
    let mut wait = every;
    loop {
        tokio::time::sleep(wait).await;
        wait = every.min(RETRY_AFTER_FAILURE);
        let Some(this) = this.upgrade() else { return };
        // Each try is bounded by a quarter TTL, not by all that is left of it: a try that went
        // to a member that died, or waits on a member with no leader, must not take the
        // carrier's last chance with it (seen in CI: the etcd leader SIGKILLed, one try hung
        // for the rest of a 4 s TTL, and the carrier was lost while a new leader was elected).
        let left = ttl
            .saturating_sub(last_ok.elapsed())
            .min(every.max(ATTEMPT_AT_LEAST))
            .max(Duration::from_millis(100));
        let renewed = tokio::time::timeout(left, this.inner.lease_keep_alive(c)).await;
        if !matches!(renewed, Ok(Ok(_))) {
            crate::server::metrics::global().keepalive_failures.inc();
        }
        match renewed {
            Ok(Ok(_)) => {
                last_ok = Instant::now();
                wait = every;
            }
            Ok(Err(StoreError::LeaseLost(_))) => {
                this.carrier_lost(c, "it expired in the store").await;
                return;
            }
            Ok(Err(_)) | Err(_) if last_ok.elapsed() >= ttl => {
                this.carrier_lost(c, "no renewal for a whole TTL").await;
                let _ = this.inner.lease_revoke(c).await;
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(carrier = format!("{c:#x}"), error = %e, "shared lease renewal failed; retrying")
            }
            Err(_) => tracing::warn!(
                carrier = format!("{c:#x}"),
                "shared lease renewal timed out; retrying"
            ),
        }
    }
}
