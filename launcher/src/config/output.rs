//! The workers' output ([`OutputConfig`]): files, console, rank filter, line prefix; validated
//! by [`output`].

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::parse::{parse_ranks_filter, ranks_filter_note};
use super::Host;
use crate::std_spec::StdSpec;
use crate::{Args, ConfigError};

/// Where the workers' output goes.
#[derive(Debug, Clone)]
pub struct OutputConfig {
    /// `--log-dir` base, or `None` for a temporary directory.
    pub log_dir: Option<PathBuf>,
    /// Streams sent only to files.
    pub redirects: StdSpec,
    /// Streams sent to files and the console.
    pub tee: StdSpec,
    /// Local ranks whose output reaches the console; `None` = all.
    pub local_ranks_filter: Option<BTreeSet<u32>>,
    /// Console line prefix template; `None` = `[rank${rank}]:`.
    pub prefix_template: Option<String>,
}

/// `--log-dir`, `--redirects`, `--tee`, `--local-ranks-filter` and the line prefix template
/// (`--log-line-prefix-template`, else a non-empty `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`);
/// a note when the filter names ranks this node does not have (`nproc` of them).
///
/// # Errors
/// A malformed `--redirects`, `--tee` or `--local-ranks-filter`.
pub(super) fn output(
    a: &Args,
    host: &Host,
    nproc: u32,
) -> Result<(OutputConfig, Option<String>), ConfigError> {
    let redirects = StdSpec::parse("--redirects", &a.redirects)?;
    let tee = StdSpec::parse("--tee", &a.tee)?;
    let local_ranks_filter = parse_ranks_filter(&a.local_ranks_filter)?;
    // An explicit empty template means "no prefix"; the environment variable only counts
    // when non-empty (torchrun treats it so).
    let prefix_template = a.log_line_prefix_template.clone().or_else(|| {
        host.var("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    });
    let note = ranks_filter_note(local_ranks_filter.as_ref(), nproc);
    let cfg = OutputConfig {
        log_dir: a.log_dir.clone(),
        redirects,
        tee,
        local_ranks_filter,
        prefix_template,
    };
    Ok((cfg, note))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, host};
    use super::*;

    fn refused(v: &[&str]) -> String {
        output(&args(v), &host(), 2)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn malformed_stream_specs_and_filters_are_refused() {
        assert!(refused(&["--redirects", "7", "t.py"]).starts_with("invalid --redirects '7'"));
        assert!(refused(&["--tee", "x", "t.py"]).starts_with("invalid --tee 'x'"));
        assert!(refused(&["--local-ranks-filter", "a", "t.py"])
            .starts_with("invalid --local-ranks-filter 'a'"));
    }

    #[test]
    fn a_filter_of_ranks_this_node_lacks_is_noted() {
        let (cfg, note) =
            output(&args(&["--local-ranks-filter", "5", "t.py"]), &host(), 2).expect("valid");
        assert_eq!(cfg.local_ranks_filter, Some([5].into()));
        assert!(note.is_some());
    }
}
