//! The history of a chaos run: the JSON lines `tests/workers/chaos_worker.py` appends to
//! `history.jsonl`, and the ledger as `drun-rendezvous status --json` shows it.

use serde::Deserialize;

/// Where a generation's ranks resumed from (`drun.resume_info()`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct Resume {
    pub step: u64,
    /// The generation that sealed it.
    pub generation: u64,
    pub epoch: u64,
    /// Samples of that epoch's permutation consumed before it, over all ranks.
    pub samples: u64,
}

/// A data cursor as committed: epoch and samples consumed in it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct Cursor {
    pub epoch: u64,
    pub samples: u64,
}

/// What a record says, by its `kind`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Kind {
    Start {
        resume: Option<Resume>,
    },
    Perm {
        epoch: u64,
        perm: Vec<u64>,
    },
    Step {
        step: u64,
        epoch: u64,
        idx: Vec<u64>,
    },
    Commit {
        step: u64,
        cursor: Cursor,
        sealed: bool,
    },
    Refused {
        step: u64,
        error: String,
    },
    Done {
        step: u64,
    },
}

/// One history line: who wrote it (generation, rank, world size, agent slot, pid), when (Unix
/// seconds) and what.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Record {
    pub gen: u64,
    pub rank: u32,
    pub world: u32,
    pub node: usize,
    pub pid: i32,
    pub t: f64,
    #[serde(flatten)]
    pub kind: Kind,
    /// Line number in the history file (1-based), for excerpts.
    #[serde(skip)]
    pub line: usize,
    #[serde(skip)]
    pub text: String,
}

/// Parses a history file's text; a line cut short by a SIGKILL mid-write is an error naming it.
pub fn parse(text: &str) -> Result<Vec<Record>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let mut r: Record =
                serde_json::from_str(l).map_err(|e| format!("history line {}: {e}: {l}", i + 1))?;
            r.line = i + 1;
            r.text = l.to_string();
            Ok(r)
        })
        .collect()
}

/// One sealed checkpoint in the ledger.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct Sealed {
    pub step: u64,
    pub generation: u64,
}

/// The store's checkpoint ledger (`status --json` → `checkpoints`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Ledger {
    /// Every sealed checkpoint, oldest first.
    pub sealed: Vec<Sealed>,
    /// Checkpoint ids that failed verification → why.
    pub bad: std::collections::BTreeMap<String, String>,
}

impl Ledger {
    /// Whether drun marked checkpoint (`step`, `generation`) bad (failed verification); the
    /// ledger's ids are `"{step:020}-{generation:020}"`.
    pub fn is_bad(&self, step: u64, generation: u64) -> bool {
        self.bad.keys().any(|id| {
            id.split_once('-')
                .and_then(|(s, g)| Some((s.parse().ok()?, g.parse().ok()?)))
                == Some((step, generation))
        })
    }
}

/// How the run ended, as the runner observed it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Exit codes of the agents that were not killed or told to leave.
    pub finishers: Vec<i32>,
    /// Exit codes of the agents that left on SIGTERM.
    pub leavers: Vec<i32>,
    /// Exit codes of the agents that stopped at a preemption warning (documented: 5), those
    /// that finished the run before the warning took effect (0) not counted.
    pub preempted: Vec<i32>,
    /// Preemption warnings the warned agent dropped (it logged "received SIGUSR1 before
    /// workers started; nothing to relay" under `--on-preempt checkpoint`).
    pub dropped_warnings: usize,
    /// Agents that stayed but came too late: exit 3, "run ... already finished" (documented:
    /// a closed run refuses new nodes).
    pub late: usize,
    /// Pids of the run still alive after it ended (and a grace period).
    pub leftover: Vec<i32>,
    /// Checkpoints (step, generation) whose shard the runner corrupted.
    pub corrupted: Vec<(u64, u64)>,
    /// Time from the first agent's start to the last exit, ms; and the bound the schedule allows.
    pub elapsed_ms: u64,
    pub bound_ms: u64,
}

/// The data a run trains on: dataset length, global batch, epochs.
#[derive(Clone, Copy, Debug)]
pub struct Data {
    pub len: u64,
    pub global_batch: u64,
    pub epochs: u64,
}

impl Data {
    pub fn steps_per_epoch(&self) -> u64 {
        self.len / self.global_batch
    }

    pub fn total_steps(&self) -> u64 {
        self.steps_per_epoch() * self.epochs
    }
}
