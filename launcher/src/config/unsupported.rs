//! torchrun flags drun does not implement: refused by name, with what to do instead.

use crate::{Args, ConfigError};

/// Refuses the first torchrun flag of `a` that drun does not implement.
///
/// # Errors
/// [`ConfigError::Unsupported`] naming the flag and the alternative.
pub(super) fn refuse_unsupported(a: &Args) -> Result<(), ConfigError> {
    let unsupported = |flag: &'static str, why: &str| {
        Err(ConfigError::Unsupported {
            flag,
            why: why.to_string(),
        })
    };
    if a.logs_specs.is_some() {
        return unsupported("--logs-specs", "use --log-dir, --redirects and --tee");
    }
    if a.duplicate_stdout_filters.is_some() || a.duplicate_stderr_filters.is_some() {
        return unsupported(
            "--duplicate-stdout/stderr-filters",
            "grep the --log-dir files",
        );
    }
    if a.print_completion.is_some() {
        return unsupported("--print-completion", "no shell completion yet");
    }
    if let Some(h) = a.event_log_handler.as_deref().filter(|h| *h != "null") {
        return unsupported(
            "--event-log-handler",
            &format!("only 'null' is accepted, got '{h}'"),
        );
    }
    Ok(())
}
