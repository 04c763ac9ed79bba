//! drun's per-node agent: a torchrun-compatible launcher that supervises worker processes.
//!
//! # Theory of operation
//!
//! `drun` parses torchrun's command line ([`Args`]) and validates it into a [`LaunchConfig`]
//! (bad input stops here: one line, exit 2, nothing spawned): [`config::validate`] is a pure
//! function of the arguments and what was read from the machine ([`config::Host`]), and
//! [`config::prepare`] does the filesystem work after it. The agent ([`run`]) then (spawning,
//! reaping, signalling and sweeping workers through [`os::Os`], which unit tests fake):
//!
//! 1. becomes a child subreaper and starts the spawner thread and the cleanup guard
//!    ([`os`]), so no worker or grandchild can outlive it, even under SIGKILL;
//! 2. joins the rendezvous (for one node: the in-process [`drun_rendezvous::Round`] on the
//!    embedded in-memory store) with a freshly reserved MASTER_PORT and receives the plan of a
//!    new generation;
//! 3. spawns the local workers with torchrun's environment ([`mod@env`]), each in its own session
//!    and process group, their output pumped line by line ([`logs`]);
//! 4. supervises them: one loop `select!`s over SIGCHLD, a `--monitor-interval` tick, the
//!    handled signals, the session's events, the worker API (step beacons included) and the
//!    hang-check and pace ticks, and feeds each to the pure transition function
//!    [`agent::step()`]; the effects it returns (spawn, stop, send a request, dump stacks,
//!    summary, requeue ...) are carried out by the same loop. All exit 0 → exit 0. One fails →
//!    the group is stopped (SIGTERM to each process group, `--shutdown-timeout`, SIGKILL,
//!    orphans swept), the failure reported, and the session decides: while `--max-restarts`
//!    allows, a new generation; else the failure summary ([`summary`]) and exit 1. A handled
//!    signal is forwarded once, the group stopped the same way, exit 128+N.
//!
//! The agent's states ([`agent::Phase`]; supervision: `docs/architecture.md` §6):
//!
//! ```text
//!                 Formed               verified + spawned
//!   ┌─▶ Forming ───────────▶ Verifying ──────────────────▶ Running { save }
//!   │     │ ▲ Fenced: same       │ bad resume point            │ exit, failure, partial success,
//!   │     └─┘ candidate, 200 ms  ▼                             │ Reform, Fenced (SIGKILL), Finished,
//!   │                      AwaitingReform                      │ signal, preemption seal
//!   │                            │ Reform                      ▼
//!   ├────────────────────────────┘           Stopping { Grace ─▶ Killing ─▶ Cleaning; then }
//!   │                                          │ Rejoin     │ Report         │ AwaitEnd
//!   ├──────────────────────────────────────────┘            ▼                ▼
//!   ├──────────────── restart ──────────────────── Reporting ◀─ late ─ AwaitingEnd
//!   │                                                │ no restart            │ Finished
//!   └──────────────── Reform / Fenced ───────────────┼───────────────────────┘
//!                                                    ▼                       ▼
//!                                       Done(1: summary)   Done(exit: 0/1, 128+N, 5, error)
//! ```
//!
//! A teardown signal ends every phase without workers at once (exit 128+N); while stopping it
//! is noted (a second SIGINT kills at once) and wins over a re-join.
//!
//! The agent that is node rank 0 of a generation also serves the workers' c10d store on
//! MASTER_PORT ([`worker_store`]) until it leaves that generation, as torchrun's agent does.

/// `eprintln!` that never panics: a closed stderr (`drun ... 2>&1 | head -1`) must not turn a
/// clean shutdown into a panic.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// `eprint!` that never panics (see [`say!`]).
#[macro_export]
macro_rules! say_raw {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($t)*);
    }};
}

pub mod agent;
pub mod ckpt;
pub mod cli;
pub mod command;
pub mod config;
pub mod container;
pub mod dns;
pub mod doctor;
pub mod env;
pub mod error;
pub mod exit;
pub mod fingerprint;
pub mod gpu_health;
pub mod group;
pub mod hex;
pub mod k8s;
pub mod logs;
pub mod mac;
pub mod metrics;
pub mod numa;
pub mod os;
pub mod peers;
pub mod phases;
pub mod preflight;
pub mod rdzv;
pub mod slurm;
pub mod slurm_token;
pub mod status;
pub mod std_spec;
pub mod summary;
pub mod warm;
pub mod worker_store;

#[cfg(any(test, fuzzing))]
pub mod checks;
#[cfg(test)]
mod props;

pub use agent::run;
pub use cli::Args;
pub use config::{LaunchConfig, RendezvousMode, Timing};
pub use drun_rendezvous::LogFormat;
pub use error::{ConfigError, LaunchError};
pub use exit::AgentExit;
pub use os::guard::{guard_main, GUARD_ARG};
