//! The flight recorder's verdict on a hang: torch's per-rank record of the collectives of every
//! process group (`_dump_fr_trace_json`, written by the worker's `drun` helper when the agent
//! asks, see `python/drun/_flight.py`), judged purely: per process group, the collective some
//! ranks wait in and the ranks that never entered it, or ranks that entered the same collective
//! number with different operations or sizes (a desync).
//!
//! Only the ranks whose dumps are at hand are judged: the agent judges its node's; each node also
//! reports its ranks' dumps, cut to what the judgement reads ([`compact`]), and `status` judges
//! every node's together, so that a rank on another node that never entered a collective is
//! named.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

#[cfg(test)]
mod tests;

/// Why no rank's dump holds a collective.
const NOTHING_RECORDED: &str = "the flight recorder holds no collective (off: TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is 0; or none was called yet)";

/// What the agent got from one local rank when it asked for its flight recorder.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Nobody listened: the worker does not call `drun.progress` (or predates this helper).
    NotListening,
    /// It listened but wrote no dump in time.
    NoAnswer,
    /// The file it wrote.
    Written(String),
}

/// The file a worker writes: torch's dump per backend, or why there is none.
#[derive(Debug, Deserialize)]
struct WorkerDump {
    #[serde(default)]
    backends: BTreeMap<String, TorchDump>,
    #[serde(default)]
    error: Option<String>,
}

/// The parts of torch's `_dump_fr_trace_json` that are judged.
#[derive(Debug, Deserialize)]
struct TorchDump {
    #[serde(default)]
    entries: Vec<Entry>,
    /// Group name → `{"ranks": "[0, 1]", ...}` (NCCL; gloo keys its one entry by "").
    #[serde(default)]
    pg_config: BTreeMap<String, PgConfig>,
}

#[derive(Debug, Deserialize)]
struct PgConfig {
    #[serde(default)]
    ranks: String,
}

/// One recorded collective.
#[derive(Debug, Clone, Deserialize)]
struct Entry {
    collective_seq_id: u64,
    #[serde(default)]
    is_p2p: bool,
    pg_id: u64,
    /// (group name, description).
    process_group: (String, String),
    /// `gloo:all_reduce`, `nccl:broadcast`, ...
    profiling_name: String,
    #[serde(default)]
    input_sizes: Vec<Vec<i64>>,
    #[serde(default)]
    input_dtypes: Vec<String>,
    /// The work finished (and was let go of).
    #[serde(default)]
    retired: bool,
    /// `scheduled`, `started` or `completed`.
    #[serde(default)]
    state: String,
}

impl Entry {
    fn waiting(&self) -> bool {
        !self.retired && self.state != "completed"
    }

    /// `all_reduce`: the operation without its backend.
    fn op(&self) -> &str {
        self.profiling_name
            .split_once(':')
            .map_or(self.profiling_name.as_str(), |(_, op)| op)
    }

    /// `float[4]`, `float[2, 3], long[8]`; empty without inputs.
    fn tensors(&self) -> String {
        let shape = |s: &Vec<i64>| {
            let dims: Vec<String> = s.iter().map(i64::to_string).collect();
            format!("[{}]", dims.join(", "))
        };
        let tensors: Vec<String> = self
            .input_sizes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let dtype = self.input_dtypes.get(i).map_or("", String::as_str);
                format!("{}{}", dtype.to_lowercase(), shape(s))
            })
            .collect();
        tensors.join(", ")
    }

    /// `all_reduce #4 (float[4])`.
    fn describe(&self) -> String {
        let t = self.tensors();
        if t.is_empty() {
            format!("{} #{}", self.op(), self.collective_seq_id)
        } else {
            format!("{} #{} ({t})", self.op(), self.collective_seq_id)
        }
    }

    /// `all_reduce #4`: without the tensors.
    fn short(&self) -> String {
        format!("{} #{}", self.op(), self.collective_seq_id)
    }

    /// `all_reduce (float[4])`: without the sequence number.
    fn what(&self) -> String {
        let t = self.tensors();
        if t.is_empty() {
            self.op().to_string()
        } else {
            format!("{} ({t})", self.op())
        }
    }

    /// What must agree across ranks at one sequence number.
    fn signature(&self) -> (String, Vec<Vec<i64>>, Vec<String>) {
        (
            self.op().to_string(),
            self.input_sizes.clone(),
            self.input_dtypes.clone(),
        )
    }
}

