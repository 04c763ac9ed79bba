//! Replicas on peers, the I/O seam (`--ckpt-replicas 1`; rules in
//! [`crate::ckpt::memory::replica`], the exchange in [`crate::ckpt::memory::wire`]): the
//! agent's TCP listener on its probe port's number, where its ring predecessor's staged steps
//! arrive ([`receive`]); the shelf of replicas it holds within its budget ([`shelf`]); and the
//! sender of this node's staged steps to its ring neighbour ([`send`]). What happens to a
//! step's replica is told to the agent's loop as a [`Note`].

pub(super) mod error;
pub(super) mod fetch;
mod files;
mod receive;
mod send;
mod shelf;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use drun_rendezvous::Plan;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::ckpt::memory::decide::Key;
use crate::ckpt::memory::remove_under;
use crate::ckpt::memory::replica::{self, Held};
use crate::ckpt::memory::wire::{Offer, OfferFile};
use error::ReplicaError;
use receive::serve;
use send::{offer_to, Target};
pub(super) use shelf::Note;
use shelf::{replica_rate, transfer_limit, Ctx, Shelf};

/// How long a rank's save waits for the replicas released for its room to end arriving.
const ENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Binds a UDP socket (the peer probes) and a TCP listener (replicas) on one port number of
/// `ip`, trying kernel-chosen ports until one is free for both.
///
/// # Errors
/// A bind's error.
pub(in crate::agent) fn bind_pair(
    ip: IpAddr,
) -> std::io::Result<(std::net::UdpSocket, std::net::TcpListener)> {
    let mut last = None;
    for _ in 0..32 {
        let udp = std::net::UdpSocket::bind(SocketAddr::new(ip, 0))?;
        let port = udp.local_addr()?.port();
        match std::net::TcpListener::bind(SocketAddr::new(ip, port)) {
            Ok(tcp) => {
                udp.set_nonblocking(true)?;
                tcp.set_nonblocking(true)?;
                return Ok((udp, tcp));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port")))
}
/// This node's side of replicas: the shelf, the listener's context and the current target.
pub(super) struct Replicas {
    shelf: Shelf,
    ctx: Arc<Ctx>,
    target: Option<Target>,
    notes: mpsc::UnboundedSender<Note>,
    /// Per own step: `Some(true)` verified on the neighbour, `Some(false)` failed, `None`
    /// in flight.
    sent: BTreeMap<Key, Option<bool>>,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for Replicas {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl Replicas {
    /// Starts serving `listener` for run `run_id` as node `me`, keeping replicas under
    /// `stage/.replicas` within `budget`.
    pub(super) fn start(
        listener: std::net::TcpListener,
        run_id: &str,
        me: &str,
        token: Option<String>,
        ckpt_dir: &Path,
        stage: &Path,
        budget: u64,
    ) -> std::io::Result<(Self, mpsc::UnboundedReceiver<Note>)> {
        let listener = TcpListener::from_std(listener)?;
        let root = stage.join(".replicas");
        std::fs::create_dir_all(&root)?;
        let (rate, warning) = replica_rate(std::env::var("DRUN_CKPT_REPLICA_RATE").ok().as_deref());
        if let Some(line) = warning {
            crate::say!("{line}");
        }
        let ctx = Arc::new(Ctx {
            run_id: run_id.to_string(),
            me: me.to_string(),
            token,
            ckpt_dir: ckpt_dir.to_path_buf(),
            root,
            rate,
        });
        let shelf = Shelf::default();
        shelf.lock().budget = budget;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(serve(listener, shelf.clone(), ctx.clone(), tx.clone()));
        Ok((
            Self {
                shelf,
                ctx,
                target: None,
                notes: tx,
                sent: BTreeMap::new(),
                listener: task,
            },
            rx,
        ))
    }

    /// A new generation: replicas go to `plan`'s ring neighbour of this node and are taken from
    /// its ring predecessor only.
    pub(super) fn follow(&mut self, plan: &Plan) {
        let mut members: Vec<_> = plan.members.iter().collect();
        members.sort_by_key(|m| m.node_rank);
        let nodes: Vec<(String, String)> = members
            .iter()
            .map(|m| (m.node_id.clone(), m.advertise_addr.clone()))
            .collect();
        let ids: Vec<String> = nodes.iter().map(|(id, _)| id.clone()).collect();
        self.target = replica::neighbour(&ids, &self.ctx.me)
            .and_then(|n| members.iter().find(|m| m.node_id == n))
            .filter(|m| m.probe_port != 0)
            .map(|m| Target {
                node_id: m.node_id.clone(),
                addr: m.advertise_addr.clone(),
                port: m.probe_port,
                generation: plan.generation,
            });
        self.shelf.lock().generation = Some((plan.generation, nodes));
    }

    /// The staging table's own copies now, and the bytes it holds besides (the ranks' spares or
    /// the room kept for them, fetched files): the receiver's budget counts them.
    pub(super) fn own(&self, own: Vec<Held>, outside: u64) {
        let mut s = self.shelf.lock();
        s.own = own;
        s.outside = outside;
    }

    /// Frees at least `bytes` for this node's own save: drops replicas, oldest first, as
    /// [`replica::oldest_for`] says (one arriving is refused as its last bytes land).
    pub(super) fn free(&self, bytes: u64) {
        let mut s = self.shelf.lock();
        let held: Vec<(Key, u64)> = s.copies.iter().map(|(k, c)| (*k, c.bytes)).collect();
        for k in replica::oldest_for(&held, bytes) {
            if let Some(c) = s.copies.remove(&k) {
                tracing::info!(
                    step = k.0,
                    from = %c.from,
                    "replica released for this node's own checkpoint"
                );
                if !c.complete {
                    s.ending.insert(k);
                }
                remove_under(&c.files, &self.ctx.root);
            }
        }
    }

    /// Once no replica released as it arrived still holds bytes (its receipt ended at its
    /// next bytes and removed them; at most [`ENDING_WAIT`]); `None` when none does.
    pub(super) fn until_settled(&self) -> Option<impl std::future::Future<Output = ()>> {
        let shelf = self.shelf.clone();
        let ended = move || shelf.lock().ending.is_empty();
        (!ended()).then_some(async move {
            let until = tokio::time::Instant::now() + ENDING_WAIT;
            while !ended() && tokio::time::Instant::now() < until {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
    }

    /// Sends this node's staged `files` (final path, staged copy, bytes, rank's digest, rank)
    /// of `key` to the ring neighbour, in the background; `false` when there is none.
    pub(super) fn send(
        &mut self,
        key: Key,
        files: Vec<(String, PathBuf, u64, String, u32)>,
    ) -> bool {
        let Some(t) = self.target.clone().filter(|t| t.generation == key.1) else {
            return false;
        };
        self.sent.insert(key, None);
        let offer = Offer {
            run_id: self.ctx.run_id.clone(),
            generation: key.1,
            step: key.0,
            from: self.ctx.me.clone(),
            files: files
                .iter()
                .map(|(path, _, bytes, digest, rank)| OfferFile {
                    path: path.clone(),
                    bytes: *bytes,
                    digest: digest.clone(),
                    rank: Some(*rank),
                })
                .collect(),
            mac: String::new(),
        };
        let paths: Vec<String> = offer.files.iter().map(|f| f.path.clone()).collect();
        let staged: Vec<PathBuf> = files.into_iter().map(|(_, s, _, _, _)| s).collect();
        let token = self.ctx.token.clone();
        let rate = self.ctx.rate;
        let notes = self.notes.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let limit = transfer_limit(offer.bytes());
            let result = match tokio::time::timeout(
                limit,
                offer_to(&t, offer, &staged, token, rate),
            )
            .await
            {
                Ok(r) => {
                    r.map(|digests| (started.elapsed(), paths.into_iter().zip(digests).collect()))
                }
                Err(_) => Err(ReplicaError::NoAnswer { limit }),
            };
            let _ = notes.send(Note::Sent {
                key,
                to: t.node_id,
                result,
            });
        });
        true
    }

    /// The outcome of a send: recorded for `status`.
    pub(super) fn sent(&mut self, key: Key, ok: bool) {
        if let Some(s) = self.sent.get_mut(&key) {
            *s = Some(ok);
        }
    }

    /// Forgets what was sent of a step this node no longer holds.
    pub(super) fn forget(&mut self, key: Key) {
        self.sent.remove(&key);
    }

    /// Per own step: verified on the neighbour (`Some(true)`), failed, or in flight.
    pub(super) fn sent_state(&self, key: Key) -> Option<Option<bool>> {
        self.sent.get(&key).copied()
    }

    /// The replicas held, complete and with their ranks, as a join reports them (a resume
    /// after a node loss may fetch them).
    pub(super) fn held_steps(&self) -> Vec<drun_rendezvous::HeldStep> {
        let s = self.shelf.lock();
        s.copies
            .iter()
            .filter(|(_, c)| c.complete && !c.held.is_empty())
            .map(|((step, g), c)| drun_rendezvous::HeldStep {
                step: *step,
                generation: *g,
                saved_by: c.from.clone(),
                world_size: None,
                cursor: None,
                files: c.held.clone(),
                staged_at_ms: None,
            })
            .collect()
    }

    /// The replicas held (complete ones): for `status`, and their bytes.
    pub(super) fn held(&self) -> (Vec<serde_json::Value>, u64) {
        let s = self.shelf.lock();
        let list = s
            .copies
            .iter()
            .filter(|(_, c)| c.complete)
            .map(|((step, g), c)| {
                serde_json::json!({"step": step, "generation": g, "from": c.from, "bytes": c.bytes})
            })
            .collect();
        (list, s.copies.values().map(|c| c.bytes).sum())
    }
}
/// The next note, or never without replicas.
pub(super) async fn next(rx: &mut Option<mpsc::UnboundedReceiver<Note>>) -> Option<Note> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
