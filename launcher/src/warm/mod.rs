//! Warm workers: a pre-started interpreter per local rank that has imported torch and waits
//! to become the next generation's worker, so a restart does not pay for `import torch`.
//!
//! # Theory of operation
//!
//! * When the agent starts, before its first rendezvous, and right after each generation's
//!   workers start, the agent starts one **warm interpreter** per local rank
//!   ([`pool::prestart`], [`pool::refill`]), so the first generation's `import torch` overlaps
//!   the rendezvous wait and a restart's overlaps the training: `python -u -c <bootstrap.py>` spawned exactly as a cold
//!   worker is (its own session, PDEATHSIG, piped output, the stdin rule), with the worker's
//!   environment of this generation (before the first: [`crate::env::base_env`], what every
//!   worker of the node has whatever the plan) plus one more descriptor, a socket at fd 3
//!   (`DRUN_WARM_FD`). The bootstrap imports `torch` and `torch.distributed`, writes one status
//!   line (ready, import time, threads; or why torch would not import) and blocks reading.
//! * On the next start of the workers, [`decide::choose`] (pure) picks warm or cold per rank.
//!   Warm: the group writes the **hand-off** (one JSON line: the complete environment that
//!   `worker_env` builds for a cold worker, `sys.argv`, `sys.orig_argv`, cwd) and the
//!   interpreter becomes `python -u script.py`: environment replaced wholesale, signal
//!   dispositions as before the import, `sys.path[0]` the script's real directory, a fresh
//!   `__main__` with an absolute `__file__`, the script compiled and run in it; an uncaught
//!   exception prints its traceback and exits 1, `SystemExit` passes through. Its pid, process
//!   group, pipes and reaping are a cold worker's, so the group, the guard and the stop sequence
//!   see no difference; its start instant is the hand-off.
//! * An interpreter still importing is handed off too: it reaches the script no later than a
//!   new one that would start the import from scratch. A dead one (its exit was reaped, or the
//!   write fails) means a cold start with a line saying why. One that could not import torch
//!   turns warm workers off for the run (every other interpreter would fail alike); were it
//!   handed off anyway, it `exec`s the cold command line itself.
//! * Not a `python script.py` entrypoint (`--no-python`, `-m`, `--run-path`, a zip or
//!   directory), `--warm-workers off`, or a generation running the `--preflight` check: cold.
//! * No refill when no generation can follow ([`decide::next_generation`]): on the in-process
//!   rendezvous (one node, nobody joins or leaves) once `--max-restarts` is spent, e.g. every
//!   default `--standalone` run (`--max-restarts 0`); the spares would import torch beside the
//!   workers for nothing.
//! * The teardown sweep spares the warm interpreters (they are the agent's children and carry
//!   `DRUN_AGENT_ID`); the agent kills them at exit, and PDEATHSIG kills them if it dies.
//!
//! Why the environment of the *current* generation at spawn: libgomp and OpenBLAS read
//! `OMP_NUM_THREADS` when torch is loaded, so the interpreter must import torch with the value
//! its worker would have; everything a worker's environment holds at import time comes from
//! the agent's own environment and the local world size, the same in every generation. What
//! changes between generations (RANK, WORLD_SIZE, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
//! ...) is read by torch at `init_process_group`, after the hand-off.
//!
//! Cost: one more interpreter with torch loaded per local rank while training (a few hundred
//! MB of resident memory each on CPU; no CUDA context, since the bootstrap never touches CUDA).

pub mod decide;
pub mod handoff;
pub mod pool;

pub use pool::{prestart, refill, WarmPool};

/// `--warm-workers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WarmWorkers {
    /// Keep a warm interpreter per local rank for the next generation.
    #[default]
    On,
    /// Every worker starts a new interpreter.
    Off,
}
