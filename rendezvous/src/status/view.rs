//! The human view of a [`RunStatus`] (pure): lines of at most [`WIDTH`] columns, for
//! `drun-rendezvous status` and `drun --status`.
//!
//! ```text
//! run job42: generation 3, running; 3 nodes, world size 6
//! formed     41 s ago in 2.1 s: 3 of max 3 nodes joined
//! restarts   1 failure, 1 membership
//! lost work  12 s at the last re-form (resumed from step 300)
//! checkpoint step 400 of generation 3, sealed 5 s ago (6 ranks, 1.2 MB)
//!
//! NODE             RANK  RANKS      ADDRESS          STATE
//! a                0     0-1        10.0.0.1         running
//! ```
//!
//! What the store does not know (a formation recorded by an older drun, no re-form yet) is `-`.

use std::time::Duration;

use crate::human::{bytes, duration};
use crate::status::{NodeState, NodeStatus, RunStatus};

/// The widest line of the view, in characters.
pub const WIDTH: usize = 80;

/// Where the values of the labelled lines start.
const LABEL: usize = 11;

/// The view of `status`, `now_ms` (milliseconds since the Unix epoch) being the time ages are
/// counted from when the status does not carry its own reading time.
pub fn render(status: &RunStatus, now_ms: u64) -> Vec<String> {
    let now = if status.now_ms > 0 {
        status.now_ms
    } else {
        now_ms
    };
    let ago = |t: u64| match t {
        0 => "-".to_string(),
        t => format!(
            "{} ago",
            duration(Duration::from_millis(now.saturating_sub(t)))
        ),
    };
    let mut out = Vec::new();
    let nodes = status.plan.as_ref().map_or(0, |p| p.node_count());
    let world = status.plan.as_ref().map_or(0, |p| p.world_size);
    wrap(
        &mut out,
        "",
        &format!(
            "run {}: generation {}, {}; {nodes} node{}, world size {world}",
            status.run,
            status.generation,
            run_state(status),
            if nodes == 1 { "" } else { "s" }
        ),
    );
    let formed = match &status.formation {
        Some(f) => format!(
            "{} in {}{}",
            ago(f.record.formed_at_ms),
            duration(Duration::from_millis(f.duration_ms)),
            if f.because.is_empty() {
                String::new()
            } else {
                format!(": {}", f.because)
            }
        ),
        None => "-".into(),
    };
    wrap(&mut out, "formed", &formed);
    let r = &status.restarts;
    wrap(
        &mut out,
        "restarts",
        &format!(
            "{} failure{}, {} membership",
            r.failures,
            if r.failures == 1 { "" } else { "s" },
            r.membership
        ),
    );
    let lost = match status
        .formation
        .as_ref()
        .and_then(|f| f.record.lost_work.as_ref())
    {
        Some(l) => format!(
            "{} at the last re-form ({})",
            duration(Duration::from_millis(l.ms)),
            l.resume_step.map_or_else(
                || "restarted from the beginning".to_string(),
                |s| format!("resumed from step {s}")
            )
        ),
        None => "-".into(),
    };
    wrap(&mut out, "lost work", &lost);
    let ckpt = match &status.checkpoints.latest {
        Some(c) => format!(
            "step {} of generation {}, sealed {} ({} ranks, {})",
            c.step,
            c.generation,
            ago(c.sealed_at_ms),
            c.world_size,
            bytes(c.bytes)
        ),
        None => "-".into(),
    };
    wrap(&mut out, "checkpoint", &ckpt);
    if let Some(i) = &status.ckpt_interval {
        let line = format!(
            "every {} (C = {:.2} s{}, M = {:.0} s from {} failure(s), expected loss per failure ≈ {:.1} s)",
            duration(i.duration()),
            i.cost_s,
            i.persist_s.map_or(String::new(), |p| format!(
                " stall, {p:.2} s to disk"
            )),
            i.mtbf_s,
            status.failures.len(),
            i.expected_loss_s
        );
        wrap(&mut out, "interval", &line);
    }
    if let Some(cause) = status.root_causes.last() {
        wrap(
            &mut out,
            "failure",
            &format!("generation {}: {}", cause.generation, cause.line()),
        );
    }
    reports(&mut out, status);
    out.push(String::new());
    table(&mut out, &status.nodes);
    for n in status.nodes.iter().filter(|n| n.why.is_some()) {
        let why = n.why.as_deref().unwrap_or_default();
        wrap(
            &mut out,
            "",
            &format!("{} {}: {why}", n.node, state_word(n.state)),
        );
    }
    out
}

