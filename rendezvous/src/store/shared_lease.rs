//! Agent leases held by the server on a few shared etcd leases ("carriers").
//!
//! # Why
//! A server speaks for thousands of agents. With one etcd lease per agent, etcd grants one
//! lease per agent through raft at every formation and serves a keep-alive stream per agent
//! for as long as the run lives: at 10,000 agents that load saturated etcd and leases expired
//! (measured with `cargo bench --bench scale`). kube-apiserver meets the same cost for events by
//! reusing one etcd lease for many keys (`k8s.io/apiserver` `storage/etcd3/lease_manager.go`);
//! drun cannot simply reuse, because an agent's keys must go at *its own* deadline — that is
//! how a lost node is noticed.
//!
//! # How
//! [`SharedLeases`] wraps the server's [`Store`]. An agent's lease is a *virtual* lease: an id,
//! a TTL and a deadline in this server's [`table::LeaseTable`]. Its keys are written under the
//! carrier of that TTL, one etcd lease per TTL per server, renewed every quarter TTL. A
//! keep-alive of an agent lease is a table update; etcd sees nothing. When an agent lease
//! expires or is revoked the server deletes its keys itself, each guarded by the revision it
//! last wrote it at (a key another writer has overwritten since stays). Deletes and expiries
//! reach watchers exactly as etcd's own lease expiry does: as delete events.
//!
//! The first write under an agent lease also writes the lease's registry record
//! (`/drun/leases/<id>`: TTL and keys) under the same carrier, in the same transaction, and so
//! does every later write of a key the record names. An agent that reconnects to
//! another replica keeps its lease: the replica finds the record, moves the keys it names under
//! its own carrier in one guarded transaction and adopts the lease
//! ([`SharedLeases::lease_keep_alive`] of an unknown id). A node's join and membership keys are
//! not named ([`rewritten_on_resume`]): the session that resumes the lease writes them again
//! itself, so a formation writes no record beside them but the lease's first. When a server
//! dies, its carrier expires after one TTL and every key it held goes with it, as each agent
//! lease would have.
//!
//! Semantics kept: [`Store::lease_grant`]/`keep_alive`/`revoke`, `LeaseLost` for a put under a
//! gone lease, keys deleted at expiry. Changed: [`crate::KeyValue::lease`] read back is the
//! carrier's id, not the agent lease's.

mod adopt;
mod delete;
mod ended;
pub mod record;
pub mod table;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::store::keys::rewritten_on_resume;
use crate::store::{KeyValue, LeaseId, Op, Store, Txn, TxnResponse, WatchEvent};
use crate::StoreError;
use delete::{delete_ended, delete_guarded};
pub use record::{registry_key, REGISTRY_PREFIX};
use table::LeaseTable;

/// A [`Store`] whose leases are agent leases on shared carriers (module docs).
pub struct SharedLeases {
    inner: Arc<dyn Store>,
    table: Mutex<LeaseTable>,
    /// Carrier per TTL in whole seconds.
    carriers: tokio::sync::Mutex<HashMap<u64, LeaseId>>,
    ids: RandomState,
    next: AtomicU64,
}