/// A process group's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Some ranks wait in collective `at`; `behind` never entered it (their last collective on
    /// the group, if any); `done`: ranks that finished it.
    Waiting {
        /// `all_reduce #4 (float[4])`.
        at: String,
        /// The ranks in it.
        waiting: Vec<u32>,
        /// Ranks that finished it (unusual when others never entered it).
        done: Vec<u32>,
        /// Each rank still before it, with its last collective here (`all_reduce #3`; `None`:
        /// none yet).
        behind: Vec<(u32, Option<String>)>,
    },
    /// Ranks entered the same collective number with different operations or tensors.
    Desync {
        /// The sequence number.
        seq: u64,
        /// Each collective entered at `seq` (`all_reduce (float[4])`) and the ranks in it.
        variants: Vec<(Vec<u32>, String)>,
    },
}

/// One process group's verdict with its name.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupVerdict {
    /// `default_pg`, the group's description, or `group <name>`.
    pub group: String,
    /// What is wrong in it.
    pub verdict: Verdict,
}

/// The verdict over every rank's dump: per process group, and the ranks without one.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// The groups with something to say, by group id.
    pub groups: Vec<GroupVerdict>,
    /// Ranks that sent no dump, and why.
    pub missing: Vec<(u32, String)>,
    /// Ranks whose dumps were judged.
    pub judged: Vec<u32>,
}

/// One process group as every rank recorded it.
#[derive(Default)]
struct Group {
    id: u64,
    label: String,
    /// Rank → its entries on this group, in sequence order.
    entries: BTreeMap<u32, Vec<Entry>>,
    /// Ranks some dump lists as members.
    members: BTreeSet<u32>,
}

/// Entries kept per process group and rank by [`compact`]: the judgement reads the last
/// collective each rank entered, and the few before it to find a desync.
pub const KEPT: usize = 4;

/// The entry fields [`judge`] reads.
const ENTRY_FIELDS: [&str; 9] = [
    "collective_seq_id",
    "is_p2p",
    "pg_id",
    "process_group",
    "profiling_name",
    "input_sizes",
    "input_dtypes",
    "retired",
    "state",
];

/// A written dump cut to what [`judge`] reads (the last [`KEPT`] collectives per process group,
/// their judged fields, each group's ranks), in the dump's own shape; `None` for no dump or an
/// unreadable one. A few KiB per rank, to travel in a node report.
pub fn compact(outcome: &Outcome) -> Option<serde_json::Value> {
    use serde_json::{Map, Value};
    let Outcome::Written(text) = outcome else {
        return None;
    };
    let dump: Value = serde_json::from_str(text).ok()?;
    let mut backends = Map::new();
    for (name, b) in dump.get("backends")?.as_object()? {
        let mut by_group: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
        for e in b
            .get("entries")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let group = e["process_group"][0]
                .as_str()
                .unwrap_or_default()
                .to_string();
            by_group.entry(group).or_default().push(e);
        }
        let mut entries = Vec::new();
        for mut es in by_group.into_values() {
            es.sort_by_key(|e| e["collective_seq_id"].as_u64().unwrap_or(0));
            let from = es.len().saturating_sub(KEPT);
            for e in &es[from..] {
                let kept: Map<String, Value> = ENTRY_FIELDS
                    .iter()
                    .filter_map(|f| e.get(*f).map(|v| ((*f).to_string(), v.clone())))
                    .collect();
                entries.push(Value::Object(kept));
            }
        }
        let pg_config: Map<String, Value> = b
            .get("pg_config")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), serde_json::json!({"ranks": v["ranks"]})))
            .collect();
        backends.insert(
            name.clone(),
            serde_json::json!({"entries": entries, "pg_config": pg_config}),
        );
    }
    Some(serde_json::json!({ "backends": backends }))
}

