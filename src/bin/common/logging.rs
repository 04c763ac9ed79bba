//! Agent and server logs on stderr: compact human lines, or one JSON object per line
//! (`--log-format json`); `DRUN_LOG` (or `RUST_LOG`) overrides the default level. Write errors
//! (a closed stderr) are ignored, never reported by panicking.

use drun_rendezvous::LogFormat;
use tracing_subscriber::EnvFilter;

#[path = "flat_json.rs"]
mod flat_json;

/// Installs the global subscriber with `default` (e.g. `info`) unless the environment says
/// otherwise, writing records in `format`.
pub fn install(default: &str, format: LogFormat) {
    let filter = std::env::var("DRUN_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{default},h2=warn,tower=warn")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Human => builder
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .compact()
            .init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(flat_json::FlatJson)
            .init(),
    }
}
