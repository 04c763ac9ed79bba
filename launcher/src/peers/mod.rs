//! Peer probes: the agents of a generation ask one another, directly, whether they still reach
//! each other, on the address their workers use.
//!
//! # Theory of operation
//!
//! Every agent of a multi-node run binds one UDP socket at start ([`Prober::start`]) and
//! advertises its port with its candidacy (`Candidate.probe_port`, carried into the plan's
//! members). While a generation runs, the agent sends a 30-byte probe every [`PROBE_EVERY`] to
//! each other member — every pair up to [`ALL_PAIRS_UP_TO`] nodes, its two ring neighbours on
//! each side beyond — and answers every probe of its run it receives. The answers land in a pure
//! [`table::Table`]; [`PeerHealth::verdict`] judges them at an instant: every peer answered
//! within [`QUIET`], or these peers are silent.
//!
//! The gRPC link uses the verdict when the rendezvous server goes quiet for a whole lease TTL:
//! an agent whose peers all answer keeps its generation and its workers (the control plane is
//! gone for everyone, not this node alone; see `docs/architecture.md`, "Control-plane outages");
//! an agent that reaches neither fences itself, as before.
//!
//! The agent reports silent peers to the rendezvous as soon as it judges them silent. The silent
//! node's own session then asks that node's agent to answer and gives the node up when it does
//! not (`drun_rendezvous::session`, the silence rule), so a pulled cable or a hung host costs
//! about [`QUIET`] and half a second, not a lease TTL; peers that cannot reach each other while
//! both still reach the server are left to the partition rule.
//!
//! What a probe does not see: the workers' collectives may use another fabric (InfiniBand,
//! NVLink, RoCE through NCCL) that a TCP/IP probe on the agent's address does not cross.
//! Cost: [`PROBE_BYTES`] bytes each way per peer per [`PROBE_EVERY`] (with 8 nodes: 7 peers,
//! 2 × 7 × 30 B / 0.2 s = 2.1 KB/s sent per node; beyond 32 nodes at most 4 peers, 1.2 KB/s);
//! `cargo bench --bench probes` measures it, and the CPU: 0.04 % of a core per node at 8 nodes,
//! 0.07 % at 32.

pub mod table;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drun_rendezvous::Plan;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use table::{Peer, Table, Verdict};

/// How often each peer is probed.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);
/// A peer that has not answered for this long is silent (reported; the session then asks the
/// silent node's agent whether it is there before giving the node up).
pub const QUIET: Duration = Duration::from_secs(1);
/// A peer counts as silent only after this many of this node's probes went unanswered (a
/// quiet limit's worth): a node whose own probing stalled blames nobody.
pub const MIN_UNANSWERED: u32 = (QUIET.as_millis() / PROBE_EVERY.as_millis()) as u32;
/// Up to this many nodes every pair is probed; beyond, ring neighbours only.
pub const ALL_PAIRS_UP_TO: usize = 32;
pub use drun_rendezvous::probe::PROBE_BYTES;
use drun_rendezvous::probe::{run_tag, Message};

/// The members this node probes, as (node rank, address, probe port), from `plan`.
fn probed_members(plan: &Plan, node_id: &str) -> (u32, Vec<(u32, String, u16)>, bool) {
    let Some(me) = plan.member(node_id) else {
        return (0, Vec::new(), false);
    };
    let n = plan.members.len();
    let mine = me.node_rank as usize;
    let near = |r: usize| {
        let d = r.abs_diff(mine);
        n <= ALL_PAIRS_UP_TO || d.min(n - d) <= 2
    };
    let others: Vec<_> = plan
        .members
        .iter()
        .filter(|m| m.node_id != node_id && near(m.node_rank as usize))
        .collect();
    let unprobeable = others.iter().any(|m| m.probe_port == 0);
    let list = others
        .iter()
        .filter(|m| m.probe_port != 0)
        .map(|m| (m.node_rank, m.advertise_addr.clone(), m.probe_port))
        .collect();
    (me.node_rank, list, unprobeable)
}