/// Judges the dumps of `outcomes` (global rank → what it sent).
pub fn judge(outcomes: &BTreeMap<u32, Outcome>) -> Report {
    let mut report = Report::default();
    let mut dumps: BTreeMap<u32, Vec<TorchDump>> = BTreeMap::new();
    for (&rank, outcome) in outcomes {
        let why = match outcome {
            Outcome::NotListening => {
                "not listening (only workers that call drun.progress listen)".to_string()
            }
            Outcome::NoAnswer => "no dump written in time".to_string(),
            Outcome::Written(text) => match serde_json::from_str::<WorkerDump>(text) {
                Ok(d) if !d.backends.is_empty() => {
                    dumps.insert(rank, d.backends.into_values().collect());
                    continue;
                }
                Ok(d) => d.error.unwrap_or_else(|| "an empty dump".to_string()),
                Err(e) => format!("an unreadable dump: {e}"),
            },
        };
        report.missing.push((rank, why));
    }
    let recorded = |b: &Vec<TorchDump>| b.iter().any(|d| !d.entries.is_empty());
    if !dumps.is_empty() && !dumps.values().any(recorded) {
        // Not one collective anywhere: the recorder is off (or nothing was called yet).
        for rank in std::mem::take(&mut dumps).into_keys() {
            report.missing.push((rank, NOTHING_RECORDED.to_string()));
        }
        report.missing.sort();
    }
    report.judged = dumps.keys().copied().collect();
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for (&rank, backends) in &dumps {
        for dump in backends {
            for e in dump.entries.iter().filter(|e| !e.is_p2p) {
                let (name, desc) = &e.process_group;
                let g = groups.entry(name.clone()).or_default();
                g.id = e.pg_id;
                g.label = label(name, desc);
                g.members.insert(rank);
                g.entries.entry(rank).or_default().push(e.clone());
            }
        }
    }
    // Members that recorded nothing on a group: the pg_config's, and every rank in the default
    // group.
    for backends in dumps.values() {
        for dump in backends {
            for (name, cfg) in &dump.pg_config {
                if let (Some(g), Ok(ranks)) = (
                    groups.get_mut(name),
                    serde_json::from_str::<Vec<u32>>(&cfg.ranks),
                ) {
                    g.members
                        .extend(ranks.into_iter().filter(|r| dumps.contains_key(r)));
                }
            }
        }
    }
    for g in groups.values_mut() {
        if g.id == 0 {
            g.members.extend(dumps.keys().copied());
        }
        for e in g.entries.values_mut() {
            e.sort_by_key(|e| e.collective_seq_id);
        }
    }
    let mut by_id: Vec<&Group> = groups.values().collect();
    by_id.sort_by_key(|g| g.id);
    for g in by_id {
        report
            .groups
            .extend(verdicts(g).into_iter().map(|verdict| GroupVerdict {
                group: g.label.clone(),
                verdict,
            }));
    }
    report
}

/// `default_pg`, the group's description, or `group <name>` when it has none.
fn label(name: &str, desc: &str) -> String {
    if desc.is_empty() || desc == "undefined" {
        format!("group {name}")
    } else {
        desc.to_string()
    }
}

