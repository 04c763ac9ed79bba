//! `EtcdStore`: the [`Store`] on etcd v3 (leases, transactions, watches), for multi-node runs.
//!
//! A thin mapping onto `etcd-client`: compares and ops translate one to one (a missing key is
//! compared as revision/version 0, as etcd does), each lease renewal is one short keep-alive
//! exchange, and a prefix watch is forwarded into a channel by a task that ends when the receiver is
//! dropped. Every failure of the cluster surfaces as [`StoreError::Unavailable`] naming the
//! endpoints, so callers can retry with backoff until their lease really expires.
//! Within one process identical prefix watches share one etcd watch and identical reads are
//! batched ([`crate::store::etcd::share`]): a server with a thousand sessions makes one watch and a few
//! reads where it made a thousand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client as etcd;
use tokio::sync::mpsc;

pub mod access;
pub mod args;
pub mod batch;
mod combinable;
mod combine;
mod connect;
mod keep_alive;
mod renew;
pub mod share;

use crate::store::{Compare, KeyValue, LeaseId, Op, Store, Txn, TxnResponse, WatchEvent};
use crate::StoreError;
use batch::Batcher;
use combinable::{ReadReq, WriteReq};
use keep_alive::KeepAlives;
use share::{Reads, Sink, Watches};

/// Timeout of one etcd request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeout of establishing a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest etcd answer decoded (etcd-client's default is 4 MiB). A watch that falls behind gets
/// up to 1,000 revisions per answer, and a revision of a combined write holds up to 128 keys: a
/// burst of 10,000 agents' joins went past 4 MiB and broke the watch.
const MAX_MESSAGE: usize = 512 << 20;

/// A KV client of `c` that decodes answers up to [`MAX_MESSAGE`].
fn kv(c: &etcd::Client) -> etcd::KvClient {
    c.kv_client().max_decoding_message_size(MAX_MESSAGE)
}

/// An etcd v3 cluster.
///
/// One client per member, used in turn: the client's own balancer keeps sending requests to a
/// member that is down (measured: > 4 s of "connection refused" after the leader was killed),
/// so connection-level failures rotate to the next member instead.
#[derive(Clone)]
pub struct EtcdStore(Arc<Shared>);

/// What every clone of an [`EtcdStore`] shares: each session holds a clone and clones it again
/// for the calls it makes, so a clone is one reference count, not one per part.
pub struct Shared {
    clients: Vec<etcd::Client>,
    current: AtomicUsize,
    endpoints: String,
    /// Reads of the same key batched, prefix watches shared (`etcd_share.rs`).
    reads: Arc<Reads>,
    watches: Arc<Watches>,
    /// Reads of different keys, and unconditional writes, combined into one transaction each
    /// (`etcd_batch.rs`).
    read_batch: Arc<Batcher<ReadReq, Result<Option<KeyValue>, StoreError>>>,
    write_batch: Arc<Batcher<WriteReq, Result<TxnResponse, StoreError>>>,
    /// Each kept lease's keep-alive stream, reused from one renewal to the next.
    keep_alives: std::sync::Mutex<KeepAlives>,
}

impl std::ops::Deref for EtcdStore {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

fn to_kv(kv: &etcd::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: bytes::Bytes::copy_from_slice(kv.value()),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: (kv.lease() != 0).then_some(kv.lease()),
    }
}

fn to_op(op: &Op) -> etcd::TxnOp {
    match op {
        Op::Put { key, value, lease } => {
            let opts = lease.map(|l| etcd::PutOptions::new().with_lease(l));
            etcd::TxnOp::put(key.as_bytes(), value.clone(), opts)
        }
        Op::Delete(key) => etcd::TxnOp::delete(key.as_bytes(), None),
        Op::DeletePrefix(prefix) => etcd::TxnOp::delete(
            prefix.as_bytes(),
            Some(etcd::DeleteOptions::new().with_prefix()),
        ),
    }
}

fn to_compare(c: &Compare) -> etcd::Compare {
    use etcd::CompareOp::{Equal, Greater};
    match c {
        Compare::ValueEquals(k, v) => etcd::Compare::value(k.as_bytes(), Equal, v.clone()),
        Compare::ModRevisionEquals(k, r) => etcd::Compare::mod_revision(k.as_bytes(), Equal, *r),
        Compare::Exists(k) => etcd::Compare::version(k.as_bytes(), Greater, 0),
        Compare::Missing(k) => etcd::Compare::version(k.as_bytes(), Equal, 0),
    }
}

impl EtcdStore {
    fn client(&self) -> etcd::Client {
        self.clients[self.current.load(Ordering::SeqCst) % self.clients.len()].clone()
    }

