//! Waiting for a rendezvous or master name to resolve, up to the join timeout, with a
//! progress line naming the name (see [`crate::rdzv::reach`]). The resolution itself, re-done at
//! every attempt (`DRUN_HOSTS_FILE` first), is [`drun_rendezvous::client::dns`], which the status
//! client shares; it is re-exported here.

use std::net::SocketAddr;

pub use drun_rendezvous::client::dns::{
    lookup_in_hosts, resolve, split, DnsError, EndpointError, HOSTS_FILE_VAR,
};

/// A name that still did not resolve when the join timeout ran out ([`wait`]).
#[derive(Debug, thiserror::Error)]
#[error("the {what} name {endpoint} did not resolve within the join timeout of {}s ({source}); check the pod's subdomain/headless Service, or raise --rdzv-conf join_timeout=SECONDS", timeout.as_secs())]
pub struct NotResolved {
    /// What was waited for ("master", "rendezvous").
    pub what: String,
    /// The endpoint, as given.
    pub endpoint: String,
    /// The join timeout.
    pub timeout: std::time::Duration,
    /// The last resolver error.
    pub source: DnsError,
}

/// [`resolve`] until it succeeds or `timeout` passes: retried with backoff (100 ms doubling
/// to 2 s), one line when the wait starts and a progress line every 10 s naming what is
/// waited for (`what`: "master", "rendezvous").
///
/// # Errors
/// The name still did not resolve after `timeout`: one line naming it and the fix.
pub async fn wait(
    endpoint: &str,
    timeout: std::time::Duration,
    what: &str,
) -> Result<SocketAddr, NotResolved> {
    use std::time::Duration;
    use tokio::time::Instant;
    let started = Instant::now();
    let mut next_progress = started;
    let mut delay = Duration::from_millis(100);
    loop {
        let why = match resolve(endpoint).await {
            Ok(addr) => return Ok(addr),
            Err(why) => why,
        };
        let now = Instant::now();
        let waited = now - started;
        if waited >= timeout {
            return Err(NotResolved {
                what: what.to_string(),
                endpoint: endpoint.to_string(),
                timeout,
                source: why,
            });
        }
        if now >= next_progress {
            tracing::info!(
                "waiting for the {what} name to resolve: {why} (pods start at different times); giving up in {}s",
                (timeout - waited).as_secs()
            );
            next_progress = now + Duration::from_secs(10);
        }
        tokio::time::sleep(delay.min(timeout - waited)).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}