/// One group's verdicts: the first desync, then where the ranks stand.
fn verdicts(g: &Group) -> Vec<Verdict> {
    let mut out = Vec::new();
    // The first sequence number whose entries differ (the later ones follow from it).
    let mut at_seq: BTreeMap<u64, Vec<(u32, &Entry)>> = BTreeMap::new();
    for (&rank, entries) in &g.entries {
        for e in entries {
            at_seq
                .entry(e.collective_seq_id)
                .or_default()
                .push((rank, e));
        }
    }
    let mut desync_at = None;
    if let Some((&seq, ranks)) = at_seq.iter().find(|(_, ranks)| {
        let sigs: BTreeSet<_> = ranks.iter().map(|(_, e)| e.signature()).collect();
        sigs.len() > 1
    }) {
        let mut variants: BTreeMap<_, (Vec<u32>, String)> = BTreeMap::new();
        for (r, e) in ranks {
            let v = variants
                .entry(e.signature())
                .or_insert_with(|| (Vec::new(), e.what()));
            v.0.push(*r);
        }
        let mut variants: Vec<_> = variants.into_values().collect();
        variants.sort();
        out.push(Verdict::Desync { seq, variants });
        desync_at = Some(seq);
    }
    let last = |r: &u32| g.entries.get(r).and_then(|e| e.last());
    let Some(top) = g
        .members
        .iter()
        .filter_map(last)
        .max_by_key(|e| e.collective_seq_id)
    else {
        return out;
    };
    let seq = top.collective_seq_id;
    if desync_at == Some(seq) {
        // Who entered what is the desync's line.
        return out;
    }
    let (mut waiting, mut done, mut behind) = (Vec::new(), Vec::new(), Vec::new());
    for r in &g.members {
        match last(r) {
            Some(e) if e.collective_seq_id == seq && e.waiting() => waiting.push(*r),
            Some(e) if e.collective_seq_id == seq => done.push(*r),
            other => behind.push((*r, other.map(Entry::short))),
        }
    }
    if !waiting.is_empty() {
        // The entry of a waiting rank names the collective (a desync is said above).
        let at = g.entries[&waiting[0]]
            .last()
            .map_or_else(|| top.describe(), Entry::describe);
        out.push(Verdict::Waiting {
            at,
            waiting,
            done,
            behind,
        });
    }
    out
}

/// `rank 1` / `ranks 0, 2`.
fn ranks(r: &[u32]) -> String {
    let list: Vec<String> = r.iter().map(u32::to_string).collect();
    match r.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

impl Verdict {
    /// The verdict in words (after the group's name).
    pub fn describe(&self) -> String {
        match self {
            Verdict::Waiting {
                at,
                waiting,
                done,
                behind,
            } => {
                let verb = if waiting.len() == 1 { "waits" } else { "wait" };
                let mut s = format!("{} {verb} in {at}", ranks(waiting));
                if !done.is_empty() {
                    s.push_str(&format!("; {} finished it", ranks(done)));
                }
                // Ranks behind, grouped by their last collective (in the order of their
                // lowest rank).
                let mut by_last: Vec<(Option<&String>, Vec<u32>)> = Vec::new();
                for (r, l) in behind {
                    match by_last.iter_mut().find(|(last, _)| *last == l.as_ref()) {
                        Some((_, rs)) => rs.push(*r),
                        None => by_last.push((l.as_ref(), vec![*r])),
                    }
                }
                for (l, rs) in by_last {
                    let its = if rs.len() == 1 { "its" } else { "their" };
                    match l {
                        Some(l) => s.push_str(&format!(
                            "; {} never entered it ({its} last: {l})",
                            ranks(&rs)
                        )),
                        None => s.push_str(&format!(
                            "; {} never entered it (no collective on this group yet)",
                            ranks(&rs)
                        )),
                    }
                }
                if behind.is_empty() && done.is_empty() {
                    s.push_str(
                        "; every rank with a dump is in it: the rank they wait for is on another node or sent no dump",
                    );
                }
                s
            }
            Verdict::Desync { seq, variants } => {
                let each: Vec<String> = variants
                    .iter()
                    .map(|(rs, what)| format!("{} entered {what}", ranks(rs)))
                    .collect();
                format!("desync at collective #{seq}: {}", each.join("; "))
            }
        }
    }
}

impl Report {
    /// The lines to print: one per group verdict, one for the ranks without a dump; one saying
    /// all is in step when nothing is wrong.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .groups
            .iter()
            .map(|g| format!("flight recorder: {}: {}", g.group, g.verdict.describe()))
            .collect();
        if out.is_empty() && !self.judged.is_empty() {
            out.push(format!(
                "flight recorder: {} in step: no collective is waited in",
                ranks(&self.judged)
            ));
        }
        let mut by_why: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (r, why) in &self.missing {
            by_why.entry(why).or_default().push(*r);
        }
        for (why, rs) in by_why {
            out.push(format!(
                "flight recorder: no dump from {}: {why}",
                ranks(&rs)
            ));
        }
        out
    }
}
