//! `drun-rendezvous`: the multi-node rendezvous server and its admin commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// drun's rendezvous server (multi-node groups).
#[derive(Debug, Parser)]
#[command(name = "drun-rendezvous", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the drun.v1 rendezvous protocol.
    Serve,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve => {
            eprintln!(
                "drun-rendezvous: error: the multi-node server is not in this build yet; \
                 single-node runs need none (drun --standalone)"
            );
            ExitCode::from(2)
        }
    }
}
