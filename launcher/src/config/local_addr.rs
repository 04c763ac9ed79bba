//! `--local-addr` against the addresses this host holds: one warning at start when no interface
//! of the host has the address, naming those it does have.
//!
//! The address is what the other nodes dial and what the peer checks probe; one that is not this
//! host's (a typo, a stale value in a job template) sends that traffic to another machine or
//! nowhere. A NAT'ed container may mean it (the address is its host's), so it is a warning, not
//! an error. [`Host::probe`](super::host::Host::probe) does the reading; [`note`] is pure.

use std::net::IpAddr;

/// What the machine says of `--local-addr`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddrCheck {
    /// The addresses the flag names (itself when it is an address; a name resolved).
    pub resolved: Vec<IpAddr>,
    /// Whether this host holds one of them (a socket could be bound to it).
    pub held: bool,
    /// The addresses of the host's interfaces, for the message.
    pub interfaces: Vec<IpAddr>,
}

/// The start-up warning for `--local-addr flag`, or `None` when the host holds it: a name that
/// does not resolve, an IPv6 address (the workers' store listens on IPv4), or an address of
/// another host.
pub fn note(flag: &str, check: &AddrCheck) -> Option<String> {
    if check.resolved.is_empty() {
        return Some(format!(
            "--local-addr {flag} does not resolve on this host: the workers get it as \
             MASTER_ADDR and the other nodes dial it, so they would wait for it; fix the name or \
             give an IPv4 address (a pod's own name may reach DNS only a little later)"
        ));
    }
    if check.resolved.iter().all(IpAddr::is_ipv6) {
        return Some(format!(
            "--local-addr {flag} is an IPv6 address: the workers' store listens on IPv4 only, so \
             the workers would wait for it; give this host's IPv4 address"
        ));
    }
    if check.held {
        return None;
    }
    let resolved = if check.resolved.len() == 1 && check.resolved[0].to_string() == flag {
        String::new()
    } else {
        let all: Vec<String> = check.resolved.iter().map(IpAddr::to_string).collect();
        format!(" ({})", all.join(", "))
    };
    let has: Vec<String> = check.interfaces.iter().map(IpAddr::to_string).collect();
    let has = if has.is_empty() {
        "no address".to_string()
    } else {
        has.join(", ")
    };
    Some(format!(
        "--local-addr {flag}{resolved} is not an address of this host (it has {has}): other \
         nodes and the peer checks will use it as given; behind NAT that may be intended, \
         otherwise give one of the host's addresses"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_the_host_holds_says_nothing() {
        let c = AddrCheck {
            resolved: vec![ip("10.1.0.2")],
            held: true,
            interfaces: vec![ip("127.0.0.1"), ip("10.1.0.2")],
        };
        assert_eq!(note("10.1.0.2", &c), None);
    }

    #[test]
    fn a_foreign_address_is_named_with_the_hosts_addresses() {
        let c = AddrCheck {
            resolved: vec![ip("10.9.9.9")],
            held: false,
            interfaces: vec![ip("127.0.0.1"), ip("10.1.0.2")],
        };
        let n = note("10.9.9.9", &c).unwrap();
        assert!(
            n.starts_with(
                "--local-addr 10.9.9.9 is not an address of this host (it has 127.0.0.1, 10.1.0.2)"
            ),
            "{n}"
        );
    }

    #[test]
    fn a_name_shows_what_it_resolved_to() {
        let c = AddrCheck {
            resolved: vec![ip("192.0.2.7")],
            held: false,
            interfaces: vec![],
        };
        let n = note("trainer-3", &c).unwrap();
        assert!(n.contains("trainer-3 (192.0.2.7) is not an address"), "{n}");
        assert!(n.contains("(it has no address)"), "{n}");
    }

    #[test]
    fn a_name_that_does_not_resolve_is_named() {
        let n = note("nowhere", &AddrCheck::default()).unwrap();
        assert!(
            n.starts_with("--local-addr nowhere does not resolve on this host"),
            "{n}"
        );
    }

    #[test]
    fn an_ipv6_address_is_named_even_when_the_host_holds_it() {
        let c = AddrCheck {
            resolved: vec![ip("::1")],
            held: true,
            interfaces: vec![ip("::1")],
        };
        let n = note("[::1]", &c).unwrap();
        assert!(
            n.starts_with(
                "--local-addr [::1] is an IPv6 address: the workers' store listens on IPv4 only"
            ),
            "{n}"
        );
    }
}
