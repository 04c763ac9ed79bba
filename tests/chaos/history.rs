//! The history of a chaos run: the JSON lines `tests/workers/chaos_worker.py` appends to
//! `history.jsonl`, the ledger as `drun-rendezvous status --json` shows it, and the resume points
//! the agents' logs say they verified.

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

/// The kernel's page: a write to a file that a SIGKILL interrupts stops at the end of one.
const PAGE: usize = 4096;

/// Parses a history file's text. A writer SIGKILLed in its one `write` of a line may leave the
/// line's head up to a page boundary of the file (the kernel checks for a fatal signal between
/// the pages it copies; seen in CI: `{"resume": {"step` up to byte 16,384); the next writer's
/// line follows it on the same line. Such a head, cut exactly at a page boundary and followed by
/// a whole line, is the killed writer's lost line and is dropped; any other line that does not
/// parse is an error naming it.
pub fn parse(text: &str) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    let mut offset = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += l.len();
        let l = l.trim_end_matches('\n');
        if l.trim().is_empty() {
            continue;
        }
        let mut r = serde_json::from_str::<Record>(l)
            .or_else(|e| after_torn_head(l, start).ok_or(e))
            .map_err(|e| format!("history line {}: {e}: {l}", i + 1))?;
        r.line = i + 1;
        r.text = l.to_string();
        out.push(r);
    }
    Ok(out)
}

/// The whole line after a torn head that ends at a page boundary (`start`: the line's offset in
/// the file), if there is one.
fn after_torn_head(l: &str, start: usize) -> Option<Record> {
    let cut = (start + 1..start + l.len())
        .find(|at| at % PAGE == 0)
        .map(|at| at - start)?;
    l[cut..]
        .starts_with('{')
        .then(|| serde_json::from_str(&l[cut..]).ok())?
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
    /// The shards the runner corrupted.
    pub corrupted: Vec<Corruption>,
    /// The resume points the agents verified and took, from their logs.
    pub verified: Vec<Verified>,
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

/// A shard the runner corrupted: of checkpoint (`step`, `generation`), at `t` (Unix seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Corruption {
    pub step: u64,
    pub generation: u64,
    pub t: f64,
}

/// A resume point an agent verified (`--ckpt-verify digest`) and took for generation `gen`:
/// checkpoint `step` saved by generation `saved_by`, at `t` (Unix seconds, its log's time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verified {
    pub gen: u64,
    pub step: u64,
    pub saved_by: u64,
    pub t: f64,
}

/// The resume points an agent's log (stderr, text format) says it verified and took: each
/// "resuming from checkpoint step S (saved by generation G ...", in the generation of the
/// "world formed: ... gen=N" line before it.
pub fn verified(log: &str) -> Vec<Verified> {
    let number =
        |s: &str| -> Option<u64> { s.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok() };
    let mut gen = None;
    let mut out = Vec::new();
    for line in log.lines() {
        if line.contains("world formed:") {
            gen = line.rsplit_once(" gen=").and_then(|(_, rest)| number(rest));
        }
        let Some((_, rest)) = line.split_once("resuming from checkpoint step ") else {
            continue;
        };
        let step = number(rest);
        let saved_by = rest
            .split_once("(saved by generation ")
            .and_then(|(_, r)| number(r));
        let t = line.split_whitespace().next().and_then(unix_seconds);
        if let (Some(gen), Some(step), Some(saved_by), Some(t)) = (gen, step, saved_by, t) {
            out.push(Verified {
                gen,
                step,
                saved_by,
                t,
            });
        }
    }
    out
}

/// Unix seconds of an RFC 3339 UTC time as the agents log it (`2026-12-04T20:26:17.474926Z`).
pub fn unix_seconds(ts: &str) -> Option<f64> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60) as f64 + sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chaos_history_reads_the_verified_resume_points_of_an_agent_log() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(unix_seconds("2000-03-01T00:00:01.5Z"), Some(951_868_801.5));
        assert_eq!(unix_seconds("2026-12-04T20:26:17Z"), Some(1_796_415_977.0));
        let log = "\
2026-12-04T20:26:09.0Z  INFO agent: world formed: 3 node(s) [a, b, c], world size 6 run=r gen=6 node=a
2026-12-04T20:26:09.1Z  INFO checkpoint step 6 verified (size and digest): 4 files
2026-12-04T20:26:09.2Z  INFO resuming from checkpoint step 6 (saved by generation 3 at world size 4, now 6); data
2026-12-04T20:26:17.4Z  INFO agent: world formed: 4 node(s) [a, b, c, d], world size 8 run=r gen=7 node=a
2026-12-04T20:26:17.5Z  INFO resuming from checkpoint step 12 (saved by generation 6 at world size 6, now 8); data
";
        let v = verified(log);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!((v[0].gen, v[0].step, v[0].saved_by), (6, 6, 3));
        assert_eq!((v[1].gen, v[1].step, v[1].saved_by), (7, 12, 6));
        assert!((v[1].t - 1_796_415_977.5).abs() < 1e-3);
    }
}
