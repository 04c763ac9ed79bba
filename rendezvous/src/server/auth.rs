//! Token authentication of the `drun.v1` service: which tokens a server accepts, for which runs,
//! and the check of every RPC and stream.
//!
//! An agent sends its token as gRPC metadata (`authorization: Bearer TOKEN`, the header gRPC
//! and HTTP use for bearer tokens, as etcd and Kubernetes do). A server reads the tokens it
//! accepts from files (`--token-file`, repeatable), one per line: `TOKEN` accepts any run,
//! `RUN_ID TOKEN` only run `RUN_ID`; blank lines and lines starting with `#` are ignored. The
//! files are looked at again at most once a second and read again when they changed
//! ([`token_files`]), so a rotated token takes effect within a second without a restart,
//! and a file that cannot be read any more accepts nothing (fail closed). Tokens are compared in
//! constant time ([`ct_eq`]). The decision itself is the pure [`decide`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::error::ServiceError;
use token_files::{read, TokenFile, TokenFileError};

/// The metadata key the token travels under.
pub const TOKEN_KEY: &str = "authorization";

/// The scheme before the token in [`TOKEN_KEY`]'s value.
const BEARER: &str = "Bearer ";

/// Longest accepted token, in bytes (longer lines are refused when a file is read).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Why `token` cannot be sent, if it cannot: gRPC metadata carries only printable ASCII, so a
/// token is 1 to [`MAX_TOKEN_LEN`] bytes of `!`..`~` (no spaces, no control or non-ASCII
/// characters). The token itself is never part of the answer.
pub fn token_problem(token: &str) -> Option<String> {
    if token.len() > MAX_TOKEN_LEN {
        return Some(format!("a token is at most {MAX_TOKEN_LEN} bytes"));
    }
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Some(
            "a token must be printable ASCII without spaces (gRPC metadata carries nothing else)"
                .into(),
        );
    }
    None
}

/// A secret string whose `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `s` (surrounding whitespace trimmed).
    pub fn new(s: &str) -> Self {
        Secret(s.trim().to_string())
    }

    /// The secret itself: only to send it or compare it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One accepted token: for every run (`run: None`) or for one run id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The run id it is scoped to, if any.
    pub run: Option<String>,
    /// The token.
    pub token: Secret,
}

/// A line of a token file that does not parse ([`parse_tokens`]); never quotes the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenLineError {
    /// More than two fields.
    #[error("line {0}: expected `TOKEN` or `RUN_ID TOKEN`")]
    Fields(usize),
    /// A token [`token_problem`] refuses.
    #[error("line {line}: {why}")]
    Token {
        /// The line number, from 1.
        line: usize,
        /// What is wrong with the token.
        why: String,
    },
    /// A run id [`crate::server::validate::id`] refuses.
    #[error("line {line}: {why}")]
    RunId {
        /// The line number, from 1.
        line: usize,
        /// What is wrong with the run id.
        why: crate::server::validate::Invalid,
    },
}

/// Parses a token file's text: one `TOKEN` or `RUN_ID TOKEN` per line.
///
/// # Errors
/// A line of more than two fields, a token [`token_problem`] refuses, or a run id
/// [`crate::server::validate::id`] refuses: the message names the line number, never the token.
pub fn parse_tokens(text: &str) -> Result<Vec<Entry>, TokenLineError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let entry = match fields.as_slice() {
            [token] => Entry {
                run: None,
                token: Secret::new(token),
            },
            [run, token] => Entry {
                run: Some((*run).to_string()),
                token: Secret::new(token),
            },
            _ => return Err(TokenLineError::Fields(i + 1)),
        };
        if let Some(why) = token_problem(&entry.token.0) {
            return Err(TokenLineError::Token { line: i + 1, why });
        }
        if let Some(run) = &entry.run {
            crate::server::validate::id("the run id", run)
                .map_err(|why| TokenLineError::RunId { line: i + 1, why })?;
        }
        out.push(entry);
    }
    Ok(out)
}

/// Equality of `a` and `b` whose time depends only on their lengths, not on where they differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the compiler from turning the fold into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// The outcome of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No token is configured: the control plane is open.
    Open,
    /// The token is accepted for the run asked about.
    Accepted,
    /// The request carries no token.
    Missing,
    /// The token is not one the server accepts (for this run, when `run` was given).
    Wrong,
}

