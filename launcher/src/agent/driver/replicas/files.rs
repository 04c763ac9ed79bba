//! What both directions of the replica port (a replica offered by the ring predecessor, a
//! fetch) do on a connection: read a transfer's files, each written at its staged path and
//! checked against its digest, and answer a refusal. Used by both, so it imports neither.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::error::ReplicaError;
use super::shelf::CHUNK;
use crate::ckpt::digest::Hasher;
use crate::ckpt::memory::staged_path;
use crate::ckpt::memory::wire::OfferFile;

/// Tells the peer `kind` (`refused`: the request; `bad`: the bytes) and why, as far as the
/// connection still takes it.
pub(super) async fn tell(conn: &mut BufReader<TcpStream>, kind: &str, why: &ReplicaError) {
    let _ = conn
        .get_mut()
        .write_all(format!("{kind}: {why}\n").as_bytes())
        .await;
}

/// [`read_each`] within `limit`: a sender that stalls does not hold the connection (and the
/// memory its transfer reserved) longer. `wanted_still` is asked before each chunk: `Err(why)`
/// ends the transfer there (a replica released for this node's own save as it arrives).
pub(super) async fn read_files(
    limit: Duration,
    conn: &mut BufReader<TcpStream>,
    wanted: &[OfferFile],
    to: (&Path, &Path),
    files: &mut Vec<PathBuf>,
    wanted_still: &(dyn Fn() -> Result<(), ReplicaError> + Sync),
) -> Result<Vec<String>, ReplicaError> {
    let (root, ckpt_dir) = to;
    tokio::time::timeout(
        limit,
        read_each(conn, wanted, root, ckpt_dir, files, wanted_still),
    )
    .await
    .unwrap_or(Err(ReplicaError::NotArrived { limit }))
}

/// Reads each of `wanted` and its digest, writing it at its staged path under `root` (each
/// path written is pushed on `files`); the digest of each, verified against the sender's and
/// (when given) the expected one.
async fn read_each(
    conn: &mut BufReader<TcpStream>,
    wanted: &[OfferFile],
    root: &Path,
    ckpt_dir: &Path,
    files: &mut Vec<PathBuf>,
    wanted_still: &(dyn Fn() -> Result<(), ReplicaError> + Sync),
) -> Result<Vec<String>, ReplicaError> {
    let mut buf = vec![0u8; CHUNK];
    let mut digests = Vec::new();
    for f in wanted {
        let dest = staged_path(root, ckpt_dir, Path::new(&f.path)).ok_or_else(|| {
            ReplicaError::Outside {
                path: f.path.clone(),
            }
        })?;
        if let Some(d) = dest.parent() {
            tokio::fs::create_dir_all(d)
                .await
                .map_err(|source| ReplicaError::Create {
                    path: d.to_path_buf(),
                    source,
                })?;
        }
        let mut out =
            tokio::fs::File::create(&dest)
                .await
                .map_err(|source| ReplicaError::Create {
                    path: dest.clone(),
                    source,
                })?;
        files.push(dest.clone());
        let mut hash = Hasher::like(&f.digest);
        let mut left = f.bytes;
        while left > 0 {
            wanted_still()?;
            let n = conn
                .read(&mut buf[..CHUNK.min(left as usize)])
                .await
                .map_err(|source| ReplicaError::Read {
                    path: PathBuf::from(&f.path),
                    source,
                })?;
            if n == 0 {
                return Err(ReplicaError::Ended {
                    path: f.path.clone(),
                    bytes: f.bytes,
                });
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n])
                .await
                .map_err(|source| ReplicaError::Write {
                    path: dest.clone(),
                    source,
                })?;
            left -= n as u64;
        }
        // tokio's file writes in the background: the bytes are in the file once flushed.
        out.flush().await.map_err(|source| ReplicaError::Write {
            path: dest.clone(),
            source,
        })?;
        let mut digest = [0u8; 32];
        conn.read_exact(&mut digest)
            .await
            .map_err(|source| ReplicaError::Digest {
                path: f.path.clone(),
                source,
            })?;
        let got = hash.finish();
        if got.bytes != digest {
            return Err(ReplicaError::NotSenders {
                path: f.path.clone(),
            });
        }
        let got = got.to_string();
        if !f.digest.is_empty() && f.digest != got {
            return Err(ReplicaError::NotRanks {
                path: f.path.clone(),
                got,
                want: f.digest.clone(),
            });
        }
        digests.push(got);
    }
    Ok(digests)
}
