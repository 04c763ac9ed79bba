//! Verification of a checkpoint before workers resume from it (`--ckpt-verify`).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use drun_rendezvous::{Manifest, ShardFile};

use super::{CkptError, VerifyMode};

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
        VerifyMode::Digest => match super::digest::file_like(path, &f.digest) {
            Ok((d, n)) if n == f.bytes && d == f.digest => Ok(()),
            Ok((_, n)) if n != f.bytes => Err(size(n)),
            Ok((d, _)) => Err(CkptError::Digest {
                path: f.path.clone(),
                rank: f.rank,
                found: d,
                expected: f.digest.clone(),
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
    use drun_rendezvous::{Cursor, DigestKind};

    #[test]
    fn detects_size_and_digest_changes() {
        let d = tempfile::tempdir().unwrap();
        let mut files = Vec::new();
        for r in 0..4u32 {
            let p = d.path().join(format!("rank{r}.bin"));
            std::fs::write(&p, vec![r as u8; 3000 + r as usize]).unwrap();
            // Ranks 0 and 1 as a rank's `atomic_save` reports them, 2 and 3 as the agent does.
            let kind = if r < 2 {
                DigestKind::Sha256
            } else {
                DigestKind::Blake3
            };
            let (digest, bytes) = super::super::digest::file(&p, kind).unwrap();
            let digest = digest.to_string();
            files.push(ShardFile {
                rank: r,
                path: p.display().to_string(),
                bytes,
                digest,
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
        assert!(e.contains("rank2.bin (rank 2) has digest blake3:"), "{e}");
        // A SHA-256 of a manifest written before BLAKE3 is taken again as SHA-256.
        let p = d.path().join("rank0.bin");
        std::fs::write(&p, vec![9u8; 3000]).unwrap();
        let e = verify(&m, VerifyMode::Digest, 1).unwrap_err().to_string();
        assert!(e.contains("rank0.bin (rank 0) has digest "), "{e}");
        assert!(!e.contains("blake3"), "{e}");
        std::fs::remove_file(d.path().join("rank1.bin")).unwrap();
        let e = verify(&m, VerifyMode::Size, 1).unwrap_err().to_string();
        assert!(e.contains("rank1.bin (rank 1)"), "{e}");
    }
}
