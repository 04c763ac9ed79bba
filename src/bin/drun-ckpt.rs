//! `drun-ckpt`: the worker API of a drun agent (`DRUN_AGENT_SOCK`) for shell and non-Python
//! workers, which prints the agent's JSON answer on stdout; and, with no agent, what an
//! operator asks of a checkpoint directory (`list`, `verify`: `drun_launcher::ckpt::inspect`).
//!
//! Exit codes: 0 accepted (for `should-save`: a save is requested; for `verify`: every file
//! is what its manifest recorded), 1 refused (one line on stderr naming why) or, for
//! `should-save`, no save requested, or, for `verify`, a file missing or changed, 2 usage error,
//! not under drun, or no checkpoint at the path given.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use drun_launcher::ckpt::digest::{self, DigestKind};
use serde_json::{json, Value};

/// Talk to the drun agent that started this worker (checkpoint ledger API).
#[derive(Parser)]
#[command(name = "drun-ckpt", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Report this rank's checkpoint of STEP: hashes FILES (SHA-256) and sends them with the cursor.
    /// No FILES: a rank that wrote nothing of its own; no cursor: a job without one.
    Commit {
        /// Step the checkpoint was taken after.
        #[arg(long)]
        step: u64,
        /// Global data cursor as JSON (see docs/reference/worker-api.md), e.g. '{"epoch":0,"consumed_in_epoch":640}'.
        #[arg(long, conflicts_with = "samples")]
        cursor: Option<String>,
        /// Shorthand for a cursor of epoch 0 with this many samples consumed (in the epoch and in
        /// total).
        #[arg(long)]
        samples: Option<u64>,
        /// Files written (made absolute); none for a rank with nothing of its own.
        files: Vec<PathBuf>,
    },
    /// Print what every rank resumes from (`"resume": null` to start fresh).
    Resume,
    /// Exit 0 when a coordinated save is requested, 1 otherwise.
    ShouldSave,
    /// Step beacon (lets drun report how much work a re-form loses).
    Progress {
        /// Step reached.
        step: u64,
    },
    /// The sealed checkpoints under DIR (a --ckpt-dir): run, step, generation, world size,
    /// files, size, age, and which one `latest` names. Needs no agent.
    List {
        /// A --ckpt-dir.
        dir: PathBuf,
    },
    /// Reads every file of a checkpoint and checks its size and digest (SHA-256 or BLAKE3, as
    /// the manifest names it) against its manifest:
    /// PATH is a drun-manifest-*.json file or a --ckpt-dir (its `latest`). Needs no agent.
    Verify {
        /// A manifest file, or a directory with a `latest` pointer.
        path: PathBuf,
    },
}

/// What `list` or `verify` says: (the lines to print, exit code) or (one error line, exit
/// code).
type Said = Result<(Vec<String>, u8), (String, u8)>;

/// `list` and `verify` (`None`: a command for the agent).
fn inspect(command: &Command) -> Option<Said> {
    use drun_launcher::ckpt::{inspect, read_adoptable, verify};
    match command {
        Command::List { dir } => Some(match inspect::list(dir) {
            Ok(list) => {
                let now_ms = drun_rendezvous::clock::now_ms();
                Ok((inspect::render(&list, now_ms), 0))
            }
            Err(e) => Err((format!("cannot read {}: {e}", dir.display()), 2)),
        }),
        Command::Verify { path } => Some((|| {
            let (file, m) = read_adoptable(path).map_err(|e| {
                // A missing or resized file is a damaged checkpoint; no manifest is a usage error.
                if e.is_damage() {
                    (e.to_string(), 1)
                } else {
                    (
                        format!("{e}; give a drun-manifest-*.json file, or a --ckpt-dir whose `latest` names one"),
                        2,
                    )
                }
            })?;
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            let v = verify::verify(&m, drun_launcher::ckpt::VerifyMode::Digest, threads)
                .map_err(|e| (e.to_string(), 1))?;
            Ok((
                vec![format!(
                    "checkpoint step {} (generation {}) of run {}: {} file(s), {}, every size and digest as its manifest records ({:.2} s; {})",
                    m.step,
                    m.generation,
                    m.run_id,
                    v.files,
                    drun_rendezvous::human::bytes(v.bytes),
                    v.took.as_secs_f64(),
                    file.display()
                )],
                0,
            ))
        })()),
        _ => None,
    }
}

fn env_u64(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn request(msg: &Value) -> Result<Value, String> {
    let path = std::env::var_os("DRUN_AGENT_SOCK")
        .ok_or("not running under drun (DRUN_AGENT_SOCK is unset)")?;
    let mut s = UnixStream::connect(&path).map_err(|e| {
        format!(
            "cannot reach the drun agent at {}: {e}",
            PathBuf::from(&path).display()
        )
    })?;
    let mut line = serde_json::to_vec(msg).expect("json serializes");
    line.push(b'\n');
    s.write_all(&line).map_err(|e| e.to_string())?;
    let mut answer = String::new();
    BufReader::new(s)
        .read_line(&mut answer)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&answer).map_err(|e| format!("undecodable answer from the agent: {e}"))
}

fn run(cli: Cli) -> Result<(Value, bool), (String, u8)> {
    let rank = env_u64("RANK");
    let msg = match cli.command {
        Command::Commit {
            step,
            cursor,
            samples,
            files,
        } => {
            let cursor: Value = match (cursor, samples) {
                (Some(c), _) => serde_json::from_str(&c)
                    .map_err(|e| (format!("--cursor is not JSON: {e}"), 2))?,
                (None, Some(n)) => json!({"epoch": 0, "consumed_in_epoch": n, "consumed_total": n}),
                (None, None) => Value::Null,
            };
            let mut reports = Vec::new();
            for f in files {
                let abs =
                    std::path::absolute(&f).map_err(|e| (format!("{}: {e}", f.display()), 2))?;
                // Reported as a rank reports its own files: with their SHA-256.
                let (sha256, bytes) = digest::file(&abs, DigestKind::Sha256)
                    .map_err(|e| (format!("{}: {e}", abs.display()), 2))?;
                reports.push(json!({"path": abs, "bytes": bytes, "sha256": sha256.to_string()}));
            }
            json!({"op": "commit", "rank": rank, "generation": env_u64("DRUN_GENERATION"),
                   "step": step, "files": reports, "cursor": cursor})
        }
        Command::Resume => json!({"op": "resume"}),
        Command::ShouldSave => json!({"op": "should_save", "rank": rank}),
        Command::Progress { step } => json!({"op": "progress", "rank": rank, "step": step}),
        // Answered in `main`, without an agent ([`inspect`]).
        Command::List { .. } | Command::Verify { .. } => unreachable!("answered without an agent"),
    };
    let answer = request(&msg).map_err(|e| (e, 2))?;
    if answer["ok"] != json!(true) {
        let e = answer["error"].as_str().unwrap_or("refused").to_string();
        return Err((e, 1));
    }
    let yes = msg["op"] != "should_save" || answer["save"] == json!(true);
    Ok((answer, yes))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match inspect(&cli.command) {
        Some(Ok((lines, code))) => {
            for l in lines {
                println!("{l}");
            }
            return ExitCode::from(code);
        }
        Some(Err((e, code))) => {
            eprintln!("drun-ckpt: {e}");
            return ExitCode::from(code);
        }
        None => {}
    }
    match run(cli) {
        Ok((answer, yes)) => {
            println!("{answer}");
            ExitCode::from(if yes { 0 } else { 1 })
        }
        Err((e, code)) => {
            eprintln!("drun-ckpt: {e}");
            ExitCode::from(code)
        }
    }
}
