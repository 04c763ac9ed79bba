//! Guarded deletes of ended agent leases' keys: each key deleted only while its revision is the
//! one its lease last wrote (a key another writer has overwritten since stays), in few
//! transactions when nothing changed under them, else lease by lease and key by key.

use std::sync::Arc;

use super::table::Ended;
use crate::store::{Compare, Op, Store, Txn};

/// Most operations in one delete transaction (etcd's default `--max-txn-ops` is 128).
const MAX_OPS: usize = 120;

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
