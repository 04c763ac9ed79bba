//! Sends one staged step to the ring neighbour's agent (`--ckpt-replicas`; the exchange in
//! [`crate::ckpt::memory::wire`]).

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::shelf::CHUNK;
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
pub(super) async fn line(conn: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut l = String::new();
    conn.read_line(&mut l)
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
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
    String,
> {
    let addr = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to nothing"))?;
    let conn = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let mut conn = BufReader::new(conn);
    let mut nonce = [0u8; NONCE_BYTES];
    conn.read_exact(&mut nonce)
        .await
        .map_err(|e| format!("no nonce from {addr}: {e}"))?;
    Ok((conn, nonce, addr))
}

/// Offers `offer` to `t` and streams `staged` when taken; the SHA-256 of each file as sent
/// (the neighbour verified it before its `ok`).
pub(super) async fn offer_to(
    t: &Target,
    mut offer: Offer,
    staged: &[PathBuf],
    token: Option<String>,
) -> Result<Vec<String>, String> {
    let (mut conn, nonce, addr) = open(&t.addr, t.port).await?;
    offer.sign(token.as_deref(), &nonce);
    let w = |e: std::io::Error| format!("sending to {addr}: {e}");
    conn.get_mut().write_all(&offer.encode()).await.map_err(w)?;
    let answer = line(&mut conn).await?;
    if answer != "take" {
        return Err(answer);
    }
    let digests = stream_files(conn.get_mut(), &offer.files, staged, &addr.to_string()).await?;
    match line(&mut conn).await? {
        ok if ok == "ok" => Ok(digests),
        bad => Err(bad),
    }
}

/// Streams each of `files` from its `staged` copy to `conn`, each followed by the SHA-256 of
/// the bytes sent (32 bytes), then flushes; `to` names the other end in errors. Returns those
/// digests, in lowercase hex.
pub(super) async fn stream_files(
    conn: &mut TcpStream,
    files: &[OfferFile],
    staged: &[PathBuf],
    to: &str,
) -> Result<Vec<String>, String> {
    let w = |e: std::io::Error| format!("sending to {to}: {e}");
    let mut buf = vec![0u8; CHUNK];
    let mut digests = Vec::with_capacity(files.len());
    for (f, path) in files.iter().zip(staged) {
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
            conn.write_all(&buf[..n]).await.map_err(w)?;
            left -= n as u64;
        }
        let digest = hash.finalize();
        conn.write_all(&digest).await.map_err(w)?;
        digests.push(digest.iter().map(|b| format!("{b:02x}")).collect());
    }
    conn.flush().await.map_err(w)?;
    Ok(digests)
}
