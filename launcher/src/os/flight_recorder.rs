//! Asking workers for their flight-recorder dumps (hang detection): each rank's `drun` helper
//! listens on a FIFO in the worker API socket's private directory (made by the worker, named by
//! the agent in its answer to `progress`); the agent opens it for writing, which wakes the
//! helper's thread even while the rank's main thread is blocked in a collective, and the helper
//! writes torch's dump next to it. What the dumps say is [`drun_rendezvous::decisions::flight`]'s to judge.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use drun_rendezvous::decisions::flight::Outcome;

/// How long the workers get to write their dumps once asked (torch's takes milliseconds).
pub const WAIT: Duration = Duration::from_secs(3);
/// How often the dumps are looked for.
const POLL: Duration = Duration::from_millis(50);

/// Where rank `rank` listens and writes, in the private directory `dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The FIFO the helper listens on.
    pub request: PathBuf,
    /// The file it writes its dump to.
    pub dump: PathBuf,
}

/// The paths of rank `rank` in `dir`.
pub fn paths(dir: &Path, rank: u32) -> Paths {
    Paths {
        request: dir.join(format!("flight-rank{rank}.fifo")),
        dump: dir.join(format!("flight-rank{rank}.json")),
    }
}

/// Asks rank `rank` for its dump: `false` when nobody listens (no FIFO, or no reader on it: a
/// worker that never sent a beacon, an older helper, a worker gone). A stale dump is removed
/// first.
pub fn request(dir: &Path, rank: u32) -> bool {
    let p = paths(dir, rank);
    let _ = std::fs::remove_file(&p.dump);
    let is_fifo = std::fs::symlink_metadata(&p.request).is_ok_and(|m| m.file_type().is_fifo());
    if !is_fifo {
        return false;
    }
    // Non-blocking: ENXIO at once when no reader has it open.
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&p.request);
    match opened {
        Ok(mut f) => f.write_all(b"dump\n").is_ok(),
        Err(_) => false,
    }
}

/// The dumps of the ranks `asked` (rank → whether it listened, [`request`]), waiting up to
/// `wait` for those that listened.
pub async fn collect(
    dir: &Path,
    asked: &BTreeMap<u32, bool>,
    wait: Duration,
) -> BTreeMap<u32, Outcome> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut out = BTreeMap::new();
    loop {
        for (&rank, &listened) in asked {
            if out.contains_key(&rank) {
                continue;
            }
            if !listened {
                out.insert(rank, Outcome::NotListening);
            } else if let Ok(text) = std::fs::read_to_string(paths(dir, rank).dump) {
                out.insert(rank, Outcome::Written(text));
            }
        }
        if out.len() == asked.len() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    for &rank in asked.keys() {
        out.entry(rank).or_insert(Outcome::NoAnswer);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener like the helper's: opens the FIFO to read (blocking), reads to the end, writes
    /// its dump.
    fn listen(dir: &Path, rank: u32) -> std::thread::JoinHandle<()> {
        let p = paths(dir, rank);
        nix::unistd::mkfifo(&p.request, nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::thread::spawn(move || {
            let got = std::fs::read_to_string(&p.request).unwrap();
            assert_eq!(got, "dump\n");
            let tmp = p.dump.with_extension("tmp");
            std::fs::write(&tmp, format!("{{\"rank\": {rank}}}")).unwrap();
            std::fs::rename(tmp, &p.dump).unwrap();
        })
    }

    #[tokio::test]
    async fn a_listening_rank_dumps_and_the_others_are_said_apart() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let listener = listen(d, 0);
        // Rank 1's FIFO has no reader (its worker is gone); rank 2 has none; rank 3 listens but
        // never writes (a stale dump of its previous worker is removed).
        nix::unistd::mkfifo(&paths(d, 1).request, nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::write(paths(d, 3).dump, "stale").unwrap();
        std::fs::write(paths(d, 3).request, "a regular file").unwrap();
        // Wait for the listener to open its end.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let asked0 = loop {
            if request(d, 0) {
                break true;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "rank 0 never listened"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let asked: BTreeMap<u32, bool> = [
            (0, asked0),
            (1, request(d, 1)),
            (2, request(d, 2)),
            (3, true),
        ]
        .into();
        assert!(!request(d, 3), "a regular file is no FIFO");
        assert!(!paths(d, 3).dump.exists(), "the stale dump is removed");
        let got = collect(d, &asked, Duration::from_millis(300)).await;
        listener.join().unwrap();
        assert_eq!(got[&0], Outcome::Written("{\"rank\": 0}".into()));
        assert_eq!(got[&1], Outcome::NotListening);
        assert_eq!(got[&2], Outcome::NotListening);
        assert_eq!(got[&3], Outcome::NoAnswer);
    }
}
