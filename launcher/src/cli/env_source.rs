//! Naming the environment variable behind a flag value clap refused: clap says
//! `invalid value 'abc' for '--max-restarts <MAX_RESTARTS>'` also when the value came from
//! `PET_MAX_RESTARTS` (Kubeflow sets it) and the command line holds no `--max-restarts`, which
//! sends the user looking for a flag they never gave.

use std::ffi::{OsStr, OsString};

use clap::error::{ContextKind, ContextValue};
use clap::CommandFactory;

/// `NAME=value` of the environment variable that supplied the value of the flag `err` is
/// about ([`flag_env_source`]); `None` when clap's error is not about one flag's value.
pub fn env_source(
    err: &clap::Error,
    argv: &[OsString],
    env: impl Fn(&OsStr) -> Option<OsString>,
) -> Option<String> {
    let ContextValue::String(arg) = err.get(ContextKind::InvalidArg)? else {
        return None;
    };
    flag_env_source(arg.split_whitespace().next()?, argv, env)
}

/// `NAME=value` of the environment variable behind `flag` (`--max-restarts`) when `flag` is
/// absent from `argv` (in either spelling, `--max-restarts` or `--max_restarts`, with `=` or
/// not) and its variable is set in `env` (a lookup such as `std::env::var_os`); `None`
/// otherwise, also for a flag that reads no variable.
pub fn flag_env_source(
    flag: &str,
    argv: &[OsString],
    env: impl Fn(&OsStr) -> Option<OsString>,
) -> Option<String> {
    let long = flag.strip_prefix("--")?;
    let cmd = super::Args::command();
    let arg = cmd.get_arguments().find(|a| a.get_long() == Some(long))?;
    let given = argv.iter().skip(1).filter_map(|a| a.to_str()).any(|a| {
        let name = a.split('=').next().unwrap_or(a);
        arg.get_long_and_visible_aliases()
            .into_iter()
            .flatten()
            .any(|l| name == format!("--{l}"))
    });
    if given {
        return None;
    }
    let var = arg.get_env()?;
    let value = env(var)?;
    Some(format!(
        "{}={}",
        var.to_string_lossy(),
        value.to_string_lossy()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn os(argv: &[&str]) -> Vec<OsString> {
        argv.iter().map(OsString::from).collect()
    }

    /// The error clap gives for `--max-restarts abc`, whichever way the value came.
    fn refused() -> clap::Error {
        super::super::Args::try_parse_from(["drun", "--max-restarts", "abc", "train.py"])
            .expect_err("abc is not a count")
    }

    fn pet(name: &OsStr) -> Option<OsString> {
        (name == "PET_MAX_RESTARTS").then(|| "abc".into())
    }

    #[test]
    fn a_refused_value_from_the_environment_names_its_variable_not_only_the_flag() {
        let e = refused();
        assert_eq!(
            env_source(&e, &os(&["drun", "--standalone", "train.py"]), pet).as_deref(),
            Some("PET_MAX_RESTARTS=abc")
        );
        // Given on the command line (either spelling), the flag is the source.
        for argv in [
            &["drun", "--max-restarts", "abc", "train.py"][..],
            &["drun", "--max_restarts=abc", "train.py"],
        ] {
            assert_eq!(env_source(&e, &os(argv), pet), None, "{argv:?}");
        }
        // Nothing in the environment: nothing to name.
        assert_eq!(env_source(&e, &os(&["drun", "train.py"]), |_| None), None);
    }

    #[test]
    fn a_value_refused_after_parsing_names_its_variable_too() {
        let nnodes = |name: &OsStr| (name == "PET_NNODES").then(|| OsString::from("x"));
        let argv = os(&["drun", "train.py"]);
        assert_eq!(
            flag_env_source("--nnodes", &argv, nnodes).as_deref(),
            Some("PET_NNODES=x")
        );
        assert_eq!(flag_env_source("--no-such-flag", &argv, nnodes), None);
    }
}
