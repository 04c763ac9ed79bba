//! The rendezvous token of a Slurm job when none is given: HMAC-SHA256 of the job id under a
//! per-user secret kept in a file on a filesystem every node of the job shares
//! (`$DRUN_SLURM_SECRET`, default `$HOME/.drun/slurm-secret`, mode 0600, created on first use).
//!
//! Every node of one job derives the same token; a process that cannot read the secret (another
//! user) cannot compute it, and an agent of another job derives another token, so the
//! rendezvous an agent of this job hosts refuses it. The derivation is the pure [`derive`];
//! [`token`] reads (or creates) the file. `docs/guide/slurm.md` ("The rendezvous token of a
//! job") gives the threat model and why munge is not used.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use drun_rendezvous::server::auth::Secret;

use crate::mac::hmac_sha256;

/// The variable naming the secret file; `off` turns the derived token off.
pub const SECRET_VAR: &str = "DRUN_SLURM_SECRET";

/// Domain separation: a token derived here is good for nothing else.
const CONTEXT: &[u8] = b"drun slurm rendezvous token v1\0";

/// The token of Slurm job `job_id` under `secret`: 64 hex digits.
pub fn derive(secret: &[u8], job_id: &str) -> Secret {
    let mac = hmac_sha256(secret, &[CONTEXT, job_id.as_bytes()]);
    Secret::new(&crate::hex::hex(&mac))
}

/// Where the secret lives: `var` (the value of [`SECRET_VAR`]), else `$HOME/.drun/slurm-secret`;
/// `None` when turned off (`off`) or there is no home.
pub fn secret_path(var: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    match var.map(str::trim).filter(|v| !v.is_empty()) {
        Some("off") => None,
        Some(p) => Some(PathBuf::from(p)),
        None => home
            .filter(|h| !h.is_empty())
            .map(|h| Path::new(h).join(".drun/slurm-secret")),
    }
}

/// A secret file that cannot be used: one line naming it (never the secret).
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file or its directory cannot be created.
    #[error("cannot create {}: {source}", path.display())]
    Create {
        /// The file or directory.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// `/dev/urandom` cannot be read.
    #[error("cannot read /dev/urandom: {0}")]
    Random(#[source] std::io::Error),
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// Another user's file, or one others can read.
    #[error("{p} must belong to this user and be readable by no one else (chmod 600 {p})", p = .0.display())]
    Exposed(PathBuf),
    /// A secret of fewer than 16 bytes.
    #[error("{} holds less than 16 bytes; remove it and drun writes a new one", .0.display())]
    TooShort(PathBuf),
}

/// The secret in `path`, created with 32 random bytes (hex) when missing. Concurrent first uses
/// on several nodes agree: each writes a private temporary file and hard-links it into place
/// (atomic, also on NFS); the losers read the winner's.
///
/// # Errors
/// One line: the file cannot be created or read, is empty, is not owned by this user or is
/// readable by others (`chmod 600` it).
pub fn read_or_create(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    let create = |p: &Path| {
        let path = p.to_path_buf();
        move |source| SecretFileError::Create { path, source }
    };
    let read = |source| SecretFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    if !path.exists() {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(create(dir))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = dir.join(format!(".slurm-secret.{}.{nanos}", std::process::id()));
        let mut random = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
            .map_err(SecretFileError::Random)?;
        let hex = crate::hex::hex(&random);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(hex.as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| match std::fs::hard_link(&tmp, path) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            });
        let _ = std::fs::remove_file(&tmp);
        written.map_err(create(path))?;
    }
    let meta = std::fs::metadata(path).map_err(read)?;
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 {
        return Err(SecretFileError::Exposed(path.to_path_buf()));
    }
    let text = std::fs::read(path).map_err(read)?;
    let secret = text.trim_ascii().to_vec();
    if secret.len() < 16 {
        return Err(SecretFileError::TooShort(path.to_path_buf()));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests;
