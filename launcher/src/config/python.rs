//! The worker interpreter, chosen from `--python`, `DRUN_PYTHON` and `PYTHON_EXEC`, and the
//! `PATH` a program named without a `/` is looked up on: checked up front, from the [`Host`]'s
//! environment only (pure). Whether the files exist is [`super::prepare`]'s business.

use std::path::{Path, PathBuf};

use super::Host;
use crate::command::{EntryKind, PythonSource};
use crate::{Args, ConfigError};

/// The interpreter asked for, if any, and where the request came from: `--python`, else a
/// non-empty `DRUN_PYTHON`, else `PYTHON_EXEC` (torchrun's override); `None`: `python3`.
///
/// # Errors
/// `DRUN_PYTHON` or `PYTHON_EXEC` set but empty.
pub(super) fn interpreter(
    a: &Args,
    host: &Host,
) -> Result<(Option<PathBuf>, PythonSource), ConfigError> {
    if let Some(p) = &a.python {
        return Ok((Some(p.clone()), PythonSource::Flag));
    }
    for (var, source) in [
        ("DRUN_PYTHON", PythonSource::DrunPython),
        ("PYTHON_EXEC", PythonSource::PythonExec),
    ] {
        match host.var(var) {
            Some(v) if v.trim().is_empty() => {
                return Err(ConfigError::Empty {
                    flag: var,
                    why: format!(
                    "unset it, or name the workers' interpreter (e.g. {var}=/opt/venv/bin/python)"
                ),
                })
            }
            Some(v) => return Ok((Some(PathBuf::from(v)), source)),
            None => {}
        }
    }
    Ok((None, PythonSource::Default))
}

/// Checks that `PATH` is set and not empty when a program must be looked up on it: the
/// interpreter (or, with `--no-python`, the executable) named without a `/`.
///
/// # Errors
/// [`ConfigError::Missing`] or [`ConfigError::Empty`] for `PATH`, with the fix.
pub(super) fn check_path(
    kind: EntryKind,
    script: &str,
    python: Option<&Path>,
    host: &Host,
) -> Result<(), ConfigError> {
    let (looked_up, fix) = match kind {
        EntryKind::Binary => (script.to_string(), "give the executable's full path"),
        _ => (
            python.map_or("python3".into(), |p| p.display().to_string()),
            "pass --python /path/to/python",
        ),
    };
    if looked_up.contains('/') {
        return Ok(());
    }
    let why = format!(
        "{looked_up} is looked up on PATH; set it (e.g. export PATH=/usr/local/bin:/usr/bin:/bin) or {fix}"
    );
    match host.var("PATH") {
        None => Err(ConfigError::Missing { flag: "PATH", why }),
        Some(p) if p.split(':').all(|d| d.trim().is_empty()) => {
            Err(ConfigError::Empty { flag: "PATH", why })
        }
        Some(_) => Ok(()),
    }
}
