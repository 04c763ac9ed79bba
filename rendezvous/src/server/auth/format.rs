//! The token file's format: one `TOKEN` or `RUN_ID TOKEN` per line ([`parse_tokens`]), which
//! tokens can travel as gRPC metadata ([`token_problem`]), and the [`Secret`] that never shows
//! itself in a log.

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
        if let Some(why) = token_problem(entry.token.expose()) {
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
