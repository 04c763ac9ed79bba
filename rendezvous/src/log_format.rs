//! How the agent and the rendezvous server write their log records: `--log-format` /
//! `DRUN_LOG_FORMAT`. Worker output on the console is never a log record and keeps its shape.

/// The format of the log records on stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Compact human lines: `time LEVEL message key=value ...`.
    #[default]
    Human,
    /// One JSON object per line: `timestamp`, `level`, `message` and every field of the record
    /// and of its spans (`run`, `gen`, `node`, `rank`, ...) at the top level.
    Json,
}
