//! Verification of a checkpoint before workers resume from it (`--ckpt-verify`).

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use drun_rendezvous::{Manifest, ShardFile};
use sha2::{Digest, Sha256};

use super::{CkptError, VerifyMode};

/// Read size of the digest loop, in bytes.
const CHUNK: usize = 1 << 20;

/// SHA-256 of a file, lowercase hex, and its size in bytes.
///
/// # Errors
/// I/O errors opening or reading the file.
pub fn sha256_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex(&h.finalize()), n))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// What a successful verification checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Files checked.
    pub files: usize,
    /// Bytes covered (all of them were read with [`VerifyMode::Digest`]).
    pub bytes: u64,
    /// Wall time.
    pub took: Duration,
}

fn check(f: &ShardFile, mode: VerifyMode) -> Result<(), CkptError> {
    let path = Path::new(&f.path);
    let size = |found| CkptError::Size {
        path: f.path.clone(),
        rank: f.rank,
        step: None,
        found,
        expected: f.bytes,
    };
    let unreadable = |source| CkptError::Unreadable {
        path: f.path.clone(),
        rank: f.rank,
        step: None,
        source,
    };
    match mode {
        VerifyMode::None => Ok(()),
        VerifyMode::Size => match std::fs::metadata(path) {
            Ok(m) if m.len() == f.bytes => Ok(()),
            Ok(m) => Err(size(m.len())),
            Err(e) => Err(unreadable(e)),
        },
        VerifyMode::Digest => match sha256_file(path) {
            Ok((d, n)) if n == f.bytes && d == f.sha256 => Ok(()),
            Ok((_, n)) if n != f.bytes => Err(size(n)),
            Ok((d, _)) => Err(CkptError::Digest {
                path: f.path.clone(),
                rank: f.rank,
                found: d,
                expected: f.sha256.clone(),
            }),
            Err(e) => Err(unreadable(e)),
        },
    }
}

/// Checks every file of `m` (in parallel, up to `threads` at once); the first problem found is
/// the error, one line.
///
/// # Errors
/// A missing or unreadable file, a size or digest that differs from the manifest.
pub fn verify(m: &Manifest, mode: VerifyMode, threads: usize) -> Result<Verified, CkptError> {
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let problem = Mutex::new(None::<CkptError>);
    let threads = threads.clamp(1, m.files.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(f) = m.files.get(i) else { return };
                if problem.lock().expect("not poisoned").is_some() {
                    return;
                }
                if let Err(e) = check(f, mode) {
                    problem.lock().expect("not poisoned").get_or_insert(e);
                    return;
                }
            });
        }
    });
    match problem.into_inner().expect("not poisoned") {
        Some(e) => Err(e),
        None => Ok(Verified {
            files: m.files.len(),
            bytes: m.bytes(),
            took: start.elapsed(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::Cursor;

    #[test]
    fn detects_size_and_digest_changes() {
        let d = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        for r in 0..4u32 {
            let p = d.path().join(format!("rank{r}.bin"));
            std::fs::write(&p, vec![r as u8; 3000 + r as usize]).unwrap();
            let (sha256, bytes) = sha256_file(&p).unwrap();
            files.push(ShardFile {
                rank: r,
                path: p.display().to_string(),
                bytes,
                sha256,
            });
        }
        let m = Manifest {
            run_id: "r".into(),
            step: 1,
            generation: 1,
            world_size: 4,
            cursor: Cursor::default(),
            files,
            sealed_at_ms: 0,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        };
        assert_eq!(verify(&m, VerifyMode::Digest, 3).unwrap().files, 4);
        // Same size, one byte flipped: only the digest notices.
        let p = d.path().join("rank2.bin");
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[100] ^= 0xff;
        std::fs::write(&p, &bytes).unwrap();
        assert!(verify(&m, VerifyMode::Size, 3).is_ok());
        let e = verify(&m, VerifyMode::Digest, 3).unwrap_err().to_string();
        assert!(e.contains("rank2.bin (rank 2) has sha256"), "{e}");
        std::fs::remove_file(d.path().join("rank1.bin")).unwrap();
        let e = verify(&m, VerifyMode::Size, 1).unwrap_err().to_string();
        assert!(e.contains("rank1.bin (rank 1)"), "{e}");
        assert_eq!(
            sha256_file(&d.path().join("rank0.bin")).unwrap().0.len(),
            64
        );
    }
}
