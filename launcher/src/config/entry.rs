//! The worker command as the command line gives it (`-m`, `--no-python`, `--run-path`).

use std::path::Path;

use clap::CommandFactory;

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
        let flag = script_and_args[0].clone();
        let nearest = nearest_flag(&flag, &long_flags());
        return Err(ConfigError::UnknownFlag { flag, nearest });
    }
    // argparse's REMAINDER drops one `--` right after the script, so torchrun does too.
    if script_and_args.get(1).is_some_and(|a| a == "--") {
        script_and_args.remove(1);
    }
    Ok(Entrypoint::unresolved(kind, &script_and_args, python))
}

/// Every long flag of drun's, with its aliases (torchrun's `--nproc_per_node` spellings): the
/// canonical name and each spelling that leads to it.
fn long_flags() -> Vec<(String, String)> {
    Args::command()
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            let mut all = vec![long.to_string()];
            all.extend(
                a.get_all_aliases()
                    .unwrap_or_default()
                    .iter()
                    .map(|s| s.to_string()),
            );
            Some(
                all.into_iter()
                    .map(|s| (format!("--{s}"), format!("--{long}")))
                    .collect::<Vec<_>>(),
            )
        })
        .flatten()
        .collect()
}

/// The flag of `flags` (spelling, canonical name) nearest to `given` (its `=VALUE` aside), when
/// one is near enough to be the one meant: at most one edit (an insertion, a deletion, a
/// substitution or two letters swapped) per four letters of the name, at most two; a name of
/// under four letters gets no guess.
pub(super) fn nearest_flag(given: &str, flags: &[(String, String)]) -> Option<String> {
    let given = given
        .split('=')
        .next()
        .unwrap_or(given)
        .trim_start_matches('-');
    let allowed = (given.chars().count() / 4).min(2);
    flags
        .iter()
        .map(|(spelling, canonical)| {
            let d = strsim::damerau_levenshtein(given, spelling.trim_start_matches('-'));
            (d, canonical)
        })
        .filter(|(d, _)| *d <= allowed)
        .min_by_key(|(d, _)| *d)
        .map(|(_, canonical)| canonical.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mistyped_flag_gets_the_nearest_and_a_stranger_gets_none() {
        let flags = long_flags();
        assert!(flags
            .iter()
            .any(|(s, c)| s == "--nproc_per_node" && c == "--nproc-per-node"));
        for (typo, meant) in [
            ("--nnodse", "--nnodes"),
            ("--nproc-per-nodes", "--nproc-per-node"),
            ("--nproc_per_nod", "--nproc-per-node"),
            ("--max-restart=3", "--max-restarts"),
            ("--rdzv-endpont", "--rdzv-endpoint"),
            ("--standlone", "--standalone"),
        ] {
            assert_eq!(nearest_flag(typo, &flags).as_deref(), Some(meant), "{typo}");
        }
        for stranger in ["--lr", "--batch-size", "-v", "--epochs"] {
            assert_eq!(nearest_flag(stranger, &flags), None, "{stranger}");
        }
    }
}