/// Whether `presented` is accepted for `run` (`None`: for some run, as before a session's
/// Hello names its run) by `entries`; `configured`: whether the server was given token files
/// at all (configured with no readable entry accepts nothing). Every entry is compared, so the
/// time taken does not tell which one matched.
pub fn decide<'a>(
    configured: bool,
    entries: impl IntoIterator<Item = &'a Entry>,
    run: Option<&str>,
    presented: Option<&str>,
) -> Verdict {
    if !configured {
        return Verdict::Open;
    }
    let Some(presented) = presented else {
        return Verdict::Missing;
    };
    let mut ok = false;
    for e in entries {
        let same = ct_eq(e.token.0.as_bytes(), presented.as_bytes());
        let in_scope = match (&e.run, run) {
            (None, _) | (_, None) => true,
            (Some(scoped), Some(run)) => scoped == run,
        };
        ok |= same && in_scope;
    }
    if ok {
        Verdict::Accepted
    } else {
        Verdict::Wrong
    }
}

/// Where a server's accepted tokens come from.
#[derive(Debug, Clone)]
enum TokenSource {
    /// A `--token-file`, read again when it changed.
    File(Arc<Mutex<TokenFile>>),
    /// A token held in memory (an agent hosting the c10d rendezvous accepts its own), for any
    /// run.
    Fixed(Entry),
}

/// The tokens a server accepts. [`Auth::open`] accepts every request.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    sources: Vec<TokenSource>,
}

impl Auth {
    /// No authentication: every request is served.
    pub fn open() -> Self {
        Auth::default()
    }

    /// Tokens read from `files`, and read again when they change ([`token_files`]).
    ///
    /// # Errors
    /// A file that cannot be read now, does not parse or holds no token: one line naming it.
    pub fn from_files(files: &[PathBuf]) -> Result<Self, TokenFileError> {
        for f in files {
            let entries = read(f)?;
            if entries.is_empty() {
                return Err(TokenFileError::Empty(f.clone()));
            }
        }
        Ok(Auth {
            sources: files
                .iter()
                .map(|f| TokenSource::File(Arc::new(Mutex::new(TokenFile::new(f.clone())))))
                .collect(),
        })
    }

    /// Accepts exactly `token` (for any run); `None`: open.
    pub fn fixed(token: Option<Secret>) -> Self {
        Auth {
            sources: token
                .into_iter()
                .map(|token| TokenSource::Fixed(Entry { run: None, token }))
                .collect(),
        }
    }

    /// Whether no token is required.
    pub fn is_open(&self) -> bool {
        self.sources.is_empty()
    }

    /// Checks the token in `metadata` for `run` (`None`: any run).
    ///
    /// # Errors
    /// [`ServiceError::Unauthenticated`] with one line saying what is missing or wrong (never
    /// the token).
    pub fn check(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        run: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.check_at(metadata, run, Instant::now())
    }

    /// [`Auth::check`] as of `now` (the token files' contents as looked at by then).
    ///
    /// # Errors
    /// As [`Auth::check`].
    pub fn check_at(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        run: Option<&str>,
        now: Instant,
    ) -> Result<(), ServiceError> {
        if self.is_open() {
            return Ok(());
        }
        let presented = metadata
            .get(TOKEN_KEY)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix(BEARER).unwrap_or(v));
        // Compared in place: the files' entries under their locks, nothing copied per request.
        let mut files: Vec<_> = self
            .sources
            .iter()
            .filter_map(|s| match s {
                TokenSource::File(f) => Some(f.lock().unwrap_or_else(PoisonError::into_inner)),
                TokenSource::Fixed(_) => None,
            })
            .collect();
        let fixed = self.sources.iter().filter_map(|s| match s {
            TokenSource::Fixed(e) => Some(e),
            TokenSource::File(_) => None,
        });
        let read = files.iter_mut().flat_map(|f| f.entries_at(now).iter());
        match decide(true, fixed.chain(read), run, presented) {
            Verdict::Open | Verdict::Accepted => Ok(()),
            Verdict::Missing => Err(ServiceError::Unauthenticated(
                "this rendezvous server requires a token and none was sent; give the agent \
                 --rdzv-token-file PATH or DRUN_RDZV_TOKEN"
                    .into(),
            )),
            Verdict::Wrong => Err(ServiceError::Unauthenticated(match run {
                Some(run) => format!(
                    "the token sent is not accepted for run '{run}'; check --rdzv-token-file or \
                     DRUN_RDZV_TOKEN against the server's --token-file"
                ),
                None => "the token sent is not accepted; check --rdzv-token-file or \
                         DRUN_RDZV_TOKEN against the server's --token-file"
                    .into(),
            })),
        }
    }
}

/// Adds `token` (if any) to an outgoing request's metadata.
pub fn attach<T>(req: &mut tonic::Request<T>, token: Option<&Secret>) {
    if let Some(t) = token {
        if let Ok(v) = format!("{BEARER}{}", t.expose()).parse() {
            req.metadata_mut().insert(TOKEN_KEY, v);
        }
    }
}

pub mod token_files;

#[cfg(test)]
mod tests;
