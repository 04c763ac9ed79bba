//! The worker command as the command line gives it (`-m`, `--no-python`, `--run-path`).

use std::path::Path;

use crate::command::{EntryKind, Entrypoint};
use crate::{Args, ConfigError};

/// The entrypoint of `a` run with `python` (see [`super::python`]), not yet resolved against the filesystem (see [`super::prepare`]).
///
/// # Errors
/// `--no-python` with `-m`; a flag where the training script should be.
pub(super) fn entrypoint(a: &Args, python: Option<&Path>) -> Result<Entrypoint, ConfigError> {
    let kind = if a.run_path {
        EntryKind::RunPath
    } else if a.no_python {
        if a.module {
            return Err(ConfigError::Conflict("--no-python", "-m/--module"));
        }
        EntryKind::Binary
    } else if a.module {
        EntryKind::Module
    } else {
        EntryKind::Script
    };
    let mut script_and_args = a.script_and_args.clone();
    if script_and_args[0].starts_with('-') && script_and_args[0].len() > 1 {
        return Err(ConfigError::UnknownFlag(script_and_args[0].clone()));
    }
    // argparse's REMAINDER drops one `--` right after the script, so torchrun does too.
    if script_and_args.get(1).is_some_and(|a| a == "--") {
        script_and_args.remove(1);
    }
    Ok(Entrypoint::unresolved(kind, &script_and_args, python))
}
