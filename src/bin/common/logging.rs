//! Agent and server logs: compact lines on stderr, `DRUN_LOG` (or `RUST_LOG`) overrides the
//! default level. Write errors (a closed stderr) are ignored, never reported by panicking.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber with `default` (e.g. `info`) unless the environment says
/// otherwise.
pub fn install(default: &str) {
    let filter = std::env::var("DRUN_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{default},h2=warn,tower=warn")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .compact()
        .init();
}
