//! What the session tests share: a session's config, a node's join, waiting for an event.

use std::time::Duration;

use tokio::sync::mpsc;

use super::{Event, SessionConfig};
use crate::{Candidate, Join, RoundConfig};

/// Node `node` of run `run`, forming at `min` to `max` nodes at once (no last call), a 30 s
/// lease kept alive by the session itself.
pub(super) fn config(run: &str, node: &str, min: usize, max: usize) -> SessionConfig {
    SessionConfig {
        run_id: run.into(),
        node_id: node.into(),
        round: RoundConfig {
            min_nodes: min,
            max_nodes: max,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(60),
            settle: Duration::ZERO,
        },
        lease_ttl: Duration::from_secs(30),
        keep_alive_interval: Duration::from_secs(10),
        max_restarts: 0,
        auto_keep_alive: true,
        scale_up_save: None,
        ckpt_interval: Default::default(),
    }
}

/// The join of `node` with `slots` workers and no fingerprint.
pub(super) fn join(node: &str, slots: u32) -> Join {
    Candidate {
        node_id: node.into(),
        advertise_addr: "127.0.0.1".into(),
        slots,
        requested_node_rank: None,
        master_port: 1,
        probe_port: 0,
    }
    .into()
}

/// The next event `pick` accepts within 5 s; every event passed over is appended to `seen`,
/// so a failure can show what the session said instead. `None`: none came.
pub(super) async fn next<T>(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    seen: &mut Vec<String>,
    pick: impl Fn(&Event) -> Option<T>,
) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(ev) = rx.recv().await {
            if let Some(t) = pick(&ev) {
                return Some(t);
            }
            seen.push(format!("{ev:?}"));
        }
        None
    })
    .await
    .ok()
    .flatten()
}

/// An agent's probe port on loopback that answers the probes of `run`, as the launcher's prober
/// does: its port, and the task (dropping it does not stop it; abort it to close the port).
pub(super) async fn prober(run: &str) -> (u16, tokio::task::JoinHandle<()>) {
    use crate::probe::{run_tag, Message};
    let tag = run_tag(run);
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = s.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = s.recv_from(&mut buf).await {
            if let Some(m) = Message::decode(&buf[..n]).filter(|m| m.run_tag == tag) {
                let _ = s
                    .send_to(&Message { answer: true, ..m }.encode(), from)
                    .await;
            }
        }
    });
    (port, task)
}
