//! Sends one staged step to the ring neighbour's agent (`--ckpt-replicas`; the exchange in
//! [`crate::ckpt::memory::wire`]).

use std::path::PathBuf;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::error::ReplicaError;
use super::shelf::CHUNK;
use crate::ckpt::digest::Hasher;
use crate::ckpt::memory::pace::pause;
use crate::ckpt::memory::wire::{Offer, OfferFile, NONCE_BYTES};

/// Who this node's replicas go to.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) node_id: String,
    pub(super) addr: String,
    pub(super) port: u16,
    pub(super) generation: u64,
}
/// The connection's next line, trimmed.
pub(super) async fn line(conn: &mut BufReader<TcpStream>) -> Result<String, ReplicaError> {
    let mut l = String::new();
    conn.read_line(&mut l).await.map_err(ReplicaError::Answer)?;
    Ok(l.trim_end().to_string())
}

/// Connects to a peer agent's replica port and reads its nonce.
pub(super) async fn open(
    host: &str,
    port: u16,
) -> Result<
    (
        BufReader<TcpStream>,
        [u8; NONCE_BYTES],
        std::net::SocketAddr,
    ),
    ReplicaError,
> {
    let addr = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| ReplicaError::Resolve {
            host: host.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| ReplicaError::Unresolved {
            host: host.to_string(),
        })?;
    let conn = TcpStream::connect(addr)
        .await
        .map_err(|source| ReplicaError::Connect { addr, source })?;
    let mut conn = BufReader::new(conn);
    let mut nonce = [0u8; NONCE_BYTES];
    conn.read_exact(&mut nonce)
        .await
        .map_err(|source| ReplicaError::NoNonce { addr, source })?;
    Ok((conn, nonce, addr))
}

/// Offers `offer` to `t` and streams `staged` when taken, at no more than `rate` bytes per
/// second (`0`: no limit); the digest of each file as sent (the neighbour verified it before
/// its `ok`).
pub(super) async fn offer_to(
    t: &Target,
    mut offer: Offer,
    staged: &[PathBuf],
    token: Option<String>,
    rate: u64,
) -> Result<Vec<String>, ReplicaError> {
    let (mut conn, nonce, addr) = open(&t.addr, t.port).await?;
    offer.sign(token.as_deref(), &nonce);
    let w = |source| ReplicaError::Send {
        to: addr.to_string(),
        source,
    };
    conn.get_mut().write_all(&offer.encode()).await.map_err(w)?;
    let answer = line(&mut conn).await?;
    if answer != "take" {
        return Err(ReplicaError::Answered { answer });
    }
    let digests = stream_files(
        conn.get_mut(),
        &offer.files,
        staged,
        &addr.to_string(),
        rate,
    )
    .await?;
    match line(&mut conn).await? {
        ok if ok == "ok" => Ok(digests),
        answer => Err(ReplicaError::Answered { answer }),
    }
}

/// Streams each of `files` from its `staged` copy to `conn`, each followed by the digest of
/// the bytes sent (32 bytes), then flushes; `to` names the other end in errors. No more than
/// `rate` bytes per second go out (`0`: no limit; [`pause`] after each chunk). Returns those
/// digests, as a manifest spells them.
pub(super) async fn stream_files(
    conn: &mut TcpStream,
    files: &[OfferFile],
    staged: &[PathBuf],
    to: &str,
    rate: u64,
) -> Result<Vec<String>, ReplicaError> {
    let w = |source| ReplicaError::Send {
        to: to.to_string(),
        source,
    };
    let mut buf = vec![0u8; CHUNK];
    let mut digests = Vec::with_capacity(files.len());
    let began = std::time::Instant::now();
    let mut sent = 0u64;
    for (f, path) in files.iter().zip(staged) {
        let mut file =
            tokio::fs::File::open(path)
                .await
                .map_err(|source| ReplicaError::Staged {
                    path: path.clone(),
                    source,
                })?;
        // The rank's function when it gave a digest (the receiver checks it), else the agent's.
        let mut hash = Hasher::like(&f.digest);
        let mut left = f.bytes;
        while left > 0 {
            let n = file
                .read(&mut buf[..CHUNK.min(left as usize)])
                .await
                .map_err(|source| ReplicaError::Read {
                    path: path.clone(),
                    source,
                })?;
            if n == 0 {
                return Err(ReplicaError::Short {
                    path: path.clone(),
                    bytes: f.bytes,
                });
            }
            hash.update(&buf[..n]);
            conn.write_all(&buf[..n]).await.map_err(w)?;
            left -= n as u64;
            sent += n as u64;
            let wait = pause(sent, began.elapsed(), rate);
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        let digest = hash.finish();
        conn.write_all(&digest.bytes).await.map_err(w)?;
        digests.push(digest.to_string());
    }
    conn.flush().await.map_err(w)?;
    Ok(digests)
}
