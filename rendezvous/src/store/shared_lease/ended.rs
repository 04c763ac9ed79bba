//! The background side of shared leases: the expiry sweep that deletes ended agent leases'
//! keys, the carriers' renewal, and guarded deletes.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::table::Ended;
use super::SharedLeases;
use crate::store::{Compare, LeaseId, Op, Store, Txn};
use crate::StoreError;

/// How often the sweep looks for expired agent leases.
const TICK: Duration = Duration::from_millis(100);
/// A sweep this late means the process did not run (stopped, starved): deadlines move by the
/// gap instead of expiring leases nobody could renew (see [`super::table::LeaseTable::shift`]).
const STALL: Duration = Duration::from_secs(2);
/// Most operations in one delete transaction (etcd's default `--max-txn-ops` is 128).
const MAX_OPS: usize = 120;

/// Deletes the keys of expired agent leases until the wrapper is dropped.
pub(super) async fn sweep(this: Weak<SharedLeases>) {
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

/// Deletes the keys of `ended` leases, each guarded by its revision: all in few transactions
/// when nothing changed under them, else lease by lease and key by key.
pub(super) async fn delete_ended(inner: &Arc<dyn Store>, ended: Vec<Ended>) {
    let mut chunk: Vec<(String, i64)> = Vec::new();
    let mut leases: Vec<Ended> = Vec::new();
    for e in ended {
        if !chunk.is_empty() && chunk.len() + e.keys.len() > MAX_OPS {
            flush(inner, &mut chunk, &mut leases).await;
        }
        chunk.extend(e.keys.iter().cloned());
        leases.push(e);
    }
    flush(inner, &mut chunk, &mut leases).await;
}

async fn flush(inner: &Arc<dyn Store>, chunk: &mut Vec<(String, i64)>, leases: &mut Vec<Ended>) {
    let keys = std::mem::take(chunk);
    let leases = std::mem::take(leases);
    if keys.is_empty() {
        return;
    }
    if matches!(inner.txn(guarded(&keys)).await, Ok(r) if r.succeeded) {
        return;
    }
    for e in leases {
        delete_guarded(inner, e.keys).await;
    }
}

/// Deletes `keys` whose revision is unchanged: one transaction, else key by key.
pub(super) async fn delete_guarded(inner: &Arc<dyn Store>, keys: Vec<(String, i64)>) {
    if keys.is_empty() || matches!(inner.txn(guarded(&keys)).await, Ok(r) if r.succeeded) {
        return;
    }
    for k in keys {
        if let Err(e) = inner.txn(guarded(std::slice::from_ref(&k))).await {
            tracing::warn!(key = %k.0, error = %e, "could not delete an ended agent lease's key");
        }
    }
}

fn guarded(keys: &[(String, i64)]) -> Txn {
    Txn {
        compares: keys
            .iter()
            .map(|(k, rev)| Compare::ModRevisionEquals(k.clone(), *rev))
            .collect(),
        success: keys.iter().map(|(k, _)| Op::Delete(k.clone())).collect(),
        failure: vec![],
    }
}

/// Renews carrier `c` every quarter of its TTL until it is lost (or unrenewable for a TTL) or
/// the wrapper is dropped.
pub(super) async fn keep_carrier(this: Weak<SharedLeases>, c: LeaseId, ttl: Duration) {
    let every = ttl / 4;
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let Some(this) = this.upgrade() else { return };
        let left = ttl
            .saturating_sub(last_ok.elapsed())
            .max(Duration::from_millis(100));
        let renewed = tokio::time::timeout(left, this.inner.lease_keep_alive(c)).await;
        if !matches!(renewed, Ok(Ok(_))) {
            crate::server::metrics::global().keepalive_failures.inc();
        }
        match renewed {
            Ok(Ok(_)) => last_ok = Instant::now(),
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