/// What the probes say, shared with the rendezvous link, and whether the agent holds on to its
/// generation (the agent's word: its workers train it, or their failure waits for the job's
/// decision; only then is there a generation to keep through an outage).
#[derive(Debug, Clone, Default)]
pub struct PeerHealth(Arc<Mutex<Table>>, Arc<std::sync::atomic::AtomicBool>);

impl PeerHealth {
    /// The agent says whether it holds on to its generation now.
    pub fn set_keeps_generation(&self, keeps: bool) {
        self.1.store(keeps, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the agent holds on to its generation now: its workers train it, or it reports
    /// their failure.
    pub fn keeps_generation(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The verdict at `now` (see [`Table::verdict`]).
    pub fn verdict(&self, now: Instant) -> Verdict {
        self.0
            .lock()
            .expect("peer table lock")
            .verdict(now, QUIET, MIN_UNANSWERED)
    }

    /// Whether every probed peer answered within [`QUIET`] of `now` (none probed: true). Stricter
    /// than [`Self::verdict`]'s [`Verdict::AllAnswer`], which gives a peer that never answered the
    /// benefit of the doubt: a node standing by joins only on answers.
    pub fn all_heard(&self, now: Instant) -> bool {
        self.0
            .lock()
            .expect("peer table lock")
            .all_heard(now, QUIET)
    }

    /// How many peers are watched.
    pub fn peer_count(&self) -> usize {
        self.0.lock().expect("peer table lock").targets().len()
    }

    /// The generation whose peers are watched (0: none).
    pub fn generation(&self) -> u64 {
        self.0.lock().expect("peer table lock").generation()
    }
}

/// Control messages to the probe task.
enum Control {
    /// Probe the members of this plan.
    Follow(Box<Plan>),
    /// Standing by after generation `.0`: probe these nodes (node id, address, probe port).
    Watch(u64, Vec<(String, String, u16)>),
    /// Stop probing (between generations).
    Clear,
}

/// The probe task of this agent: its socket's port, the shared verdict, and its control.
pub struct Prober {
    port: u16,
    health: PeerHealth,
    control: mpsc::UnboundedSender<Control>,
    task: tokio::task::JoinHandle<()>,
}

impl Prober {
    /// Binds the probe socket on `ip` (port chosen by the kernel) and starts answering and
    /// probing for run `run_id` as node `node_id`.
    ///
    /// # Errors
    /// The bind's error.
    pub async fn start(ip: IpAddr, run_id: &str, node_id: &str) -> std::io::Result<Prober> {
        Self::start_on(
            UdpSocket::bind(SocketAddr::new(ip, 0)).await?,
            run_id,
            node_id,
        )
    }

    /// The same on a socket already bound (its port shared with a TCP listener of the agent:
    /// `--ckpt-replicas`).
    ///
    /// # Errors
    /// The socket's address cannot be read.
    pub fn start_on(socket: UdpSocket, run_id: &str, node_id: &str) -> std::io::Result<Prober> {
        let port = socket.local_addr()?.port();
        let health = PeerHealth::default();
        let (control, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(probe_loop(
            socket,
            run_tag(run_id),
            node_id.to_string(),
            health.clone(),
            rx,
        ));
        Ok(Prober {
            port,
            health,
            control,
            task,
        })
    }

    /// The UDP port peers probe.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The shared verdict.
    pub fn health(&self) -> PeerHealth {
        self.health.clone()
    }

    /// Probes the other members of `plan` from now on.
    pub fn follow(&self, plan: &Plan) {
        let _ = self.control.send(Control::Follow(Box::new(plan.clone())));
    }

    /// Standing by after generation `after` (sent away by a partition): probes `reach`, the
    /// nodes its session says it must reach before it joins again, from now on.
    pub fn watch(&self, after: u64, reach: &[drun_rendezvous::session::standby::Reach]) {
        let nodes = reach
            .iter()
            .map(|r| (r.node_id.clone(), r.advertise_addr.clone(), r.probe_port))
            .collect();
        let _ = self.control.send(Control::Watch(after, nodes));
    }

    /// Stops probing until the next plan.
    pub fn clear(&self) {
        let _ = self.control.send(Control::Clear);
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers every probe of the run, probes the followed generation's peers every
/// [`PROBE_EVERY`], and records their answers in `health`.
async fn probe_loop(
    socket: UdpSocket,
    tag: u64,
    node_id: String,
    health: PeerHealth,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut my_rank = 0u32;
    let mut seq = 0u32;
    let mut buf = [0u8; 64];
    loop {
        tokio::select! {
            c = control.recv() => match c {
                None => return,
                Some(Control::Clear) => health.0.lock().expect("peer table lock").clear(),
                Some(Control::Follow(plan)) => {
                    let (rank, members, unprobeable) = probed_members(&plan, &node_id);
                    my_rank = rank;
                    let (peers, unresolved) = resolve(members).await;
                    health.0.lock().expect("peer table lock").follow(
                        plan.generation,
                        peers,
                        unprobeable || unresolved,
                        Instant::now(),
                    );
                }
                Some(Control::Watch(after, nodes)) => {
                    // Node ranks of the generation this node is not in mean nothing here.
                    let (peers, _) = resolve(nodes.into_iter().map(|(_, a, p)| (0, a, p)).collect()).await;
                    health.0.lock().expect("peer table lock").follow(after, peers, false, Instant::now());
                }
            },
            r = socket.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                let Some(m) = Message::decode(&buf[..n]).filter(|m| m.run_tag == tag) else {
                    continue;
                };
                if m.answer {
                    health.0.lock().expect("peer table lock").answered(m.generation, from, Instant::now());
                } else {
                    let answer = Message { answer: true, node_rank: my_rank, ..m };
                    let _ = socket.send_to(&answer.encode(), from).await;
                }
            }
            _ = tick.tick() => {
                let (generation, targets) = {
                    let mut t = health.0.lock().expect("peer table lock");
                    t.sent();
                    (t.generation(), t.targets())
                };
                seq = seq.wrapping_add(1);
                let probe = Message { answer: false, run_tag: tag, generation, node_rank: my_rank, seq }.encode();
                for p in targets {
                    // A path that is down answers with an error at once; the silence is the signal.
                    let _ = socket.send_to(&probe, p.addr).await;
                }
            }
        }
    }
}

/// The probe addresses of `members` (node rank, host, probe port), IPv4 only as the probe socket
/// and the workers' store are; true when some member could not be resolved (not probed).
async fn resolve(members: Vec<(u32, String, u16)>) -> (Vec<Peer>, bool) {
    let mut peers = Vec::new();
    let mut unresolved = false;
    for (node_rank, host, port) in members {
        match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(mut a) => match a.find(SocketAddr::is_ipv4) {
                Some(addr) => peers.push(Peer { node_rank, addr }),
                None => {
                    unresolved = true;
                    tracing::debug!(%host, "a peer's address has no IPv4 address; not probed");
                }
            },
            Err(e) => {
                unresolved = true;
                tracing::debug!(%host, error = %e, "cannot resolve a peer's address; not probed");
            }
        }
    }
    (peers, unresolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn two_probers_of_a_generation_hear_each_other_and_a_stopped_one_falls_silent() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let a = Prober::start(ip, "run", "a").await.unwrap();
        let b = Prober::start(ip, "run", "b").await.unwrap();
        let node = |id: &str, port: u16| drun_rendezvous::Candidate {
            node_id: id.into(),
            advertise_addr: "127.0.0.1".into(),
            slots: 1,
            requested_node_rank: None,
            master_port: 1,
            probe_port: port,
        };
        let plan =
            drun_rendezvous::assign("run", 4, &[node("a", a.port()), node("b", b.port())], 0, 0)
                .unwrap();
        a.follow(&plan);
        b.follow(&plan);
        let deadline = Instant::now() + Duration::from_secs(5);
        while a.health().verdict(Instant::now()) != Verdict::AllAnswer
            || b.health().verdict(Instant::now()) != Verdict::AllAnswer
        {
            assert!(
                Instant::now() < deadline,
                "the probers never heard each other"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(b);
        // Generous: a loaded machine (the whole test suite at once) delays the probe ticks.
        let deadline = Instant::now() + QUIET + Duration::from_secs(15);
        while a.health().verdict(Instant::now()) != Verdict::Silent(vec![1]) {
            assert!(
                Instant::now() < deadline,
                "the stopped peer never fell silent"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
