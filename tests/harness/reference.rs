//! Fault-free reference runs shared by the tests of one `cargo nextest run`. Several tests
//! compare a faulted run's final model with the same training run without faults; nextest runs
//! each test in its own process, so a `OnceLock` alone would train the same reference once per
//! test. The first test that needs a reference computes it into a directory keyed by the run's
//! id and the reference's name; the others, in later processes, find it there.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};

/// Reference directories of nextest runs older than this are removed when a new run makes its
/// own (a run that is still going is younger).
const KEEP: Duration = Duration::from_secs(24 * 3600);

/// The directory holding the output of the fault-free run `name`, computed by `compute(dir)`
/// at most once per `cargo nextest run` (outside nextest, once per test process). `name` must
/// say everything the output depends on (script, world size, steps, flags): two tests that
/// share a name share the output. A `compute` that panics leaves no reference behind, so the
/// next test computes it again (and fails the same way).
pub fn shared(name: &str, compute: impl FnOnce(&Path)) -> PathBuf {
    assert!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "a reference name is letters, digits, '-' and '_': {name:?}"
    );
    let run = std::env::var("NEXTEST_RUN_ID")
        .unwrap_or_else(|_| format!("process-{}", std::process::id()));
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("references");
    let base = root.join(&run);
    if !base.exists() {
        remove_old_runs(&root);
    }
    std::fs::create_dir_all(&base).unwrap_or_else(|e| panic!("{}: {e}", base.display()));
    let dir = base.join(name);
    let done = base.join(format!("{name}.done"));
    // One test computes it; another that needs the same reference meanwhile waits for it.
    let lock = std::fs::File::create(base.join(format!("{name}.lock"))).unwrap();
    let _held = Flock::lock(lock, FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("locking reference {name}: {e}"));
    if !done.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        compute(&dir);
        std::fs::write(&done, b"").unwrap();
    }
    dir
}

/// Removes the reference directories of nextest runs older than [`KEEP`].
fn remove_old_runs(root: &Path) {
    let now = SystemTime::now();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > KEEP);
        if old {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