    /// Runs `f`, moving to the next member on connection-level failures: every member twice,
    /// with a short pause after each full round (e.g. while a new leader is elected).
    async fn retry<T, F, Fut>(&self, mut f: F) -> Result<T, etcd::Error>
    where
        F: FnMut(etcd::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd::Error>>,
    {
        let n = self.clients.len();
        let mut attempt = 0;
        loop {
            let r = f(self.client()).await;
            if r.is_err() {
                crate::server::metrics::global().etcd_errors.inc();
            }
            match r {
                Err(e) if attempt < 2 * n + 1 && retryable(&e) => {
                    attempt += 1;
                    self.current.fetch_add(1, Ordering::SeqCst);
                    if attempt % n == 0 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                r => return r,
            }
        }
    }

    fn unavailable(&self, e: etcd::Error) -> StoreError {
        StoreError::Unavailable {
            endpoint: self.endpoints.clone(),
            reason: root_cause(&e),
        }
    }
}

/// Failures that say "this member/connection is down", not "the request is wrong".
fn retryable(e: &etcd::Error) -> bool {
    match e {
        etcd::Error::LeaseKeepAliveError(m) => !m.contains("lease not found"),
        etcd::Error::TransportError(_) | etcd::Error::IoError(_) | etcd::Error::WatchError(_) => {
            true
        }
        etcd::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
            ) && !s.message().contains("lease not found")
        }
        _ => false,
    }
}

#[async_trait]
impl Store for EtcdStore {
    fn name(&self) -> String {
        format!("etcd {}", self.endpoints)
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let this = self.clone();
        self.reads
            .get(key, move |key| {
                let this = this.clone();
                async move { this.get_batched(key).await }
            })
            .await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        let resp = self
            .retry(|c| async move {
                kv(&c)
                    .get(prefix, Some(etcd::GetOptions::new().with_prefix()))
                    .await
            })
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(resp.kvs().iter().map(to_kv).collect())
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        if !WriteReq::combinable(&txn) {
            return self.txn_once(txn).await;
        }
        let this = self.clone();
        self.write_batch
            .call(WriteReq(txn.success), move |batch| {
                let this = this.clone();
                async move { this.write_combined(batch).await }
            })
            .await
            .unwrap_or_else(|| Err(self.dropped("write")))
    }

    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let resp = self
            .retry(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map_err(|e| self.unavailable(e))?;
        self.keep_alives
            .lock()
            .expect("keep-alive cache poisoned")
            .granted(resp.id(), secs);
        Ok(resp.id())
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.keep_alive(lease).await
    }

    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.keep_alives
            .lock()
            .expect("keep-alive cache poisoned")
            .forget(lease);
        match self
            .retry(|mut c| async move { c.lease_revoke(lease).await })
            .await
        {
            Ok(_) => Ok(()),
            Err(etcd::Error::GRpcStatus(s)) if s.message().contains("lease not found") => Ok(()),
            Err(e) => Err(self.unavailable(e)),
        }
    }

    async fn watch_prefix(
        &self,
        prefix: &str,
        after: i64,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        if after > 0 {
            return self.watch_once(prefix, after).await;
        }
        self.watches
            .watch(prefix, |hub| async move { self.watch_once(&hub, 0).await })
            .await
    }

    async fn watch_prefixes(
        &self,
        prefixes: &[String],
    ) -> Result<mpsc::UnboundedReceiver<Option<WatchEvent>>, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        for prefix in prefixes {
            self.watches
                .watch_into(prefix, Sink::Merged(tx.clone()), |hub| async move {
                    self.watch_once(&hub, 0).await
                })
                .await?;
        }
        Ok(rx)
    }
}

impl EtcdStore {
    /// One etcd transaction of its own.
    async fn txn_once(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        let t = etcd::Txn::new()
            .when(txn.compares.iter().map(to_compare).collect::<Vec<_>>())
            .and_then(txn.success.iter().map(to_op).collect::<Vec<_>>())
            .or_else(txn.failure.iter().map(to_op).collect::<Vec<_>>());
        let resp = self
            .retry(|c| {
                let t = t.clone();
                async move { kv(&c).txn(t).await }
            })
            .await
            .map_err(|e| match e {
                etcd::Error::GRpcStatus(s) if s.message().contains("lease not found") => {
                    let lease = txn
                        .success
                        .iter()
                        .chain(&txn.failure)
                        .find_map(|op| match op {
                            Op::Put { lease: Some(l), .. } => Some(*l),
                            _ => None,
                        })
                        .unwrap_or(0);
                    StoreError::LeaseLost(lease)
                }
                e => self.unavailable(e),
            })?;
        Ok(TxnResponse {
            succeeded: resp.succeeded(),
            revision: resp.header().map_or(0, |h| h.revision()),
        })
    }

    /// One etcd read of `key`.
    async fn get_once(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let resp = self
            .retry(|c| async move { kv(&c).get(key, None).await })
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(resp.kvs().first().map(to_kv))
    }

