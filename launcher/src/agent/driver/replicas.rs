//! Replicas on peers, the I/O seam (`--ckpt-replicas 1`; rules in
//! [`crate::ckpt::memory::replica`], the exchange in [`crate::ckpt::memory::wire`]): the
//! agent's TCP listener on its probe port's number, where its ring predecessor's staged steps
//! arrive; the shelf of replicas it holds within its budget; and the sender of this node's
//! staged steps to its ring neighbour. What happens to a step's replica is told to the agent's
//! loop as a [`Note`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drun_rendezvous::Plan;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::ckpt::memory::decide::Key;
use crate::ckpt::memory::replica::{self, Fit, Held};
use crate::ckpt::memory::staged_path;
use crate::ckpt::memory::wire::{judge, Offer, OfferFile, Receiver, MAX_OFFER, NONCE_BYTES};

/// The longest a transfer may take: this much plus a second per [`SLOWEST`] bytes.
const TRANSFER_BASE: Duration = Duration::from_secs(30);
/// The slowest link a transfer is given time for, bytes per second.
const SLOWEST: u64 = 20 << 20;
/// Copy buffer.
const CHUNK: usize = 1 << 20;

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

/// What the loop hears about replicas.
#[derive(Debug)]
pub(super) enum Note {
    /// This node's step `key` was sent to `to`: verified there, or why not.
    Sent {
        key: Key,
        to: String,
        result: Result<Duration, String>,
    },
    /// A replica of `from`'s step `key` is held here, verified.
    Received { key: Key, from: String },
    /// To take a replica, these persisted own copies go (the replica rule's choice).
    ReleaseOwn(Vec<Key>),
}

/// One replica held here.
#[derive(Debug)]
struct Copy {
    from: String,
    bytes: u64,
    files: Vec<PathBuf>,
    /// Every file arrived and was verified.
    complete: bool,
}

#[derive(Debug, Default)]
struct ShelfState {
    /// The generation followed and its nodes (id, advertised address) in node-rank order.
    generation: Option<(u64, Vec<(String, String)>)>,
    budget: u64,
    /// This node's own copies, as the staging table last said.
    own: Vec<Held>,
    copies: BTreeMap<Key, Copy>,
}

/// The replicas this node holds, shared by its listener and its staging driver.
#[derive(Debug, Clone, Default)]
struct Shelf(Arc<Mutex<ShelfState>>);

impl Shelf {
    fn lock(&self) -> std::sync::MutexGuard<'_, ShelfState> {
        self.0.lock().expect("replica shelf lock")
    }
}

/// Who this node's replicas go to.
#[derive(Debug, Clone)]
struct Target {
    node_id: String,
    addr: String,
    port: u16,
    generation: u64,
}

