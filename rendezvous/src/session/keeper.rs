//! The lease keeper: one task per session that renews the node's lease and reports when it is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::hold::{self, Renew};
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
/// since the epoch) within a TTL, or while nobody of its run is (`run_heard`: this server is cut
/// off; [`hold`]). Reports a lost lease (or a whole TTL without a successful
/// renewal) on `lost`.
pub(crate) fn spawn_keeper(
    store: Arc<dyn Store>,
    lease: LeaseId,
    cfg: KeeperConfig,
    heard: Arc<AtomicU64>,
    run_heard: Option<Arc<AtomicU64>>,
    lost: mpsc::UnboundedSender<Lost>,
) -> tokio::task::JoinHandle<()> {
    let KeeperConfig { ttl, every, auto } = cfg;
    tokio::spawn(async move {
        let mut last_ok = Instant::now();
        let mut held = false;
        loop {
            tokio::time::sleep(every).await;
            if !auto {
                let since = |ms: u64| Duration::from_millis(now_ms().saturating_sub(ms));
                let agent = since(heard.load(Ordering::SeqCst));
                let run = run_heard.as_ref().map(|r| since(r.load(Ordering::SeqCst)));
                match hold::renew(agent, run, ttl) {
                    Renew::Heard => held = false,
                    Renew::Held => {
                        if !held {
                            held = true;
                            tracing::debug!(
                                lease = format!("{lease:#x}"),
                                "no agent of this run heard for {}: this server is more likely cut off than every node at once; holding the silent agents' leases (up to {}) for them to come back",
                                human(run.unwrap_or_default()),
                                human(hold::HOLD_MAX)
                            );
                        }
                    }
                    // The agent went silent while its run talks: let its lease run out.
                    Renew::No => continue,
                }
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
                crate::server::metrics::global().keepalive_failures.inc();
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
