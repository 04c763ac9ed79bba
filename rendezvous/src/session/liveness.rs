//! Whether a node's agent is still a process: the session knocks on its probe port, the seam
//! to the network that the reconnect grace and the attribution of a worker failure use.
//!
//! Every agent of a multi-node run holds a UDP probe port for its whole life (advertised with its
//! candidacy) and answers every probe of its run there (`crate::probe`). So a session can ask:
//!
//! - an answer: the agent lives ([`Knock::Alive`]);
//! - an ICMP "port unreachable", which a connected UDP socket reports as `ConnectionRefused`:
//!   the host is up and nothing listens on the port any more, the agent's process is gone
//!   ([`Knock::Gone`]);
//! - nothing: the host is down or cut off, or the path drops UDP ([`Knock::NoAnswer`]): no
//!   evidence either way, and the callers wait as they did before they could knock.
//!
//! An agent's stream that closed without a Leave is revoked at once when its agent is gone,
//! instead of after [`crate::decisions::loss::RECONNECT_GRACE`]; a worker failure is judged the workers'
//! own at once when every other member's agent answers, instead of after
//! [`crate::decisions::loss::ATTRIBUTION_WINDOW`] (see `membership.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;

pub use crate::decisions::loss::Knock;
use crate::probe::{Message, PROBE_BYTES};

/// How often the probe goes again within the wait (one may be lost).
const AGAIN: Duration = Duration::from_millis(100);

/// Knocks on `host:port` (an agent of the run tagged `run_tag`) until it answers, its host
/// refuses, or `within` passed. IPv4 only, as the probe port listens.
pub async fn knock(run_tag: u64, host: &str, port: u16, within: Duration) -> Knock {
    let deadline = Instant::now() + within;
    let resolved = tokio::time::timeout(within, async {
        tokio::net::lookup_host((host, port))
            .await
            .ok()
            .and_then(|mut a| a.find(SocketAddr::is_ipv4))
    })
    .await;
    let Ok(Some(addr)) = resolved else {
        return Knock::NoAnswer;
    };
    let Ok(socket) = UdpSocket::bind(("0.0.0.0", 0)).await else {
        return Knock::NoAnswer;
    };
    if socket.connect(addr).await.is_err() {
        return Knock::NoAnswer;
    }
    let refused = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionRefused;
    let mut buf = [0u8; 64];
    let mut seq = 0u32;
    while Instant::now() < deadline {
        seq += 1;
        let probe = Message {
            answer: false,
            run_tag,
            generation: 0,
            node_rank: u32::MAX,
            seq,
        };
        if let Err(e) = socket.send(&probe.encode()).await {
            if refused(&e) {
                return Knock::Gone;
            }
        }
        let until = (Instant::now() + AGAIN).min(deadline);
        while let Ok(r) = tokio::time::timeout_at(until, socket.recv(&mut buf)).await {
            match r {
                Err(e) if refused(&e) => return Knock::Gone,
                Ok(n)
                    if Message::decode(&buf[..n]).is_some_and(|m| {
                        n == PROBE_BYTES && m.answer && m.run_tag == run_tag && m.seq <= seq
                    }) =>
                {
                    return Knock::Alive;
                }
                _ => {}
            }
        }
    }
    Knock::NoAnswer
}

/// [`knock`] on every one of `agents` (address, probe port) at once.
pub async fn knock_all(run_tag: u64, agents: &[(String, u16)], within: Duration) -> Vec<Knock> {
    let mut set = tokio::task::JoinSet::new();
    for (i, (host, port)) in agents.iter().cloned().enumerate() {
        set.spawn(async move { (i, knock(run_tag, &host, port, within).await) });
    }
    let mut out = vec![Knock::NoAnswer; agents.len()];
    while let Some(r) = set.join_next().await {
        if let Ok((i, k)) = r {
            out[i] = k;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_support::prober;
    use super::*;

    #[tokio::test]
    async fn a_live_agent_answers_a_closed_port_is_gone_and_a_mute_one_says_nothing() {
        let tag = crate::probe::run_tag("job");
        let (alive, _task) = prober("job").await;
        let mute = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mute_port = mute.local_addr().unwrap().port();
        let closed = {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap().port()
        };
        let lo = "127.0.0.1".to_string();
        let t0 = Instant::now();
        let knocks = knock_all(
            tag,
            &[(lo.clone(), alive), (lo.clone(), closed), (lo, mute_port)],
            Duration::from_millis(400),
        )
        .await;
        assert_eq!(knocks, vec![Knock::Alive, Knock::Gone, Knock::NoAnswer]);
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "the mute one is waited out: {took:?}"
        );
        let t0 = Instant::now();
        assert_eq!(
            knock(tag, "127.0.0.1", alive, Duration::from_secs(5)).await,
            Knock::Alive
        );
        assert!(t0.elapsed() < Duration::from_secs(1), "answered at once");
        // Another run's agent does not answer this run's knock.
        let (other, _t) = prober("other").await;
        assert_eq!(
            knock(tag, "127.0.0.1", other, Duration::from_millis(300)).await,
            Knock::NoAnswer
        );
        assert_eq!(
            knock(tag, "no-such-host.invalid", 1, Duration::from_millis(300)).await,
            Knock::NoAnswer
        );
    }
}
