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
