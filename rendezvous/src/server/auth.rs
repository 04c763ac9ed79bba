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
pub use format::{parse_tokens, token_problem, Entry, Secret, TokenLineError, MAX_TOKEN_LEN};
use token_files::{read, TokenFile, TokenFileError};

/// The metadata key the token travels under.
pub const TOKEN_KEY: &str = "authorization";

/// The scheme before the token in [`TOKEN_KEY`]'s value.
const BEARER: &str = "Bearer ";

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
        let same = ct_eq(e.token.expose().as_bytes(), presented.as_bytes());
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

pub mod format;
pub mod token_files;

#[cfg(test)]
mod tests;
