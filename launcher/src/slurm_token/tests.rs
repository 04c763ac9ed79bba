//! Tests of the Slurm-derived rendezvous token: the derivation, and the secret file.

use super::*;

#[test]
fn one_job_one_token_another_job_or_secret_another() {
    let a = derive(b"secret-of-alice-0123456789", "4242");
    assert_eq!(a, derive(b"secret-of-alice-0123456789", "4242"));
    assert_eq!(a.expose().len(), 64);
    assert_ne!(a, derive(b"secret-of-alice-0123456789", "4243"));
    assert_ne!(a, derive(b"secret-of-bob-0123456789ab", "4242"));
    // The job id is not a suffix the secret could absorb.
    assert_ne!(
        derive(b"secret-of-alice-0123456789", "42"),
        derive(b"secret-of-alice-01234567894", "2")
    );
}

#[test]
fn the_secret_path_follows_the_variable_then_home() {
    assert_eq!(
        secret_path(Some("/s/x"), Some("/home/a")),
        Some(PathBuf::from("/s/x"))
    );
    assert_eq!(secret_path(Some("off"), Some("/home/a")), None);
    assert_eq!(
        secret_path(None, Some("/home/a")),
        Some(PathBuf::from("/home/a/.drun/slurm-secret"))
    );
    assert_eq!(secret_path(Some(" "), None), None);
}

#[test]
fn the_secret_file_is_created_once_private_and_then_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d/slurm-secret");
    let first = read_or_create(&path).unwrap();
    assert_eq!(first.len(), 64);
    let mode = std::fs::metadata(&path).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(read_or_create(&path).unwrap(), first);
    // Only the secret is left in the directory.
    assert_eq!(
        std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
        1
    );
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let e = read_or_create(&path).unwrap_err().to_string();
    assert!(e.contains("chmod 600"), "{e}");
}
