//! The lease keeper: one task per session that renews the node's lease and reports when it is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::clock::now_ms;
use crate::human::duration as human;
use crate::store::{LeaseId, Store};
use crate::StoreError;

/// A lost lease and why, as the keeper reports it.
pub(crate) type Lost = (LeaseId, String);

/// How the keeper renews.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeeperConfig {
    /// Lease time-to-live.
    pub ttl: Duration,
    /// Renewal period.
    pub every: Duration,
    /// Renew on the timer whatever the agent does (agent-side); `false`: only while the agent
    /// was heard from within a TTL (server-side).
    pub auto: bool,
}

/// Renews `lease` every keep-alive interval on its own task, so slow store operations of the
/// actor never starve it. Server-side it renews only while the agent is heard from (`heard`, ms
/// since the epoch) within a TTL. Reports a lost lease (or a whole TTL without a successful
/// renewal) on `lost`.
pub(crate) fn spawn_keeper(
    store: Arc<dyn Store>,
    lease: LeaseId,
    cfg: KeeperConfig,
    heard: Arc<AtomicU64>,
    lost: mpsc::UnboundedSender<Lost>,
) -> tokio::task::JoinHandle<()> {
    let KeeperConfig { ttl, every, auto } = cfg;
    tokio::spawn(async move {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(every).await;
            if !auto
                && now_ms().saturating_sub(heard.load(Ordering::SeqCst)) > ttl.as_millis() as u64
            {
                continue; // the agent went silent: let its lease run out
            }
            // Never wait past the moment the lease would expire: fencing is bounded by the TTL.
            let left = ttl
                .saturating_sub(last_ok.elapsed())
                .max(Duration::from_millis(100));
            let renewed = match tokio::time::timeout(left, store.lease_keep_alive(lease)).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Unavailable {
                    endpoint: store.name(),
                    reason: format!("no answer to the keep-alive within {}", human(left)),
                }),
            };
            if renewed.is_err() {
                crate::metrics::global().keepalive_failures.inc();
            }
            match renewed {
                Ok(_) => last_ok = Instant::now(),
                Err(StoreError::LeaseLost(_)) => {
                    let _ = lost.send((lease, format!("lease {lease:#x} expired or was revoked")));
                    return;
                }
                Err(e) if last_ok.elapsed() >= ttl => {
                    let _ = lost.send((
                        lease,
                        format!(
                            "could not renew lease {lease:#x} for {} (TTL {}): {e}",
                            human(last_ok.elapsed()),
                            human(ttl)
                        ),
                    ));
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, lease = format!("{lease:#x}"), "keep-alive failed; retrying until the lease would expire");
                }
            }
        }
    })
}