/// The fixed part of the exchange.
#[derive(Debug)]
struct Ctx {
    run_id: String,
    me: String,
    token: Option<String>,
    ckpt_dir: PathBuf,
    /// Where replicas are kept: `<staging dir>/.replicas`, mirroring `--ckpt-dir`.
    root: PathBuf,
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
        let ctx = Arc::new(Ctx {
            run_id: run_id.to_string(),
            me: me.to_string(),
            token,
            ckpt_dir: ckpt_dir.to_path_buf(),
            root,
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

    /// The staging table's own copies now (for the receiver's budget).
    pub(super) fn own(&self, own: Vec<Held>) {
        self.shelf.lock().own = own;
    }

    /// Makes room for this node's own save of `incoming` bytes beside `own_held`: drops
    /// replicas, oldest first, as [`replica::make_room_for_own`] says.
    pub(super) fn make_room(&self, own_held: u64, incoming: u64) {
        let mut s = self.shelf.lock();
        let held: Vec<(Key, u64)> = s.copies.iter().map(|(k, c)| (*k, c.bytes)).collect();
        for k in replica::make_room_for_own(&held, s.budget, own_held, incoming) {
            if let Some(c) = s.copies.remove(&k) {
                tracing::info!(
                    step = k.0,
                    from = %c.from,
                    "replica released for this node's own checkpoint"
                );
                remove(&c.files, &self.ctx.root);
            }
        }
    }

    /// Sends this node's staged `files` (final path, staged copy, bytes, rank's digest) of
    /// `key` to the ring neighbour, in the background; `false` when there is none.
    pub(super) fn send(&mut self, key: Key, files: Vec<(String, PathBuf, u64, String)>) -> bool {
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
                .map(|(path, _, bytes, sha256)| OfferFile {
                    path: path.clone(),
                    bytes: *bytes,
                    sha256: sha256.clone(),
                })
                .collect(),
            mac: String::new(),
        };
        let staged: Vec<PathBuf> = files.into_iter().map(|(_, s, _, _)| s).collect();
        let token = self.ctx.token.clone();
        let notes = self.notes.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let limit = TRANSFER_BASE + Duration::from_secs(offer.bytes() / SLOWEST);
            let result =
                match tokio::time::timeout(limit, offer_to(&t, offer, &staged, token)).await {
                    Ok(r) => r.map(|()| started.elapsed()),
                    Err(_) => Err(format!("no answer within {} s", limit.as_secs())),
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

/// The connection's next line, trimmed.
async fn line(conn: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut l = String::new();
    conn.read_line(&mut l)
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    Ok(l.trim_end().to_string())
}

/// Offers `offer` to `t` and streams `staged` when taken.
async fn offer_to(
    t: &Target,
    mut offer: Offer,
    staged: &[PathBuf],
    token: Option<String>,
) -> Result<(), String> {
    let addr = tokio::net::lookup_host((t.addr.as_str(), t.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", t.addr))?
        .next()
        .ok_or_else(|| format!("{} resolves to nothing", t.addr))?;
    let conn = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let mut conn = BufReader::new(conn);
    let mut nonce = [0u8; NONCE_BYTES];
    conn.read_exact(&mut nonce)
        .await
        .map_err(|e| format!("no nonce from {addr}: {e}"))?;
    offer.sign(token.as_deref(), &nonce);
    let w = |e: std::io::Error| format!("sending to {addr}: {e}");
    conn.get_mut().write_all(&offer.encode()).await.map_err(w)?;
    let answer = line(&mut conn).await?;
    if answer != "take" {
        return Err(answer);
    }
    let mut buf = vec![0u8; CHUNK];
    for (f, path) in offer.files.iter().zip(staged) {
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| format!("cannot read the staged copy {}: {e}", path.display()))?;
        let mut hash = Sha256::new();
        let mut left = f.bytes;
        while left > 0 {
            let n = file
                .read(&mut buf[..CHUNK.min(left as usize)])
                .await
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            if n == 0 {
                return Err(format!(
                    "{} is shorter than its {} bytes",
                    path.display(),
                    f.bytes
                ));
            }
            hash.update(&buf[..n]);
            conn.get_mut().write_all(&buf[..n]).await.map_err(w)?;
            left -= n as u64;
        }
        conn.get_mut()
            .write_all(&hash.finalize())
            .await
            .map_err(w)?;
    }
    conn.get_mut().flush().await.map_err(w)?;
    match line(&mut conn).await? {
        ok if ok == "ok" => Ok(()),
        bad => Err(bad),
    }
}

/// Accepts the predecessor's offers, one task per connection.
async fn serve(
    listener: TcpListener,
    shelf: Shelf,
    ctx: Arc<Ctx>,
    notes: mpsc::UnboundedSender<Note>,
) {
    loop {
        let Ok((conn, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (shelf, ctx, notes) = (shelf.clone(), ctx.clone(), notes.clone());
        tokio::spawn(async move {
            if let Err(why) = receive(conn, peer, &shelf, &ctx, &notes).await {
                tracing::warn!(%peer, "a replica was not taken: {why}");
            }
        });
    }
}

/// A random nonce.
fn nonce() -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut n);
    }
    n
}

/// One offer: judged, fitted to the budget, received and verified, or refused.
async fn receive(
    conn: TcpStream,
    peer: SocketAddr,
    shelf: &Shelf,
    ctx: &Ctx,
    notes: &mpsc::UnboundedSender<Note>,
) -> Result<(), String> {
    let mut conn = BufReader::new(conn);
    let nonce = nonce();
    let io = |e: std::io::Error| format!("connection from {peer}: {e}");
    conn.get_mut().write_all(&nonce).await.map_err(io)?;
    let len = conn.read_u32().await.map_err(io)?;
    if len > MAX_OFFER {
        return Err(format!("an offer of {len} bytes is more than {MAX_OFFER}"));
    }
    let mut header = vec![0u8; len as usize];
    conn.read_exact(&mut header).await.map_err(io)?;
    let offer: Offer = serde_json::from_slice(&header).map_err(|e| format!("not an offer: {e}"))?;
    let key = (offer.step, offer.generation);
    let taken = take(&offer, key, peer.ip(), &nonce, shelf, ctx);
    let release_own = match taken {
        Ok(r) => r,
        Err(why) => {
            let _ = conn
                .get_mut()
                .write_all(format!("refused: {why}\n").as_bytes())
                .await;
            return Err(why);
        }
    };
    if !release_own.is_empty() {
        let _ = notes.send(Note::ReleaseOwn(release_own));
    }
    conn.get_mut().write_all(b"take\n").await.map_err(io)?;
    let mut files = Vec::new();
    let got = read_files(&mut conn, &offer, ctx, &mut files).await;
    match got {
        Ok(()) => {
            if let Some(c) = shelf.lock().copies.get_mut(&key) {
                c.files = files;
                c.complete = true;
            }
            conn.get_mut().write_all(b"ok\n").await.map_err(io)?;
            let _ = notes.send(Note::Received {
                key,
                from: offer.from,
            });
            Ok(())
        }
        Err(why) => {
            shelf.lock().copies.remove(&key);
            remove(&files, &ctx.root);
            let _ = conn
                .get_mut()
                .write_all(format!("bad: {why}\n").as_bytes())
                .await;
            Err(why)
        }
    }
}

/// Judges `offer` and reserves its room on the shelf: the own persisted copies to release for
/// it, or why it is refused.
fn take(
    offer: &Offer,
    key: Key,
    peer: IpAddr,
    nonce: &[u8],
    shelf: &Shelf,
    ctx: &Ctx,
) -> Result<Vec<Key>, String> {
    let mut s = shelf.lock();
    let nodes = s.generation.as_ref().map(|(g, n)| (*g, n.as_slice()));
    judge(
        offer,
        &Receiver {
            run_id: &ctx.run_id,
            generation: nodes,
            me: &ctx.me,
            peer,
            token: ctx.token.as_deref(),
            nonce,
            ckpt_dir: &ctx.ckpt_dir,
        },
    )?;
    if s.copies.contains_key(&key) {
        return Err(format!("step {} is held here already", key.0));
    }
    let mut held: Vec<Held> = s.own.clone();
    held.extend(s.copies.iter().map(|(k, c)| Held {
        key: *k,
        bytes: c.bytes,
        replica: true,
        persisted: false,
    }));
    let release = match replica::release(&held, s.budget, key, offer.bytes()) {
        Fit::Take { release } => release,
        Fit::Refuse { reason } => return Err(reason),
    };
    let mut own = Vec::new();
    for k in release {
        match s.copies.remove(&k) {
            Some(c) => remove(&c.files, &ctx.root),
            None => own.push(k),
        }
    }
    s.copies.insert(
        key,
        Copy {
            from: offer.from.clone(),
            bytes: offer.bytes(),
            files: Vec::new(),
            complete: false,
        },
    );
    Ok(own)
}

/// Reads each file of `offer` and its digest, writing it under `ctx.root`.
async fn read_files(
    conn: &mut BufReader<TcpStream>,
    offer: &Offer,
    ctx: &Ctx,
    files: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let mut buf = vec![0u8; CHUNK];
    for f in &offer.files {
        let dest = staged_path(&ctx.root, &ctx.ckpt_dir, Path::new(&f.path))
            .ok_or_else(|| format!("'{}' is not inside --ckpt-dir", f.path))?;
        if let Some(d) = dest.parent() {
            tokio::fs::create_dir_all(d)
                .await
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let mut out = tokio::fs::File::create(&dest)
            .await
            .map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
        files.push(dest.clone());
        let mut hash = Sha256::new();
        let mut left = f.bytes;
        while left > 0 {
            let n = conn
                .read(&mut buf[..CHUNK.min(left as usize)])
                .await
                .map_err(|e| format!("reading {}: {e}", f.path))?;
            if n == 0 {
                return Err(format!("{} ended before its {} bytes", f.path, f.bytes));
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n])
                .await
                .map_err(|e| format!("writing {}: {e}", dest.display()))?;
            left -= n as u64;
        }
        // tokio's file writes in the background: the bytes are in the file once flushed.
        out.flush()
            .await
            .map_err(|e| format!("writing {}: {e}", dest.display()))?;
        let mut digest = [0u8; 32];
        conn.read_exact(&mut digest)
            .await
            .map_err(|e| format!("reading the digest of {}: {e}", f.path))?;
        let got = hash.finalize();
        if got.as_slice() != digest {
            return Err(format!(
                "{}: the bytes received do not match the sender's SHA-256",
                f.path
            ));
        }
        let got = crate::ckpt::verify::hex(&got);
        if !f.sha256.is_empty() && f.sha256 != got {
            return Err(format!(
                "{}: SHA-256 {got}, the rank's is {}",
                f.path, f.sha256
            ));
        }
    }
    Ok(())
}

/// Removes `files` and the directories under `root` they leave empty.
fn remove(files: &[PathBuf], root: &Path) {
    for f in files {
        let _ = std::fs::remove_file(f);
        let mut dir = f.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(root) && *d != root) {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
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