    /// One etcd watch of `prefix` after revision `after` (0: from now), forwarded into a
    /// channel by a task that ends when the receiver is dropped. A broken watch stream is
    /// resumed after the last revision seen, so no event is lost; the channel closes only when
    /// etcd cancels the watch (e.g. its start revision was compacted) or cannot be reached.
    async fn watch_once(
        &self,
        prefix: &str,
        after: i64,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        let mut stream = self.open_watch(prefix, after).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let this = self.clone();
        let prefix = prefix.to_string();
        tokio::spawn(async move {
            // Events up to this revision were forwarded (0: none yet, watching from `after`).
            let mut seen = after;
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    _ = tx.closed() => return,
                };
                let resp = match msg {
                    Ok(Some(resp)) => resp,
                    broken => {
                        tracing::warn!(prefix = %prefix, after = seen, error = ?broken.err(), "etcd watch stream broke; resuming it");
                        let from = seen;
                        // Not a hot loop when the same answer breaks it again.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        if this.revision().await.is_ok_and(|now| now < from) {
                            // etcd came back without its history (a wiped data dir): close, so
                            // the subscriber re-reads the store instead of waiting for revisions
                            // that will mean something else.
                            return;
                        }
                        match this.open_watch(&prefix, from).await {
                            Ok(s) => {
                                stream = s;
                                seen = from;
                                continue;
                            }
                            Err(e) => {
                                tracing::error!(prefix = %prefix, error = %e, "could not resume an etcd watch");
                                return;
                            }
                        }
                    }
                };
                if resp.canceled() {
                    return;
                }
                if seen == 0 && resp.created() {
                    // Watching from now: events after this revision.
                    seen = resp.header().map_or(0, |h| h.revision());
                }
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let out = match ev.event_type() {
                        etcd::EventType::Put => WatchEvent::Put(to_kv(kv)),
                        etcd::EventType::Delete => WatchEvent::Delete(
                            String::from_utf8_lossy(kv.key()).into_owned(),
                            kv.mod_revision(),
                        ),
                    };
                    seen = seen.max(kv.mod_revision());
                    if tx.send(out).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    /// The store's current revision.
    async fn revision(&self) -> Result<i64, StoreError> {
        let resp = self
            .retry(|c| async move {
                kv(&c)
                    .get(
                        "/drun/v1/.revision",
                        Some(etcd::GetOptions::new().with_count_only()),
                    )
                    .await
            })
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    /// Opens a watch stream of `prefix` after revision `after` (0: from now) that decodes
    /// answers up to [`MAX_MESSAGE`].
    async fn open_watch(&self, prefix: &str, after: i64) -> Result<etcd::WatchStream, StoreError> {
        let mut opts = etcd::WatchOptions::new().with_prefix();
        if after > 0 {
            opts = opts.with_start_revision(after + 1);
        }
        self.retry(|c| {
            let opts = opts.clone();
            async move {
                c.watch_client()
                    .max_decoding_message_size(MAX_MESSAGE)
                    .watch(prefix, Some(opts))
                    .await
            }
        })
        .await
        .map_err(|e| self.unavailable(e))
    }
}

/// The innermost cause of `e`, in words: etcd-client's own text of a transport error or a
/// gRPC status is a debug dump of tonic's (`... Some(tonic::transport::Error(...))`); tonic's
/// source chain ends in the OS error a user can act on (`Connection refused (os error 111)`),
/// and a status without a source says what it is in its message.
fn root_cause(e: &etcd::Error) -> String {
    let mut cur: &(dyn std::error::Error + 'static) = match e {
        etcd::Error::TransportError(t) => t,
        etcd::Error::GRpcStatus(s) => match std::error::Error::source(s) {
            Some(src) => src,
            // A gRPC server without etcd's API (a drun-rendezvous server, most often) answers
            // Unimplemented with no message.
            None if format!("{:?}", s.code()) == "Unimplemented" => {
                return format!(
                    "it answered, but not as etcd (gRPC Unimplemented{}; a drun-rendezvous server there?)",
                    if s.message().is_empty() { String::new() } else { format!(": {}", s.message()) }
                )
            }
            None if s.message().is_empty() => return format!("gRPC status {:?}", s.code()),
            None => return s.message().to_string(),
        },
        other => other,
    };
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_server_without_etcds_api_is_named_not_left_blank() {
        // What a drun-rendezvous server (tonic) answers an etcd request with.
        let e = etcd::Error::GRpcStatus(tonic::Status::new(tonic::Code::Unimplemented, ""));
        assert_eq!(
            root_cause(&e),
            "it answered, but not as etcd (gRPC Unimplemented; a drun-rendezvous server there?)"
        );
        let e = etcd::Error::GRpcStatus(tonic::Status::new(tonic::Code::Unavailable, ""));
        assert_eq!(root_cause(&e), "gRPC status Unavailable");
    }
}
