//! Name resolution for rendezvous and master endpoints, re-done at every attempt.
//!
//! Pods start at different times: the headless Service record of the index-0 pod (or the
//! master's) appears only once that pod runs, and changes when a pod is recreated with a new
//! IP. So drun never caches an address: [`resolve`] is called before every connection attempt
//! and at every round, and a name that does not resolve yet is one more reason to wait (the
//! agent's `dns::wait`, up to the join timeout).
//!
//! `DRUN_HOSTS_FILE` (test and operations facility): a file in `/etc/hosts` format read before
//! the system resolver at every lookup; a name listed there resolves to its address. Tests use
//! it to make a name start resolving at a chosen moment; operators can use it to pin a name
//! while DNS is broken. Unset: the system resolver only (`getaddrinfo`, which reads
//! `/etc/hosts` and DNS as `nsswitch.conf` says).

use std::net::{IpAddr, SocketAddr};

/// The environment variable naming the override file.
pub const HOSTS_FILE_VAR: &str = "DRUN_HOSTS_FILE";

/// An endpoint that is no `host:port` ([`split`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// No `:PORT`.
    #[error("'{0}' has no port")]
    NoPort(String),
    /// A port that is not a number from 0 to 65535.
    #[error("'{0}' has no valid port")]
    BadPort(String),
}

/// Why an endpoint does not resolve ([`resolve`]).
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The endpoint is no `host:port`.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The resolver answered with no address.
    #[error("{host} does not resolve yet (no address)")]
    NoAddress {
        /// The host name.
        host: String,
    },
    /// The resolver failed (unknown name, no DNS).
    #[error("{host} does not resolve yet ({source})")]
    Lookup {
        /// The host name.
        host: String,
        /// What the resolver said.
        source: std::io::Error,
    },
}

/// Resolves `host:port` (IPv6 in brackets) to one socket address, IPv4 first: an IP literal as
/// it is, else the `DRUN_HOSTS_FILE` override, else the system resolver.
///
/// # Errors
/// One line: the name does not resolve (yet), or the endpoint has no valid port.
pub async fn resolve(endpoint: &str) -> Result<SocketAddr, DnsError> {
    let (host, port) = split(endpoint)?;
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if let Some(path) = std::env::var_os(HOSTS_FILE_VAR) {
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Some(ip) = lookup_in_hosts(&text, host) {
                return Ok(SocketAddr::new(ip, port));
            }
        }
    }
    match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or(addrs.first())
                .copied()
                .ok_or_else(|| DnsError::NoAddress {
                    host: host.to_string(),
                })
        }
        Err(source) => Err(DnsError::Lookup {
            host: host.to_string(),
            source,
        }),
    }
}

/// Splits `host:port` / `[v6]:port`.
///
/// # Errors
/// No port, or one that is not a number from 0 to 65535.
pub fn split(endpoint: &str) -> Result<(&str, u16), EndpointError> {
    let (host, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| EndpointError::NoPort(endpoint.to_string()))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| EndpointError::BadPort(endpoint.to_string()))?;
    Ok((host.trim_start_matches('[').trim_end_matches(']'), port))
}

/// The address `/etc/hosts`-format `text` gives `name` (case-insensitive; the first line
/// naming it wins; comments and malformed lines are skipped).
pub fn lookup_in_hosts(text: &str, name: &str) -> Option<IpAddr> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let ip = words.next()?.parse::<IpAddr>().ok()?;
            words.any(|w| w.eq_ignore_ascii_case(name)).then_some(ip)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_format_lookup() {
        let text = "# pinned\n127.0.0.1 localhost\n10.0.0.7\tpt-w-0-0.pt  pt-w-0-0 # idx 0\nbad line\n::1 six\n";
        assert_eq!(
            lookup_in_hosts(text, "pt-w-0-0.pt"),
            "10.0.0.7".parse().ok()
        );
        assert_eq!(lookup_in_hosts(text, "PT-W-0-0"), "10.0.0.7".parse().ok());
        assert_eq!(lookup_in_hosts(text, "six"), "::1".parse().ok());
        assert_eq!(lookup_in_hosts(text, "idx"), None, "comments are no names");
        assert_eq!(lookup_in_hosts(text, "line"), None);
        assert_eq!(split("[::1]:29400").unwrap(), ("::1", 29400));
        assert_eq!(split("a.b:1").unwrap(), ("a.b", 1));
        assert_eq!(split("a.b"), Err(EndpointError::NoPort("a.b".into())));
        assert_eq!(
            split("a.b:x").unwrap_err().to_string(),
            "'a.b:x' has no valid port"
        );
    }

    #[tokio::test]
    async fn literals_resolve_and_unknown_names_say_so() {
        assert_eq!(
            resolve("127.0.0.1:5").await.unwrap(),
            "127.0.0.1:5".parse().unwrap()
        );
        let e = resolve("no-such-host.invalid:5")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("no-such-host.invalid does not resolve yet"),
            "{e}"
        );
    }
}
