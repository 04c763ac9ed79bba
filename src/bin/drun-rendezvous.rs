//! `drun-rendezvous`: the multi-node rendezvous server and its admin commands. Parses the
//! command line, installs logging, runs the command ([`drun_rendezvous::server`]).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use drun_rendezvous::server::{self, Command};
use drun_rendezvous::LogFormat;

/// drun's rendezvous server: forms multi-node groups for `drun` agents.
#[derive(Debug, Parser)]
#[command(name = "drun-rendezvous", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The server's log records: `human` lines or `json`, one object per line with `run` and
    /// `node` as fields where a record concerns one.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "DRUN_LOG_FORMAT",
        default_value_t = LogFormat::Human
    )]
    log_format: LogFormat,
}

/// mimalloc (its v2 line) instead of glibc's malloc: a formation is thousands of sessions
/// allocating and freeing small buffers on every worker thread at once, and glibc's arenas
/// spent a fifth of the server's CPU there, some of it waiting on their locks
/// (`docs/contributing/benchmarks.md`, issue 37). v2 rather than v3: the same CPU, and about
/// 30 MiB less resident at 1,024 agents. Without transparent huge pages (`no_thp`): with them the
/// kernel zeroed 2 MiB pages for a fifth of the server's CPU while 10,000 agents formed.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/logging.rs"]
mod logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::install("info", cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime can start on the main thread");
    match runtime.block_on(server::run(cli.command, cli.log_format)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stderr is no reason to panic.
            let _ = writeln!(std::io::stderr(), "drun-rendezvous: error: {e}");
            ExitCode::from(e.code())
        }
    }
}
