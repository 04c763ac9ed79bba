//! The `Store` trait: the subset of etcd v3 that drun's rendezvous needs.
//!
//! Semantics follow etcd v3 (`etcd-io/etcd` `api/etcdserverpb/rpc.proto`): one global revision
//! that every write increments, per-key `create_revision`/`mod_revision`, leases with a TTL whose
//! expiry deletes the attached keys, multi-op transactions guarded by compares, and prefix
//! watches. Both [`crate::MemoryStore`] and the etcd backend implement exactly this contract, so
//! the decision logic above them cannot tell them apart.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::StoreError;

pub mod etcd;
pub mod keys;
pub mod memory;
pub mod records;
pub mod reports;
pub mod run_state;
pub mod shared_lease;

/// An etcd lease id. Keys put with a lease are deleted when it expires or is revoked.
pub type LeaseId = i64;

/// One stored key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// Full key.
    pub key: String,
    /// Raw value bytes. Cheap to clone: the thousand sessions of a server that read one plan
    /// share its bytes.
    pub value: bytes::Bytes,
    /// Revision at which the key was created (etcd `create_revision`).
    pub create_revision: i64,
    /// Revision of the last write to the key (etcd `mod_revision`).
    pub mod_revision: i64,
    /// Lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

impl KeyValue {
    /// The value as UTF-8 text (lossy).
    pub fn value_str(&self) -> String {
        String::from_utf8_lossy(&self.value).into_owned()
    }
}

/// A guard of a transaction (etcd `Compare`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key exists and its value equals these bytes.
    ValueEquals(String, Vec<u8>),
    /// The key's `mod_revision` equals this (0 means "the key does not exist", as in etcd).
    ModRevisionEquals(String, i64),
    /// The key exists.
    Exists(String),
    /// The key does not exist.
    Missing(String),
}

/// A write inside a transaction (etcd `RequestOp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create or overwrite a key, optionally attached to a lease.
    Put {
        /// Full key.
        key: String,
        /// New value.
        value: Vec<u8>,
        /// Lease to attach, if any.
        lease: Option<LeaseId>,
    },
    /// Delete one key (no error if missing).
    Delete(String),
    /// Delete every key starting with this prefix.
    DeletePrefix(String),
}

impl Op {
    /// A put without a lease.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }
}

/// A transaction: if every compare holds, apply `success`, else `failure`. Atomic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    /// Guards, all of which must hold.
    pub compares: Vec<Compare>,
    /// Ops applied when the guards hold.
    pub success: Vec<Op>,
    /// Ops applied otherwise.
    pub failure: Vec<Op>,
}

/// Result of a [`Txn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether the compares held (and `success` was applied).
    pub succeeded: bool,
    /// Store revision after the transaction.
    pub revision: i64,
}

/// A change seen by a prefix watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or overwritten.
    Put(KeyValue),
    /// A key was deleted (explicitly or by lease expiry); carries the key and the revision.
    Delete(String, i64),
}

/// The key-value store under the rendezvous. See the module docs for the contract.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Backend name for messages (`memory`, or the etcd endpoints).
    fn name(&self) -> String;

    /// Read one key.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;

    /// Read every key starting with `prefix`, in key order.
    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError>;

    /// Run a transaction atomically.
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError>;

    /// Create a lease that lives `ttl` (rounded up to whole seconds, as etcd does) unless kept alive.
    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError>;

    /// Renew a lease to its full TTL. Returns the TTL; [`StoreError::LeaseLost`] if it is gone.
    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError>;

    /// Revoke a lease now, deleting its keys. Revoking a missing lease is not an error.
    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError>;

    /// Watch every change under `prefix` after revision `after` (0 = from now). The channel
    /// closes when the store goes away.
    async fn watch_prefix(
        &self,
        prefix: &str,
        after: i64,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError>;

    /// Every change under each of `prefixes` from now on, merged into one channel; `None`
    /// arrives once for each watch that breaks (the others go on). The channel closes when
    /// the store goes away. A server's session watches four or five prefixes while its
    /// generation runs: the etcd store feeds them all into one channel, without a task or a
    /// channel per prefix; this default forwards each [`Store::watch_prefix`] on a task.
    async fn watch_prefixes(
        &self,
        prefixes: &[String],
    ) -> Result<mpsc::UnboundedReceiver<Option<WatchEvent>>, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        for prefix in prefixes {
            let mut source = self.watch_prefix(prefix, 0).await?;
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        ev = source.recv() => {
                            let done = ev.is_none();
                            if tx.send(ev).is_err() || done {
                                return;
                            }
                        }
                        _ = tx.closed() => return,
                    }
                }
            });
        }
        Ok(rx)
    }

    /// Put one key (a one-op transaction).
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<i64, StoreError> {
        let resp = self
            .txn(Txn {
                compares: vec![],
                success: vec![Op::Put {
                    key: key.to_string(),
                    value,
                    lease,
                }],
                failure: vec![],
            })
            .await?;
        Ok(resp.revision)
    }
}
