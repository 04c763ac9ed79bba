//! The token an agent (or `status`) sends to its rendezvous server: read from
//! `--rdzv-token-file PATH` or the `DRUN_RDZV_TOKEN` environment variable, never from a flag's
//! value, so it does not show in `ps` (see [`crate::server::auth`] for the server side).

use std::path::{Path, PathBuf};

use crate::server::auth::{token_problem, Secret, MAX_TOKEN_LEN};

/// The environment variable holding the token itself.
pub const TOKEN_VAR: &str = "DRUN_RDZV_TOKEN";

/// A token to send that cannot be used: one line naming the file or the variable, never the
/// token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// [`TOKEN_VAR`] holds a token [`token_problem`] refuses.
    #[error("{TOKEN_VAR} holds an unusable token: {0}")]
    Variable(String),
    /// The file cannot be read.
    #[error("cannot read the token file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The file holds no token line.
    #[error("the token file {} holds no token; write the token on its first line", .0.display())]
    Empty(PathBuf),
    /// The first token line holds more than one field, or is too long.
    #[error("the token file {} must hold one token (no spaces, at most {MAX_TOKEN_LEN} bytes) on its first line", .0.display())]
    NotOne(PathBuf),
    /// The file's token is one [`token_problem`] refuses.
    #[error("the token file {} holds an unusable token: {why}", path.display())]
    Unusable {
        /// The file.
        path: PathBuf,
        /// What is wrong with the token.
        why: String,
    },
}

/// The token to send: the first line of `file` that is neither blank nor a `#` comment, else
/// `env` (the value of [`TOKEN_VAR`]) when non-empty, else none. The file wins over the
/// variable.
///
/// # Errors
/// One line naming the file when it cannot be read, holds no token, or holds more than one
/// field or a token [`token_problem`] refuses (the line is never quoted); one line naming
/// [`TOKEN_VAR`] when its value is such a token.
pub fn resolve(file: Option<&Path>, env: Option<&str>) -> Result<Option<Secret>, TokenError> {
    let Some(f) = file else {
        let Some(t) = env.map(str::trim).filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        return match token_problem(t) {
            Some(why) => Err(TokenError::Variable(why)),
            None => Ok(Some(Secret::new(t))),
        };
    };
    let text = std::fs::read_to_string(f).map_err(|source| TokenError::Read {
        path: f.to_path_buf(),
        source,
    })?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .ok_or_else(|| TokenError::Empty(f.to_path_buf()))?;
    if line.split_whitespace().count() != 1 || line.len() > MAX_TOKEN_LEN {
        return Err(TokenError::NotOne(f.to_path_buf()));
    }
    if let Some(why) = token_problem(line) {
        return Err(TokenError::Unusable {
            path: f.to_path_buf(),
            why,
        });
    }
    Ok(Some(Secret::new(line)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_wins_over_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        std::fs::write(&f, "# drun token\n\n  abc  \n").unwrap();
        let t = resolve(Some(&f), Some("env")).unwrap().unwrap();
        assert_eq!(t.expose(), "abc");
        assert_eq!(resolve(None, Some("env")).unwrap().unwrap().expose(), "env");
        assert_eq!(resolve(None, Some("  ")).unwrap(), None);
        assert_eq!(resolve(None, None).unwrap(), None);
    }

    #[test]
    fn bad_token_files_are_one_line_without_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
        assert!(resolve(Some(&f), None)
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
        std::fs::write(&f, "\n# only a comment\n").unwrap();
        assert!(resolve(Some(&f), None)
            .unwrap_err()
            .to_string()
            .contains("holds no token"));
        std::fs::write(&f, "two secretwords\n").unwrap();
        let e = resolve(Some(&f), None).unwrap_err().to_string();
        assert!(e.contains("one token") && !e.contains("secretwords"), "{e}");
        // gRPC metadata carries printable ASCII only: anything else could never be sent.
        for bad in ["sécret", "tab\u{7}bell"] {
            std::fs::write(&f, bad).unwrap();
            let e = resolve(Some(&f), None).unwrap_err().to_string();
            assert!(e.contains("printable ASCII") && !e.contains(bad), "{e}");
            let e = resolve(None, Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(TOKEN_VAR) && e.contains("printable ASCII"),
                "{e}"
            );
        }
    }
}