/// The nodes' reports of the current generation: the `--preflight` summary (its links, the
/// slow ones marked), the current stragglers, and the pairs of nodes whose probes go
/// unanswered, the flight recorder's verdict over every node's dumps after a hang; and, from any
/// node, the GPUs that fail their health check.
fn reports(out: &mut Vec<String>, status: &RunStatus) {
    let of = |kind: &str| status.reports.get(kind).into_iter().flatten();
    for (_, r) in of("preflight") {
        let ar = r["report"]["all_reduce"]["busbw_gbps"]
            .as_f64()
            .unwrap_or(0.0);
        let links = r["report"]["links"].as_array().cloned().unwrap_or_default();
        let slow = r["slow"].as_array().cloned().unwrap_or_default();
        let mut text = format!(
            "generation {}: all_reduce bus bandwidth {ar:.2} Gbit/s in {:.2} s",
            r["generation"],
            r["report"]["seconds"].as_f64().unwrap_or(0.0)
        );
        for (i, l) in links.iter().enumerate() {
            let mark = match slow.get(i).and_then(|s| s.as_str()) {
                Some(why) => format!(" SLOW ({why})"),
                None => String::new(),
            };
            text.push_str(&format!(
                "; node {} → {} {:.2} Gbit/s{mark}",
                l["src"],
                l["dst"],
                l["gbps"].as_f64().unwrap_or(0.0)
            ));
        }
        wrap(out, "preflight", &text);
    }
    let current = |r: &&serde_json::Value| r["generation"].as_u64() == Some(status.generation);
    let stragglers: Vec<String> = of("stragglers")
        .map(|(_, r)| r)
        .filter(current)
        .flat_map(|r| {
            let (node, host) = (r["node_rank"].clone(), r["host"].as_str().unwrap_or("?"));
            let list = r["stragglers"].as_array().cloned().unwrap_or_default();
            list.into_iter().map(move |s| {
                let (t, m) = (s["step_time"].as_f64(), s["median"].as_f64());
                let (t, m) = (t.unwrap_or(0.0), m.unwrap_or(0.0));
                format!(
                    "rank {} (node {node}, host {host}) {t:.2} s per step, median {m:.2} s",
                    s["rank"]
                )
            })
        })
        .collect();
    if !stragglers.is_empty() {
        wrap(out, "stragglers", &stragglers.join("; "));
    }
    let mut broken: Vec<(u64, u64)> = of("peers")
        .map(|(_, r)| r)
        .filter(current)
        .flat_map(|r| {
            let from = r["node_rank"].as_u64().unwrap_or(0);
            let silent = r["silent"].as_array().cloned().unwrap_or_default();
            silent
                .into_iter()
                .filter_map(move |to| to.as_u64().map(|to| (from.min(to), from.max(to))))
        })
        .collect();
    broken.sort_unstable();
    broken.dedup();
    if !broken.is_empty() {
        let pairs: Vec<String> = broken
            .iter()
            .map(|(a, b)| format!("node {a} ↔ node {b}"))
            .collect();
        wrap(out, "partition", &pairs.join("; "));
    }
    // The flight recorder over every node's ranks: each node reports its own after a hang; the
    // last generation that hung is shown (it may have ended since).
    let hung = of("flight")
        .filter_map(|(_, r)| r["generation"].as_u64())
        .max();
    let flights: Vec<&serde_json::Value> = of("flight")
        .map(|(_, r)| r)
        .filter(|r| r["generation"].as_u64() == hung)
        .collect();
    if let Some(hung) = hung {
        wrap(out, "flight", &format!("generation {hung} hung:"));
        use crate::decisions::flight;
        let outcomes: std::collections::BTreeMap<u32, flight::Outcome> = flights
            .iter()
            .filter_map(|r| r["dumps"].as_object())
            .flatten()
            .filter_map(|(rank, d)| {
                Some((rank.parse().ok()?, flight::Outcome::Written(d.to_string())))
            })
            .collect();
        let nodes = status
            .plan
            .as_ref()
            .filter(|p| p.generation == hung)
            .map_or(0, |p| p.node_count());
        if flights.len() < nodes {
            wrap(
                out,
                "flight",
                &format!("dumps from {} of {nodes} nodes so far", flights.len()),
            );
        }
        for line in flight::judge(&outcomes).lines() {
            wrap(
                out,
                "flight",
                line.strip_prefix("flight recorder: ").unwrap_or(&line),
            );
        }
    }
    // GPUs failing their health check, on any node of the run (one standing by is not a member).
    let gpus: Vec<String> = of("gpu")
        .filter_map(|(node, r)| {
            let failing: Vec<&str> = r["failing"]
                .as_array()?
                .iter()
                .filter_map(|f| f.as_str())
                .collect();
            if failing.is_empty() {
                return None;
            }
            let what = if r["standing_by"].as_bool() == Some(true) {
                "stands by"
            } else {
                "will not join the next generation"
            };
            Some(format!(
                "node {node} (host {}) {what}: {}",
                r["host"].as_str().unwrap_or("?"),
                failing.join(", ")
            ))
        })
        .collect();
    if !gpus.is_empty() {
        wrap(out, "gpu", &gpus.join("; "));
    }
    // A finished run's agents have exited, and their copies in memory with them.
    let staging_reports = of("staging").filter(|_| status.finished.is_none());
    for (node, r) in staging_reports {
        if let Some(text) = staging(r, status.now_ms) {
            wrap(out, "memory", &format!("{node}: {text}"));
        }
    }
    let outage = of("outage")
        .map(|(_, r)| r)
        .filter(current)
        .filter_map(|r| Some((r["seconds"].as_f64()?, r["ended_at_ms"].as_u64()?)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((secs, ended)) = outage {
        wrap(
            out,
            "outage",
            &format!(
                "control plane away up to {secs:.1} s, back {} ago; generation {} kept",
                crate::human::duration(std::time::Duration::from_millis(
                    status.now_ms.saturating_sub(ended)
                )),
                status.generation
            ),
        );
    }
}

/// How many of a node's steps in memory the `memory` line names (the newest).
const STAGING_SHOWN: usize = 4;

/// A node's checkpoints in memory (`--ckpt-memory`, its `staging` report) at `now_ms`: each step
/// staged / persisting / persisted, the memory they hold, and how far the disk is behind (the
/// report's lag grown by its age while a step is still not on disk); `None` when it holds none.
fn staging(r: &serde_json::Value, now_ms: u64) -> Option<String> {
    let steps = r["steps"].as_array().filter(|s| !s.is_empty())?;
    // The newest few (a long run's small steps all fit the budget: the line grew to every
    // step of the run); the older ones counted.
    let older = steps.len().saturating_sub(STAGING_SHOWN);
    let mut list: Vec<String> = steps[older..]
        .iter()
        .map(|s| {
            let replica = s["replica"]
                .as_str()
                .map_or(String::new(), |r| format!(" ({r})"));
            format!(
                "step {} {}{replica}",
                s["step"],
                s["state"].as_str().unwrap_or("?")
            )
        })
        .collect();
    if older > 0 {
        // Each state counted: a step being written may be among them (a disk far behind).
        let mut states: Vec<(&str, usize)> = Vec::new();
        for st in steps[..older]
            .iter()
            .map(|s| s["state"].as_str().unwrap_or("?"))
        {
            match states.iter_mut().find(|(k, _)| *k == st) {
                Some((_, n)) => *n += 1,
                None => states.push((st, 1)),
            }
        }
        let counted = match states.as_slice() {
            [(st, _)] => format!(" {st}"),
            _ => format!(
                " ({})",
                states
                    .iter()
                    .map(|(st, n)| format!("{n} {st}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        list.insert(0, format!("{older} older step(s){counted}"));
    }
    // Replicas of the ring predecessor's steps held here (`--ckpt-replicas`).
    // A step number held twice (saved by two generations): each named with its generation.
    let replicas: Vec<&serde_json::Value> =
        r["replicas"].as_array().into_iter().flatten().collect();
    let twice =
        |h: &serde_json::Value| replicas.iter().filter(|o| o["step"] == h["step"]).count() > 1;
    let held: Vec<String> = replicas
        .iter()
        .map(|h| {
            let gen = if twice(h) {
                format!(" (generation {})", h["generation"])
            } else {
                String::new()
            };
            format!(
                "step {}{gen} of {}",
                h["step"],
                h["from"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let held = if held.is_empty() {
        String::new()
    } else {
        format!("; holds replicas of {}", held.join(", "))
    };
    let pending = steps.iter().any(|s| s["state"] != "persisted");
    let lag_ms = r["lag_ms"].as_u64().unwrap_or(0)
        + if pending {
            now_ms.saturating_sub(r["at_ms"].as_u64().unwrap_or(now_ms))
        } else {
            0
        };
    let disk = if pending {
        format!(
            "the disk {} behind",
            duration(std::time::Duration::from_millis(lag_ms))
        )
    } else {
        "all on disk".to_string()
    };
    Some(format!(
        "{}; {} of {} in memory, {disk}{held}",
        list.join(", "),
        bytes(r["held"].as_u64().unwrap_or(0)),
        bytes(r["budget"].as_u64().unwrap_or(0)),
    ))
}

/// One phrase for the run as a whole.
fn run_state(s: &RunStatus) -> String {
    if let Some(end) = &s.finished {
        let how = if end.success { "succeeded" } else { "failed" };
        return format!("{how}: {}", end.reason);
    }
    if let Some(why) = &s.closed {
        return format!("re-forming: {why}");
    }
    if let Some(f) = &s.round_failed {
        let message = f["message"].as_str().unwrap_or("-");
        let mut nodes: Vec<&str> = f["nodes"]
            .as_array()
            .map(|a| a.iter().filter_map(|n| n.as_str()).collect())
            .unwrap_or_default();
        if let Some(earlier) = f["earlier"].as_object() {
            nodes.extend(earlier.keys().map(String::as_str));
        }
        // Newcomers turned away while the generation runs (or before it re-forms without
        // them): the run itself goes on.
        let turned_away = s
            .plan
            .as_ref()
            .is_some_and(|p| !nodes.is_empty() && nodes.iter().all(|n| p.member(n).is_none()));
        return if turned_away {
            format!("running; turned away {}: {message}", nodes.join(", "))
        } else {
            format!("round failed: {message}")
        };
    }
    match (&s.plan, &s.progress) {
        // Without the countdown the line had when it was published: it is not read again
        // every second, and a stale "last call in 29 s" misleads.
        (None, Some(p)) => format!("forming: {}", crate::human::without_countdown(p)),
        (None, None) => "forming".into(),
        (Some(_), _) => "running".into(),
    }
}

fn state_word(s: NodeState) -> &'static str {
    match s {
        NodeState::Running => "running",
        NodeState::Joining => "joining",
        NodeState::Done => "done",
        NodeState::Ended => "ended",
        NodeState::Standby => "standby",
        NodeState::Lost => "lost",
        NodeState::Left => "left",
    }
}

/// The node table: NODE, RANK, RANKS, ADDRESS, STATE. ADDRESS takes up to 22 columns, NODE
/// what is left of [`WIDTH`]; longer cells are cut with `…`.
fn table(out: &mut Vec<String>, nodes: &[NodeStatus]) {
    let ranks_of = |n: &NodeStatus| match n.ranks {
        Some((a, b)) if a == b => a.to_string(),
        Some((a, b)) => format!("{a}-{b}"),
        None => "-".into(),
    };
    let widest = |f: &dyn Fn(&NodeStatus) -> usize, min: usize| {
        nodes.iter().map(f).max().unwrap_or(0).max(min)
    };
    let ranks_w = widest(&|n| ranks_of(n).chars().count(), 5).min(11);
    let addr_w = widest(&|n| n.addr.chars().count(), 7).min(22);
    let state_w = widest(&|n| state_word(n.state).len(), 5);
    let rest = 2 + 4 + 2 + ranks_w + 2 + addr_w + 2 + state_w;
    let node_w = widest(&|n| n.node.chars().count(), 4).min(WIDTH.saturating_sub(rest).max(4));
    let row = |node: &str, rank: &str, ranks: &str, addr: &str, state: &str| {
        let line = format!(
            "{:<node_w$}  {:<4}  {:<ranks_w$}  {:<addr_w$}  {state}",
            cut(node, node_w),
            rank,
            cut(ranks, ranks_w),
            cut(addr, addr_w),
        );
        cut(line.trim_end(), WIDTH)
    };
    out.push(row("NODE", "RANK", "RANKS", "ADDRESS", "STATE"));
    for n in nodes {
        let rank = n.node_rank.map_or("-".into(), |r| r.to_string());
        let addr = if n.addr.is_empty() { "-" } else { &n.addr };
        out.push(row(&n.node, &rank, &ranks_of(n), addr, state_word(n.state)));
    }
}

/// `s` cut to `width` characters, the last one `…` when cut.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// `label` then `text`, wrapped at word boundaries to [`WIDTH`], continuation lines indented
/// to the value column (a word longer than a line is cut).
fn wrap(out: &mut Vec<String>, label: &str, text: &str) {
    let indent = if label.is_empty() { 2 } else { LABEL };
    let mut line = if label.is_empty() {
        String::new()
    } else {
        format!("{label:<LABEL$}")
    };
    let mut empty = true;
    for word in text.split_whitespace() {
        let len = line.chars().count();
        if !empty && len + 1 + word.chars().count() > WIDTH {
            out.push(line);
            line = " ".repeat(indent);
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push(cut(&line, WIDTH));
}

#[cfg(test)]
mod tests;
