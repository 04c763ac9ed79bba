//! The environment check at formation: do the members' fingerprints agree?
//!
//! Each agent sends a [`Fingerprint`] with its Join (drun version, its resolved launch config,
//! OS, the worker interpreter's Python/torch/CUDA/NCCL/cuDNN versions, GPUs, the `NCCL_*`,
//! `TORCH_*`, `GLOO_*` variables, the `--fingerprint-cmd` output) and its `--env-check` setting.
//! The decider compares the admitted members with [`verdict`], a pure function:
//!
//! * keys that differ, with each node's value ([`differences`]); a key some nodes lack counts,
//!   as `(unset)`;
//! * [`BREAKING`] keys (nnodes MIN:MAX, the script's SHA-256) that differ refuse the group
//!   whatever the setting, `off` included: such a job cannot work;
//! * otherwise the **strictest setting among the members** wins (`strict` > `warn` > `off`), so
//!   one node asking for `strict` is enough to refuse a mixed group, and `off` only holds when
//!   every member says so. Members that sent no fingerprint (an older agent) are left out of the
//!   comparison and have no say.
//!
//! A refusal's message contains [`REFUSAL_MARK`]: it reaches every node of the round as one line
//! (the published verdict of a failed round), and agents end with exit 2 on it ([`is_refusal`]).
//! At a re-form, when the previous generation's members alone pass the check, only the
//! newcomers are refused (turned away; see `round/decider.rs`): a misconfigured node arriving
//! later cannot end a running job. While a group runs, a newcomer that re-form would refuse is
//! turned away at the door ([`crate::decisions::door`]) without re-forming the group at all.

use std::collections::{BTreeMap, BTreeSet};

pub use crate::store::records::{Door, EnvCheck, Fingerprint};

/// Keys whose difference breaks the job: refused even with `--env-check off`.
pub const BREAKING: &[&str] = &["config.nnodes", "config.script-sha256"];

/// The words every refusal carries, so agents can tell it from other failed rounds.
pub const REFUSAL_MARK: &str = "env-check refused to form the group";

/// Longest value shown in a table or message; longer ones are cut with `…`.
const MAX_VALUE: usize = 60;

/// Most nodes named per value; the rest are counted (a large group's majority row stays short).
const MAX_NODES: usize = 8;

/// One member as the check sees it.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    /// Node identity.
    pub node_id: &'a str,
    /// Its fingerprint; empty: an agent that sends none (left out).
    pub fingerprint: &'a Fingerprint,
    /// Its `--env-check`; `None`: not sent (no say).
    pub env_check: Option<EnvCheck>,
}

impl<'a> Report<'a> {
    /// The node of `join`, with the fingerprint and setting it sent.
    pub fn of(join: &'a crate::Join) -> Report<'a> {
        Report {
            node_id: &join.candidate.node_id,
            fingerprint: &join.fingerprint,
            env_check: join.env_check,
        }
    }
}

/// A key whose value is not the same on every member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The key.
    pub key: String,
    /// Each distinct value (`(unset)` where a node lacks the key) and the nodes that have it,
    /// sorted by value.
    pub values: Vec<(String, Vec<String>)>,
}

/// What the check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to say (no difference, or `off` and nothing breaking).
    Consistent,
    /// Form, and print this table on every agent.
    Warn(String),
    /// Do not form; the message names the nodes and keys and contains [`REFUSAL_MARK`].
    Refuse(String),
}

