//! Receives the ring predecessor's staged steps (`--ckpt-replicas`): each offer judged
//! ([`crate::ckpt::memory::wire::judge::judge`]), fitted to the budget
//! ([`crate::ckpt::memory::replica::release`]), read and verified by digest, or refused.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::error::ReplicaError;
use super::files::{read_files, tell};
use super::shelf::{transfer_limit, Copy, Ctx, Note, Shelf};
use crate::ckpt::memory::remove_under;

use crate::ckpt::memory::decide::Key;
use crate::ckpt::memory::replica::{self, Fit, Held};
use crate::ckpt::memory::wire::judge::{judge, Receiver};
use crate::ckpt::memory::wire::{decode, Header, Offer, MAX_OFFER, NONCE_BYTES};

/// How long a connection may take to send its offer.
pub(super) const OFFER_WAIT: Duration = Duration::from_secs(10);

/// How long a taken replica waits for this node's copies released to make its room (the
/// agent's loop frees them) before its bytes are asked for.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Accepts the predecessor's offers, one task per connection.
pub(super) async fn serve(
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
pub(super) fn nonce() -> [u8; NONCE_BYTES] {
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
) -> Result<(), ReplicaError> {
    let mut conn = BufReader::new(conn);
    let nonce = nonce();
    let io = |source| ReplicaError::Connection { peer, source };
    conn.get_mut().write_all(&nonce).await.map_err(io)?;
    // A connection that sends no offer holds nothing for long.
    let header = tokio::time::timeout(OFFER_WAIT, async {
        let len = conn.read_u32().await.map_err(io)?;
        if len > MAX_OFFER {
            return Err(ReplicaError::TooLong { bytes: len });
        }
        let mut header = vec![0u8; len as usize];
        conn.read_exact(&mut header).await.map_err(io)?;
        Ok(header)
    })
    .await
    .map_err(|_| ReplicaError::NoOffer {
        peer,
        waited: OFFER_WAIT,
    })??;
    let offer = match decode(&header)? {
        Header::Offer(o) => o,
        Header::Fetch(f) => return super::fetch::serve(conn, peer, f, &nonce, shelf, ctx).await,
    };
    let key = (offer.step, offer.generation);
    let taken = take(&offer, key, peer.ip(), &nonce, shelf, ctx);
    let release_own = match taken {
        Ok(r) => r,
        Err(why) => {
            tell(&mut conn, "refused", &why).await;
            return Err(why);
        }
    };
    if !release_own.is_empty() {
        // The replica's bytes come once this node's copies made room for it: the budget is
        // never passed while both are in memory.
        let _ = notes.send(Note::ReleaseOwn(release_own.clone()));
        let released = || {
            let s = shelf.lock();
            !s.own.iter().any(|h| release_own.contains(&h.key))
        };
        let until = tokio::time::Instant::now() + RELEASE_WAIT;
        while !released() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut files = Vec::new();
    // The room reserved for it goes again unless every byte arrives, in time, verified.
    let limit = transfer_limit(offer.bytes());
    let got = match conn.get_mut().write_all(b"take\n").await {
        Err(e) => Err(io(e)),
        Ok(()) => {
            // Released for this node's own save as it arrives: it ends there.
            let wanted_still = || match shelf.lock().copies.contains_key(&key) {
                true => Ok(()),
                false => Err(released(key)),
            };
            read_files(
                limit,
                &mut conn,
                &offer.files,
                (&ctx.root, &ctx.ckpt_dir),
                &mut files,
                &wanted_still,
            )
            .await
        }
    };
    match got {
        Ok(digests) => {
            // What a resume after a node loss may ask of this copy: each file with its rank
            // and the digest verified on receipt (a file without a rank: none of it).
            let held = offer
                .files
                .iter()
                .zip(digests)
                .map(|(f, digest)| {
                    f.rank.map(|rank| drun_rendezvous::ShardFile {
                        rank,
                        path: f.path.clone(),
                        bytes: f.bytes,
                        digest,
                    })
                })
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default();
            let kept = match shelf.lock().copies.get_mut(&key) {
                Some(c) => {
                    c.files = std::mem::take(&mut files);
                    c.complete = true;
                    c.held = held;
                    true
                }
                None => false,
            };
            if !kept {
                // Released as its last bytes arrived: nothing of it stays.
                remove_under(&files, &ctx.root);
                shelf.lock().ending.remove(&key);
                let why = released(key);
                tell(&mut conn, "refused", &why).await;
                return Err(why);
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
            remove_under(&files, &ctx.root);
            shelf.lock().ending.remove(&key);
            let kind = match why {
                ReplicaError::NoRoom { .. } => "refused",
                _ => "bad",
            };
            tell(&mut conn, kind, &why).await;
            Err(why)
        }
    }
}

/// Why a replica taken was not kept: this node's own save took its room as it arrived.
fn released(key: Key) -> ReplicaError {
    ReplicaError::NoRoom {
        reason: format!(
            "the replica of step {} was released as it arrived: this node's own checkpoint took its room",
            key.0
        ),
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
) -> Result<Vec<Key>, ReplicaError> {
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
        return Err(ReplicaError::HeldAlready { step: key.0 });
    }
    let mut held: Vec<Held> = s.own.clone();
    held.extend(s.copies.iter().map(|(k, c)| Held {
        key: *k,
        bytes: c.bytes,
        replica: true,
        persisted: false,
    }));
    let release = match replica::release(&held, s.outside, s.budget, key, offer.bytes()) {
        Fit::Take { release } => release,
        Fit::Refuse { reason } => return Err(ReplicaError::NoRoom { reason }),
    };
    let mut own = Vec::new();
    for k in release {
        match s.copies.remove(&k) {
            Some(c) => remove_under(&c.files, &ctx.root),
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
            held: Vec::new(),
        },
    );
    Ok(own)
}
