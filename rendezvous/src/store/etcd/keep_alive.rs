//! Lease renewals on etcd: each lease keeps its keep-alive stream from one renewal to the next.
//!
//! Opening a keep-alive stream already sends the lease's first keep-alive; after that each
//! renewal is one message each way on the open stream. A stream that fails or times out is
//! dropped, and the next renewal opens a new one on whichever member answers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use etcd_client as etcd;

use super::{EtcdStore, REQUEST_TIMEOUT};
use crate::store::LeaseId;
use crate::StoreError;

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

    fn ttl(&self, lease: LeaseId) -> Option<i64> {
        self.ttls.get(&lease).copied()
    }

    /// Forgets a revoked lease: its stream closes.
    pub(super) fn forget(&mut self, lease: LeaseId) {
        self.open.remove(&lease);
        self.ttls.remove(&lease);
    }

    fn take(&mut self, lease: LeaseId) -> Option<KeepAlive> {
        self.open.remove(&lease).map(|(pair, _)| pair)
    }

    fn put(&mut self, lease: LeaseId, pair: KeepAlive) {
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

impl EtcdStore {
    /// Renews `lease` once (see [`crate::Store::lease_keep_alive`]).
    pub(super) async fn keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        // The lease's keep-alive stream from its last renewal, if it still works: one message
        // each way per renewal. A stream that fails is dropped and a new one opened below, on
        // whichever member answers (a cached stream to a member that died would fail every
        // renewal until the lease expired).
        let cached = self
            .keep_alives
            .lock()
            .expect("keep-alive cache poisoned")
            .take(lease);
        if let Some((mut keeper, mut stream)) = cached {
            let renew = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            if let Ok(Ok(Some(r))) = tokio::time::timeout(REQUEST_TIMEOUT, renew).await {
                return self.renewed(lease, r.ttl(), (keeper, stream));
            }
        }
        let (keeper, mut stream) = self
            .retry(|mut c| async move {
                // Opening the stream sends the lease's first keep-alive, and etcd-client reads
                // its answer: "lease not found" when the lease is gone.
                match tokio::time::timeout(REQUEST_TIMEOUT, c.lease_keep_alive(lease)).await {
                    Ok(r) => r,
                    Err(_) => Err(etcd::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                        "keep-alive timed out",
                    ))),
                }
            })
            .await
            .map_err(|e| match e {
                etcd::Error::LeaseKeepAliveError(m) if m.contains("lease not found") => {
                    StoreError::LeaseLost(lease)
                }
                e => self.unavailable(e),
            })?;
        let known = self
            .keep_alives
            .lock()
            .expect("keep-alive cache poisoned")
            .ttl(lease);
        let ttl = match known {
            Some(ttl) => ttl,
            // A lease this process did not grant (an agent that moved here from another
            // replica): one more keep-alive tells its TTL.
            None => {
                let mut keeper = keeper;
                let renew = async {
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                return match tokio::time::timeout(REQUEST_TIMEOUT, renew).await {
                    Ok(Ok(Some(r))) => self.renewed(lease, r.ttl(), (keeper, stream)),
                    // The lease was renewed by the first keep-alive; only its TTL is unknown.
                    _ => Ok(Duration::ZERO),
                };
            }
        };
        self.renewed(lease, ttl, (keeper, stream))
    }

    /// The answer to a renewal whose keep-alive answered `ttl` seconds: the stream is kept for
    /// the next renewal while the lease lives.
    fn renewed(&self, lease: LeaseId, ttl: i64, pair: KeepAlive) -> Result<Duration, StoreError> {
        if ttl <= 0 {
            return Err(StoreError::LeaseLost(lease));
        }
        self.keep_alives
            .lock()
            .expect("keep-alive cache poisoned")
            .put(lease, pair);
        Ok(Duration::from_secs(ttl as u64))
    }
}
