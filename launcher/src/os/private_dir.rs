//! The private directory of the worker API socket: a fresh 0700 directory under the temporary
//! directory (`TMPDIR`), refused when that directory lets another user replace what is in it
//! (writable by group or others without the sticky bit, or owned by another user than this one
//! or root) — the checks OpenSSH makes of the paths it trusts. Whoever could swap the directory
//! could answer the workers' checkpoint commits in the agent's name.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Why a directory may not hold this user's private directory ([`parent_verdict`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeParent {
    /// Owned by another user than this one or root.
    #[error("it belongs to user {owner}, not to this user ({me}) or root")]
    Owner {
        /// Its owner.
        owner: u32,
        /// This user.
        me: u32,
    },
    /// Writable by group or others without the sticky bit (its permission bits).
    #[error("other users may write to it (mode {0:o}) and it lacks the sticky bit")]
    Writable(u32),
}

/// Whether a directory with `mode` (st_mode), owned by `owner`, may hold this user's (`me`)
/// private directory; `Err`: why not and what to do, one line.
///
/// ```
/// use drun_launcher::os::private_dir::parent_verdict;
/// assert!(parent_verdict(0o41777, 0, 1000).is_ok()); // /tmp: sticky, root's
/// assert!(parent_verdict(0o40777, 1000, 1000).is_err()); // anyone may rename in it
/// ```
pub fn parent_verdict(mode: u32, owner: u32, me: u32) -> Result<(), UnsafeParent> {
    const STICKY: u32 = 0o1000;
    if owner != me && owner != 0 {
        return Err(UnsafeParent::Owner { owner, me });
    }
    if mode & 0o022 != 0 && mode & STICKY == 0 {
        return Err(UnsafeParent::Writable(mode & 0o7777));
    }
    Ok(())
}

/// Creates a private (0700, this user's) directory named `prefix*` in `parent`.
///
/// # Errors
/// `PermissionDenied` with one line naming `parent` and the fix when `parent` is unsafe
/// ([`parent_verdict`]) or the new directory did not come out private; the OS error when it
/// cannot be created.
pub fn create(parent: &Path, prefix: &str) -> std::io::Result<tempfile::TempDir> {
    let me = nix::unistd::geteuid().as_raw();
    let meta = std::fs::metadata(parent)?;
    parent_verdict(meta.mode(), meta.uid(), me)
        .map_err(|why| unsafe_dir(parent, &why.to_string()))?;
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(parent)?;
    // tempfile creates it under the umask (0755 typically): closed before anything goes in.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
    let m = std::fs::metadata(dir.path())?;
    if m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(unsafe_dir(
            dir.path(),
            &format!(
                "it came out with mode {:o}, owner {}",
                m.mode() & 0o7777,
                m.uid()
            ),
        ));
    }
    Ok(dir)
}

fn unsafe_dir(path: &Path, why: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "refusing {} for the worker API socket: {why}; set TMPDIR to a directory only you can write (chmod 700) or one with the sticky bit (chmod +t)",
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_dirs_need_the_sticky_bit_and_a_trusted_owner() {
        assert!(parent_verdict(0o40700, 1000, 1000).is_ok());
        assert!(parent_verdict(0o40755, 0, 1000).is_ok());
        assert!(parent_verdict(0o41777, 0, 1000).is_ok());
        let e = parent_verdict(0o40777, 0, 1000).unwrap_err().to_string();
        assert!(e.contains("mode 777") && e.contains("sticky"), "{e}");
        assert!(
            parent_verdict(0o40775, 1000, 1000).is_err(),
            "group-writable"
        );
        let e = parent_verdict(0o40700, 1001, 1000).unwrap_err().to_string();
        assert!(e.contains("user 1001"), "{e}");
    }

    #[test]
    fn a_world_writable_parent_is_refused_and_a_private_one_taken() {
        let base = tempfile::tempdir().unwrap();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = create(&open, "drun-agent-").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        let line = e.to_string();
        assert!(
            line.contains("refusing") && line.contains("TMPDIR"),
            "{line}"
        );
        assert_eq!(
            std::fs::read_dir(&open).unwrap().count(),
            0,
            "nothing created"
        );

        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let dir = create(&open, "drun-agent-").unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
