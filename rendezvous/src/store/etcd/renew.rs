//! Renewing a lease on etcd: on the lease's open keep-alive stream when it still works
//! ([`super::keep_alive::KeepAlives`]), else on a new one opened on whichever member answers.

use std::time::Duration;

use etcd_client as etcd;

use super::keep_alive::KeepAlive;
use super::{EtcdStore, REQUEST_TIMEOUT};
use crate::store::LeaseId;
use crate::StoreError;

/// How long a renewal waits on the lease's cached keep-alive stream before it opens a new one on
/// whichever member answers. A working stream answers in milliseconds; one to a member that just
/// died can hang, and waiting the whole request timeout (2 s) on it spent half of a 4 s TTL while
/// etcd elected a new leader.
const CACHED_STREAM_WAIT: Duration = Duration::from_millis(500);

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
            if let Ok(Ok(Some(r))) = tokio::time::timeout(CACHED_STREAM_WAIT, renew).await {
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
