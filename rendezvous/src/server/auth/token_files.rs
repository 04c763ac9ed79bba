//! A server's `--token-file`s, kept parsed in memory and read again only when they change.
//!
//! Reading a file at every RPC cost an `open`, a `read` and a `close` per call (about 3 µs, 6 %
//! of a loopback round trip). Instead each file is looked at (`stat`, no read) at most once per
//! [`RECHECK`]; when its size, modification or change time, or inode differ from what was read
//! last (an edit in place or a new file moved over it), or it changed less than [`RECHECK`] ago,
//! it is read and parsed again. So a rotated token takes effect within [`RECHECK`] of the change,
//! without a restart. A file that cannot be looked at or parsed any more accepts nothing until it
//! is fixed (fail closed), with one warning when that starts, not one per request.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::format::{parse_tokens, Entry, TokenLineError};

/// A token file that cannot be used: one line naming it, never a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// It cannot be looked at, opened or read.
    #[error("cannot read token file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// It is larger than [`MAX_FILE_BYTES`].
    #[error("token file {} is larger than {} KiB; a token file holds `TOKEN` or `RUN_ID TOKEN` lines", .0.display(), MAX_FILE_BYTES / 1024)]
    TooLarge(PathBuf),
    /// A line does not parse.
    #[error("token file {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Which line, and why.
        source: TokenLineError,
    },
    /// It holds no token (refused when the server starts).
    #[error("token file {} holds no token; write one `TOKEN` or `RUN_ID TOKEN` per line", .0.display())]
    Empty(PathBuf),
}

/// How often, at most, a token file is looked at again (1 s).
pub const RECHECK: Duration = Duration::from_secs(1);

/// What tells one version of a file from another without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
}

impl Stamp {
    /// The stamp of `m`.
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            ino: m.ino(),
        }
    }
}

/// Whether `m` was modified less than [`RECHECK`] ago: file times are coarse (a clock tick of a
/// few ms), so two writes of the same length close together can leave the same [`Stamp`]; such a
/// file is read again at every look until it is older (as git treats "racily clean" files).
fn recent(m: &std::fs::Metadata) -> bool {
    m.modified()
        .ok()
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
        .is_none_or(|age| age < RECHECK)
}

/// Whether a file last looked at `checked` (`None`: never) is looked at again at `now`.
pub fn due(checked: Option<Instant>, now: Instant) -> bool {
    checked.is_none_or(|t| now.saturating_duration_since(t) >= RECHECK)
}

/// One token file and what was last read from it.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    checked: Option<Instant>,
    stamp: Option<Stamp>,
    entries: Result<Vec<Entry>, TokenFileError>,
}

impl TokenFile {
    /// `path`, not read yet (the first [`TokenFile::entries_at`] reads it).
    pub fn new(path: PathBuf) -> Self {
        TokenFile {
            path,
            checked: None,
            stamp: None,
            entries: Ok(Vec::new()),
        }
    }

    /// The entries the file holds as of `now`: looked at again when [`due`], read again when
    /// its [`Stamp`] changed. A file that cannot be looked at, read or parsed gives none.
    pub fn entries_at(&mut self, now: Instant) -> &[Entry] {
        if due(self.checked, now) {
            self.checked = Some(now);
            let stamp = std::fs::metadata(&self.path).map(|m| (Stamp::of(&m), recent(&m)));
            match stamp {
                Ok((s, false)) if self.stamp == Some(s) => {}
                Ok((s, _)) => {
                    self.stamp = Some(s);
                    self.set(read(&self.path));
                }
                Err(source) => {
                    self.stamp = None;
                    self.set(Err(TokenFileError::Read {
                        path: self.path.clone(),
                        source,
                    }));
                }
            }
        }
        self.entries.as_deref().unwrap_or(&[])
    }

    fn set(&mut self, entries: Result<Vec<Entry>, TokenFileError>) {
        match (&entries, &self.entries) {
            (Err(e), Ok(_)) => tracing::warn!("{e}; its tokens are not accepted until it is fixed"),
            (Ok(now), Ok(before)) if now.is_empty() && !before.is_empty() => tracing::warn!(
                "token file {} now holds no token: no agent is accepted through it until one is written",
                self.path.display()
            ),
            (Ok(now), Err(_)) if !now.is_empty() => tracing::info!(
                "token file {} read again: {} token(s) accepted",
                self.path.display(),
                now.len()
            ),
            _ => {}
        }
        self.entries = entries;
    }
}