/// The keys on which the members that sent a fingerprint differ (pure), sorted by key.
pub fn differences(members: &[Report<'_>]) -> Vec<Difference> {
    let sent: Vec<&Report<'_>> = members
        .iter()
        .filter(|m| !m.fingerprint.is_empty())
        .collect();
    if sent.len() < 2 {
        return Vec::new();
    }
    let keys: BTreeSet<&String> = sent.iter().flat_map(|m| m.fingerprint.keys()).collect();
    let mut out = Vec::new();
    for key in keys {
        let mut by_value: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for m in &sent {
            let v = m.fingerprint.get(key).map_or("(unset)", String::as_str);
            by_value.entry(v).or_default().push(m.node_id.to_string());
        }
        if by_value.len() > 1 {
            out.push(Difference {
                key: key.clone(),
                values: by_value
                    .into_iter()
                    .map(|(v, mut nodes)| {
                        nodes.sort();
                        (v.to_string(), nodes)
                    })
                    .collect(),
            });
        }
    }
    out
}

/// The setting that applies to a group: the strictest among the members that sent one
/// (`warn` when none did).
pub fn effective(members: &[Report<'_>]) -> EnvCheck {
    members
        .iter()
        .filter_map(|m| m.env_check)
        .max()
        .unwrap_or_default()
}

/// Compares the members of a group about to form (pure): see the module doc for the rules.
pub fn verdict(members: &[Report<'_>]) -> Verdict {
    let diffs = differences(members);
    if diffs.is_empty() {
        return Verdict::Consistent;
    }
    let (breaking, other): (Vec<&Difference>, Vec<&Difference>) = diffs
        .iter()
        .partition(|d| BREAKING.contains(&d.key.as_str()));
    if !breaking.is_empty() {
        return Verdict::Refuse(format!(
            "{REFUSAL_MARK}: the nodes' launch configs differ in a way that breaks the job \
             (refused whatever --env-check says): {}; start every node with the same --nnodes \
             and the same script",
            inline(&breaking)
        ));
    }
    match effective(members) {
        EnvCheck::Off => Verdict::Consistent,
        EnvCheck::Warn => Verdict::Warn(table(&other)),
        EnvCheck::Strict => Verdict::Refuse(format!(
            "{REFUSAL_MARK} (--env-check strict): the nodes' environments differ: {}; make them \
             match or pass --env-check warn",
            inline(&other)
        )),
    }
}

/// `key (v1 on a, b; v2 on c), ...`: differences in one line.
fn inline(diffs: &[&Difference]) -> String {
    diffs
        .iter()
        .map(|d| {
            let vals: Vec<String> = d
                .values
                .iter()
                .zip(shown(d))
                .map(|((_, nodes), v)| format!("{v} on {}", node_list(nodes)))
                .collect();
            format!("{} ({})", d.key, vals.join("; "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The warning table: one row per (key, value) with the nodes that have it.
fn table(diffs: &[&Difference]) -> String {
    let kw = diffs.iter().map(|d| d.key.len()).max().unwrap_or(0).max(3);
    let vw = diffs
        .iter()
        .flat_map(|d| shown(d).into_iter().map(|v| v.chars().count()))
        .max()
        .unwrap_or(0)
        .max(5);
    let mut out = format!(
        "the nodes' environments differ in {} key(s) (--env-check warn; strict refuses such a group):\n  {:kw$}  {:vw$}  nodes",
        diffs.len(),
        "key",
        "value"
    );
    for d in diffs {
        for (i, ((_, nodes), v)) in d.values.iter().zip(shown(d)).enumerate() {
            let key = if i == 0 { d.key.as_str() } else { "" };
            out.push_str(&format!("\n  {key:kw$}  {v:vw$}  {}", node_list(nodes)));
        }
    }
    out
}

/// `a, b, c`, or the first [`MAX_NODES`] and `(+N more)`.
fn node_list(nodes: &[String]) -> String {
    if nodes.len() <= MAX_NODES {
        return nodes.join(", ");
    }
    format!(
        "{} (+{} more)",
        nodes[..MAX_NODES].join(", "),
        nodes.len() - MAX_NODES
    )
}

/// Each of `d`'s values as shown: cut to [`MAX_VALUE`] characters around where the values
/// first differ, so that long values with a common start (paths, argument lists) still show
/// what differs.
fn shown(d: &Difference) -> Vec<String> {
    let common = d
        .values
        .iter()
        .map(|(v, _)| v.chars().collect::<Vec<_>>())
        .reduce(|a, b| {
            let n = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            a[..n].to_vec()
        })
        .map_or(0, |c| c.len());
    d.values.iter().map(|(v, _)| cut_from(v, common)).collect()
}

/// `v` in at most [`MAX_VALUE`] characters that include the one at `at` (with a little of what
/// comes before it); `…` marks what was left out at either end.
fn cut_from(v: &str, at: usize) -> String {
    let chars: Vec<char> = v.chars().collect();
    if chars.len() <= MAX_VALUE {
        return v.to_string();
    }
    // Enough before the difference to recognize the value.
    let start = if at + 12 < MAX_VALUE - 1 { 0 } else { at - 12 };
    let mut s = String::new();
    if start > 0 {
        s.push('…');
    }
    let room = MAX_VALUE - s.chars().count() - 1;
    s.extend(chars.iter().skip(start).take(room));
    if start + room < chars.len() {
        s.push('…');
    }
    s
}

/// Whether a failed round's message is an env-check refusal (the agent exits 2 on it).
pub fn is_refusal(message: &str) -> bool {
    message.contains(REFUSAL_MARK)
}

#[cfg(test)]
mod tests;
