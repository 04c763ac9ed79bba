//! Connecting an [`EtcdStore`]: plaintext or with [`access::EtcdAccess`] (TLS, user), a read
//! that proves the cluster answers, and refusals turned into one line that names the fix.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use etcd_client as etcd;

use super::{access, root_cause, EtcdStore, CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use crate::store::Store;
use crate::StoreError;

impl EtcdStore {
    /// Connects to `endpoints` (`host:port` or `http://host:port`, several for a cluster), in
    /// plaintext and without a user.
    ///
    /// # Errors
    /// As [`EtcdStore::connect_with`].
    pub async fn connect(endpoints: &[String]) -> Result<Self, StoreError> {
        Self::connect_with(endpoints, &access::EtcdAccess::default()).await
    }

    /// Connects to `endpoints` with `access`'s TLS and user, and proves the cluster answers
    /// (one read of drun's prefix).
    ///
    /// # Errors
    /// [`StoreError::Refused`] when etcd refuses this client (credentials, permissions,
    /// certificates, a bad endpoint) with one line naming the fix; [`StoreError::Unavailable`]
    /// when no endpoint answers within a few seconds (with a hint when it looks like a TLS
    /// mismatch).
    pub async fn connect_with(
        endpoints: &[String],
        access: &access::EtcdAccess,
    ) -> Result<Self, StoreError> {
        let joined = endpoints.join(",");
        // Diagnosed on the whole chain of the error, reported by its root cause.
        let failed = |endpoint: &str, chain: &str, reason: String| match access::diagnose(
            &format!("{chain}: {reason}"),
            access,
        ) {
            Some(access::Diagnosis::Refused(why)) => StoreError::Refused {
                endpoint: endpoint.to_string(),
                reason: why,
            },
            Some(access::Diagnosis::Hint(why)) => StoreError::Unavailable {
                endpoint: endpoint.to_string(),
                reason: format!("{reason} ({why})"),
            },
            None => StoreError::Unavailable {
                endpoint: endpoint.to_string(),
                reason,
            },
        };
        let opts = access.options(
            etcd::ConnectOptions::new()
                .with_timeout(REQUEST_TIMEOUT)
                .with_connect_timeout(CONNECT_TIMEOUT)
                .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2)),
        );
        let mut clients = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            let url = access.url(ep).map_err(|e| StoreError::Refused {
                endpoint: ep.clone(),
                reason: e.to_string(),
            })?;
            let client = etcd::Client::connect([url.as_str()], Some(opts.clone()))
                .await
                .map_err(|e| failed(ep, &access::chain(&e), root_cause(&e)))?;
            clients.push(client);
        }
        if clients.is_empty() {
            return Err(StoreError::Unavailable {
                endpoint: joined,
                reason: "no etcd endpoint given".into(),
            });
        }
        let store = Self(Arc::new(super::Shared {
            clients,
            current: AtomicUsize::new(0),
            endpoints: joined.clone(),
            reads: Default::default(),
            watches: Default::default(),
            read_batch: Default::default(),
            write_batch: Arc::new(super::batch::Batcher::with_in_flight(
                super::batch::writes_in_flight(),
            )),
            keep_alives: Default::default(),
        }));
        // Connecting is lazy: prove the cluster answers, and that this user may read drun's keys.
        match store.get("/drun/v1/.ping").await {
            Ok(_) => Ok(store),
            Err(StoreError::Unavailable { reason, .. }) => Err(failed(&joined, "", reason)),
            Err(e) => Err(e),
        }
    }
}