impl SharedLeases {
    /// Wraps `inner`; starts the expiry task on the current tokio runtime.
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        let this = Arc::new(Self {
            inner,
            table: Mutex::new(LeaseTable::default()),
            carriers: tokio::sync::Mutex::new(HashMap::new()),
            ids: RandomState::new(),
            next: AtomicU64::new(0),
        });
        this.start_sweep();
        this
    }

    /// Agent leases held now.
    pub fn leases(&self) -> usize {
        self.table().len()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, LeaseTable> {
        self.table.lock().expect("lease table poisoned")
    }

    /// A fresh agent lease id: random, positive, never 0.
    fn fresh_id(&self) -> LeaseId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        (self.ids.hash_one(n) >> 1).max(1) as LeaseId
    }

    /// The carrier for `ttl`, granted on first use and renewed by its own task.
    async fn carrier(self: &Arc<Self>, ttl: Duration) -> Result<LeaseId, StoreError> {
        let secs = ttl.as_secs_f64().ceil().max(1.0) as u64;
        let mut carriers = self.carriers.lock().await;
        if let Some(c) = carriers.get(&secs) {
            return Ok(*c);
        }
        let c = self.inner.lease_grant(Duration::from_secs(secs)).await?;
        carriers.insert(secs, c);
        self.start_keeping(c, Duration::from_secs(secs));
        tracing::info!(
            carrier = format!("{c:#x}"),
            ttl_s = secs,
            "agent leases of this TTL share one etcd lease"
        );
        Ok(c)
    }

    /// The carrier `c` is gone (expired in etcd, or unrenewable for a TTL): its agent leases
    /// with it.
    async fn carrier_lost(&self, c: LeaseId, why: &str) {
        self.carriers.lock().await.retain(|_, v| *v != c);
        let lost = self.table().carrier_lost(c);
        tracing::error!(
            carrier = format!("{c:#x}"),
            agents = lost.len(),
            "the shared etcd lease is gone ({why}): the agent leases on it are lost"
        );
    }

    /// Replaces each agent lease in `ops` by its carrier and appends the registry record of
    /// each agent lease written whose record is not written yet or that writes a key the
    /// record names (every key but those [`rewritten_on_resume`]); returns the ops and the
    /// leases whose record goes with them. `LeaseLost` for a gone lease.
    fn translate(&self, ops: &[Op], now: Instant) -> Result<(Vec<Op>, Vec<LeaseId>), StoreError> {
        let mut table = self.table();
        let mut out = Vec::with_capacity(ops.len() + 1);
        let mut records: Vec<(LeaseId, LeaseId, Vec<String>)> = Vec::new();
        for op in ops {
            match op {
                Op::Put {
                    key,
                    value,
                    lease: Some(l),
                } => {
                    let c = table.carrier(*l, now).ok_or(StoreError::LeaseLost(*l))?;
                    let keys = table.writing(*l, key);
                    if !rewritten_on_resume(key) || !table.holds(*l, &registry_key(*l)) {
                        records.retain(|(r, _, _)| r != l);
                        records.push((*l, c, keys));
                    }
                    out.push(Op::Put {
                        key: key.clone(),
                        value: value.clone(),
                        lease: Some(c),
                    });
                }
                other => out.push(other.clone()),
            }
        }
        let recorded = records.iter().map(|(l, _, _)| *l).collect();
        for (l, c, mut keys) in records {
            let reg = registry_key(l);
            keys.retain(|k| *k != reg && !rewritten_on_resume(k));
            let ttl = table.ttl(l).unwrap_or_default();
            table.writing(l, &reg);
            out.push(Op::Put {
                key: reg,
                value: record::record(ttl, &keys),
                lease: Some(c),
            });
        }
        Ok((out, recorded))
    }

    /// Records what an applied branch wrote, with the registry records of `recorded`; returns
    /// the keys written under a lease that ended meanwhile (to delete).
    fn applied(&self, ops: &[Op], recorded: &[LeaseId], revision: i64) -> Vec<(String, i64)> {
        let mut table = self.table();
        let mut orphans = Vec::new();
        for op in ops {
            match op {
                Op::Put { key, lease, .. } => {
                    if !table.wrote(key, *lease, revision) {
                        orphans.push((key.clone(), revision));
                    }
                }
                Op::Delete(key) => table.deleted(key),
                Op::DeletePrefix(p) => table.deleted_prefix(p),
            }
        }
        for &l in recorded {
            let reg = registry_key(l);
            if !table.wrote(&reg, Some(l), revision) {
                orphans.push((reg, revision));
            }
        }
        orphans
    }

    /// The agent lease a failed transaction was about, for its `LeaseLost`.
    fn first_lease(txn: &Txn) -> LeaseId {
        txn.success
            .iter()
            .chain(&txn.failure)
            .find_map(|op| match op {
                Op::Put { lease: Some(l), .. } => Some(*l),
                _ => None,
            })
            .unwrap_or(0)
    }
}

#[async_trait]
impl Store for Arc<SharedLeases> {
    fn name(&self) -> String {
        self.inner.name()
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.inner.get(key).await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.get_prefix(prefix).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        let now = Instant::now();
        let (success, on_success) = self.translate(&txn.success, now)?;
        let (failure, on_failure) = self.translate(&txn.failure, now)?;
        let sent = Txn {
            compares: txn.compares.clone(),
            success,
            failure,
        };
        let resp = match self.inner.txn(sent).await {
            Ok(r) => r,
            Err(StoreError::LeaseLost(c)) => {
                self.carrier_lost(c, "a write under it was refused").await;
                return Err(StoreError::LeaseLost(SharedLeases::first_lease(&txn)));
            }
            Err(e) => return Err(e),
        };
        let (branch, recorded) = if resp.succeeded {
            (&txn.success, &on_success)
        } else {
            (&txn.failure, &on_failure)
        };
        let orphans = self.applied(branch, recorded, resp.revision);
        if !orphans.is_empty() {
            delete_guarded(&self.inner, orphans).await;
        }
        Ok(resp)
    }

    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let c = self.carrier(ttl).await?;
        let id = self.fresh_id();
        self.table().grant(id, ttl, c, Instant::now());
        Ok(id)
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let known = {
            let mut t = self.table();
            match t.renew(lease, Instant::now()) {
                Some(ttl) => return Ok(ttl),
                None => t.ttl(lease).is_some(),
            }
        };
        if known {
            return Err(StoreError::LeaseLost(lease)); // past its deadline; the sweep deletes it
        }
        self.adopt(lease).await
    }

    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        let ended = self.table().end(lease);
        if let Some(e) = ended {
            delete_ended(&self.inner, vec![e]).await;
        }
        Ok(())
    }

    async fn watch_prefix(
        &self,
        prefix: &str,
        after: i64,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.inner.watch_prefix(prefix, after).await
    }

    async fn watch_prefixes(
        &self,
        prefixes: &[String],
    ) -> Result<mpsc::UnboundedReceiver<Option<WatchEvent>>, StoreError> {
        self.inner.watch_prefixes(prefixes).await
    }
}

#[cfg(test)]
mod table_tests;
#[cfg(test)]
mod tests;
