//! MASTER_PORT reservation that two jobs started at the same moment cannot both win.
//!
//! Probe-then-close (torchrun's `get_free_port`) leaves a window in which another job gets the
//! same port. Instead the agent binds port 0 with `SO_REUSEADDR` and keeps that socket open, not
//! listening, for the whole generation: the kernel will not hand the port to anyone else's
//! `bind(0)`, while the rank-0 worker's TCPStore (which also sets `SO_REUSEADDR`, as libuv and
//! c10d's socket code do) may still bind and listen on it, because Linux allows reuse between
//! sockets none of which is listening yet. That sharing has a price: any other process that binds
//! the same port with `SO_REUSEADDR` and listens first takes it. So when the agent hosts the
//! worker store itself (the default), it listens from the moment of the reservation
//! ([`ReservedPort::listening`]): from then on nobody else can bind the port, and the store
//! serves on that socket ([`ReservedPort::into_listener`]).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::OwnedFd;

use nix::sys::socket::{
    bind, getsockname, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    SockaddrIn,
};

/// A port held for one generation; released when dropped.
#[derive(Debug)]
pub struct ReservedPort {
    port: u16,
    socket: OwnedFd,
}

impl ReservedPort {
    /// Reserves a free TCP port on all IPv4 interfaces.
    pub fn new() -> io::Result<Self> {
        let fd = bound(0)?;
        let addr: SockaddrIn = getsockname(std::os::fd::AsRawFd::as_raw_fd(&fd))?;
        Ok(Self {
            port: addr.port(),
            socket: fd,
        })
    }

    /// Reserves a free TCP port on all IPv4 interfaces and listens on it at once: no other
    /// socket can bind the port from now on, not even one with `SO_REUSEADDR` (what the agent's
    /// own worker store needs; connections wait in the backlog until it serves).
    pub fn listening() -> io::Result<Self> {
        let r = Self::new()?;
        listen_on(&r.socket)?;
        Ok(r)
    }

    /// The port number (1–65535).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Listens on the reserved port (the agent's worker store), if it does not already: on a
    /// port reserved by [`Self::new`] another process may have taken it first (`EADDRINUSE`); on
    /// one reserved by [`Self::listening`] it cannot fail that way.
    pub fn into_listener(self) -> io::Result<TcpListener> {
        listen(self.socket)
    }
}

/// A listener on `port` of all IPv4 interfaces with `SO_REUSEADDR`, as torch's TCPStore server
/// binds (a `--master-port` the user fixed). `EADDRINUSE` if another socket listens there.
pub fn bind_listener(port: u16) -> io::Result<TcpListener> {
    listen(bound(port)?)
}

/// A TCP socket bound to `port` (0: any free one) on all IPv4 interfaces, with `SO_REUSEADDR`.
fn bound(port: u16) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)),
    )?;
    Ok(fd)
}

/// [`listen_on`] `fd`, as a listener.
fn listen(fd: OwnedFd) -> io::Result<TcpListener> {
    listen_on(&fd)?;
    Ok(TcpListener::from(fd))
}

/// `listen(2)` with the system's maximum backlog (torch's server also asks for it: every worker
/// of a large job connects at once); again on a listening socket, it changes nothing.
fn listen_on(fd: &OwnedFd) -> io::Result<()> {
    nix::sys::socket::listen(fd, Backlog::MAXCONN)?;
    Ok(())
}

/// The local IP this host uses to reach `endpoint` (`host:port`), found by "connecting" a UDP
/// socket (no packet is sent) and reading its local address. `None` if unresolvable.
pub fn route_local_ip(endpoint: &str) -> Option<String> {
    use std::net::{ToSocketAddrs, UdpSocket};
    let target = endpoint.to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let sock = UdpSocket::bind(bind).ok()?;
    sock.connect(target).ok()?;
    Some(sock.local_addr().ok()?.ip().to_string())
}

/// Whether this host holds `ip`: a socket can be bound to it (the kernel's own answer, so a
/// loopback range or an address added to any interface counts).
pub fn holds_address(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// The addresses of this host's interfaces (IPv4 and IPv6, link-local included), in the order
/// the kernel lists them; empty if they cannot be read.
pub fn interface_addresses() -> Vec<std::net::IpAddr> {
    let Ok(list) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in list {
        let Some(addr) = a.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            std::net::IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            std::net::IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_port_is_not_handed_out_again_but_can_be_listened_on_with_reuse() {
        let held: Vec<ReservedPort> = (0..50).map(|_| ReservedPort::new().unwrap()).collect();
        let mut ports: Vec<u16> = held.iter().map(|r| r.port()).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 50, "no port handed out twice while held");

        // What a TCPStore does on the reserved port: SO_REUSEADDR, bind, listen.
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        setsockopt(&fd, sockopt::ReuseAddr, &true).unwrap();
        let addr = SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, held[0].port()));
        bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).unwrap();
        nix::sys::socket::listen(&fd, nix::sys::socket::Backlog::new(8).unwrap()).unwrap();
    }

    #[test]
    fn a_reserved_port_becomes_a_listener_on_the_same_port() {
        let r = ReservedPort::new().unwrap();
        let port = r.port();
        let l = r.into_listener().unwrap();
        assert_eq!(l.local_addr().unwrap().port(), port);
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
        assert!(
            bind_listener(port).is_err(),
            "a listening port cannot be bound again"
        );
    }

    #[test]
    fn a_shareable_reservation_can_be_taken_but_a_listening_one_cannot() {
        // The window a CI run once hit: another process listens first on a shareable
        // reservation, and the agent's store then cannot listen there.
        // The thief does what a TCPStore or any server with `SO_REUSEADDR` does: bind, listen.
        let shared = ReservedPort::new().unwrap();
        let thief = bind_listener(shared.port()).unwrap();
        let err = shared.into_listener().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        drop(thief);

        // The agent's own store reserves by listening: the same thief is refused, and the
        // store serves on the port.
        let held = ReservedPort::listening().unwrap();
        let port = held.port();
        assert_eq!(
            bind_listener(port).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        let l = held.into_listener().unwrap();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
    }

    #[test]
    fn loopback_is_held_and_a_documentation_address_is_not() {
        assert!(holds_address("127.0.0.1".parse().unwrap()));
        assert!(
            holds_address("127.0.0.9".parse().unwrap()),
            "all of 127/8 is local"
        );
        // TEST-NET-1 (RFC 5737): never assigned to a host; binding sends nothing.
        assert!(!holds_address("192.0.2.1".parse().unwrap()));
        assert!(interface_addresses().contains(&"127.0.0.1".parse().unwrap()));
    }
}