/// The largest token file read, in bytes (1 MiB: thousands of run-scoped tokens); a larger one
/// is refused rather than read whole on every change.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Reads and parses the token file `f`.
///
/// # Errors
/// A file that cannot be read, is larger than [`MAX_FILE_BYTES`] or does not parse: one line
/// naming it (never a token).
pub fn read(f: &Path) -> Result<Vec<Entry>, TokenFileError> {
    let cannot = |source| TokenFileError::Read {
        path: f.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(f).map_err(cannot)?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
        &mut text,
    )
    .map_err(cannot)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(TokenFileError::TooLarge(f.to_path_buf()));
    }
    parse_tokens(&text).map_err(|source| TokenFileError::Parse {
        path: f.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(f: &mut TokenFile, now: Instant) -> Vec<String> {
        f.entries_at(now)
            .iter()
            .map(|e| e.token.expose().to_string())
            .collect()
    }

    #[test]
    fn a_file_is_looked_at_again_only_after_the_recheck_interval() {
        let t0 = Instant::now();
        assert!(due(None, t0));
        assert!(!due(Some(t0), t0 + RECHECK - Duration::from_millis(1)));
        assert!(due(Some(t0), t0 + RECHECK));
        // A clock read before `checked` (another thread's instant) is not due.
        assert!(!due(Some(t0 + RECHECK), t0));
    }

    #[test]
    fn only_a_file_changed_less_than_the_recheck_interval_ago_is_recent() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens");
        std::fs::write(&p, "tok\n").unwrap();
        assert!(recent(&std::fs::metadata(&p).unwrap()));
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(std::time::SystemTime::now() - RECHECK * 2)
            .unwrap();
        assert!(!recent(&std::fs::metadata(&p).unwrap()));
    }

    #[test]
    fn a_rotated_token_takes_effect_at_the_next_recheck() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens");
        std::fs::write(&p, "old\n").unwrap();
        let mut f = TokenFile::new(p.clone());
        let t0 = Instant::now();
        assert_eq!(tokens(&mut f, t0), ["old"]);
        // Same length, and maybe the same coarse file time: it changed less than RECHECK ago,
        // so it is read again anyway.
        std::fs::write(&p, "new\n").unwrap();
        assert_eq!(
            tokens(&mut f, t0 + RECHECK / 2),
            ["old"],
            "not looked at yet"
        );
        assert_eq!(tokens(&mut f, t0 + RECHECK), ["new"]);
        // Moved over (a new inode), as `mv tokens.new tokens` rotates.
        let q = dir.path().join("tokens.new");
        std::fs::write(&q, "newer\nother\n").unwrap();
        std::fs::rename(&q, &p).unwrap();
        assert_eq!(tokens(&mut f, t0 + RECHECK * 2), ["newer", "other"]);
    }

    #[test]
    fn a_file_gone_or_broken_accepts_nothing_until_it_is_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens");
        std::fs::write(&p, "tok\n").unwrap();
        let mut f = TokenFile::new(p.clone());
        let t0 = Instant::now();
        assert_eq!(tokens(&mut f, t0), ["tok"]);
        std::fs::remove_file(&p).unwrap();
        assert!(tokens(&mut f, t0 + RECHECK).is_empty());
        std::fs::write(&p, "a b c\n").unwrap();
        assert!(
            tokens(&mut f, t0 + RECHECK * 2).is_empty(),
            "does not parse"
        );
        std::fs::write(&p, "tok\n").unwrap();
        assert_eq!(tokens(&mut f, t0 + RECHECK * 3), ["tok"]);
        // Larger than a token file can be: refused, not read whole.
        std::fs::write(&p, "x\n".repeat(MAX_FILE_BYTES as usize)).unwrap();
        assert!(tokens(&mut f, t0 + RECHECK * 4).is_empty());
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("larger than 1024 KiB"), "{e}");
    }
}
