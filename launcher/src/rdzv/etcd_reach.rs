//! The `etcd` backend's first connection: like the server backend's ([`super::reach`]), it waits
//! up to the join timeout for etcd to answer (nodes and etcd start in any order under
//! Kubernetes or Slurm), saying so every [`PROGRESS_EVERY`], then gives up with one line.

use std::time::Duration;

use drun_rendezvous::human::duration as human;
use drun_rendezvous::store::etcd::access::EtcdAccess;
use drun_rendezvous::{EtcdStore, StoreError};
use tokio::time::Instant;

use super::reach::{short_reason, PROGRESS_EVERY, QUIET};
use crate::LaunchError;

/// Pause between two connection attempts.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Connects to etcd at `endpoints` with `access` (TLS, user), retrying for up to
/// `join_timeout`; a refusal (credentials, permissions, certificates) ends it at once.
///
/// # Errors
/// [`LaunchError::RendezvousFailed`] naming the endpoints, the last error and the fix when etcd
/// refused this agent or did not answer within `join_timeout`.
pub async fn connect(
    endpoints: &[String],
    access: &EtcdAccess,
    join_timeout: Duration,
) -> Result<EtcdStore, LaunchError> {
    let started = Instant::now();
    let mut next_progress = started + QUIET;
    loop {
        let why = match EtcdStore::connect_with(endpoints, access).await {
            Ok(store) => return Ok(store),
            Err(e @ StoreError::Refused { .. }) => {
                return Err(LaunchError::RendezvousFailed(e.to_string()))
            }
            Err(e) => short_reason(&e.to_string()),
        };
        let waited = started.elapsed();
        let all = endpoints.join(",");
        if waited >= join_timeout {
            return Err(LaunchError::RendezvousFailed(format!(
                "cannot reach etcd at {all} ({why}) within the join timeout of {}; start etcd there, check --rdzv-endpoint, or raise --rdzv-conf join_timeout=SECONDS",
                human(join_timeout)
            )));
        }
        if Instant::now() >= next_progress {
            tracing::info!(
                "waiting for etcd at {all}: {why}; giving up in {}",
                human(join_timeout - waited)
            );
            while next_progress <= Instant::now() {
                next_progress += PROGRESS_EVERY;
            }
        }
        tokio::time::sleep(RETRY_EVERY.min(join_timeout - waited)).await;
    }
}
