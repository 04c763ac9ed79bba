//! Batching of this node's checkpoint commits: one [`NodeCommit`] per step once every local rank
//! has reported it, and the answers back to the ranks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drun_rendezvous::ledger::cursor_disagreement;
use drun_rendezvous::{CommitOutcome, Cursor, Manifest, NodeCommit, Plan, ShardFile};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::api::{refused, FileReport};
use super::CkptError;

type Reply = oneshot::Sender<Value>;

struct RankCommit {
    cursor: Cursor,
    files: Vec<ShardFile>,
    reply: Reply,
}

/// This node's view of the ledger during one generation.
pub struct NodeLedger {
    node_id: String,
    generation: u64,
    /// Global ranks of this node: `first..first + slots`.
    first: u32,
    slots: u32,
    resume_step: Option<u64>,
    /// `--ckpt-dir`: committed files must be inside it.
    root: Option<PathBuf>,
    /// Highest step this node sent for recording.
    last_step: Option<u64>,
    /// Steps some local ranks reported: when the first did, whether the wait was reported.
    started: BTreeMap<u64, (Instant, bool)>,
    steps: BTreeMap<u64, BTreeMap<u32, RankCommit>>,
    inflight: BTreeMap<u64, Vec<Reply>>,
    progress: BTreeMap<u32, u64>,
    /// Per step, the earliest save start a local rank reported (ms since the Unix epoch).
    save_started: BTreeMap<u64, u64>,
    /// The agent's staging directory (`--ckpt-memory`): where files reported `staged` are.
    stage: Option<PathBuf>,
    /// Per step, the files local ranks reported staged (their places in `--ckpt-dir`).
    staged: BTreeMap<u64, Vec<String>>,
    /// Steps whose ranks were answered `staged` before the ledger saw them.
    answered_staged: BTreeSet<u64>,
    /// A staged step the ledger refused after its ranks went on ([`Self::on_committed`]).
    refused_behind: Option<RefusedBehind>,
    /// Staged steps that did not fit the budget: their answers say `"spares": false`.
    no_spares: BTreeSet<u64>,
}

/// A refusal of a step its ranks were answered `staged` for (`--ckpt-memory`): they cannot hear
/// it on that commit any more, so it is the answer to every local rank's commit of the next
/// step — the training learns it, as it would on the direct path, one step later.
#[derive(Debug)]
struct RefusedBehind {
    /// The refused step.
    step: u64,
    /// The ledger's reason, one line.
    why: String,
    /// The step refused with it (the first committed after it arrived), once known.
    next: Option<u64>,
    /// Local ranks told.
    told: BTreeSet<u32>,
}

impl NodeLedger {
    /// Ledger state for `node_id` running `plan`; files must be inside `root` when given. A node
    /// absent from the plan has no ranks.
    pub fn new(plan: &Plan, node_id: &str, root: Option<&Path>) -> Self {
        let (first, slots) = plan
            .member(node_id)
            .map_or((0, 0), |m| (m.base_rank, m.slots));
        Self {
            node_id: node_id.to_string(),
            generation: plan.generation,
            first,
            slots,
            resume_step: plan.resume.as_ref().map(|m| m.step),
            root: root.map(Path::to_path_buf),
            last_step: None,
            started: BTreeMap::new(),
            steps: BTreeMap::new(),
            inflight: BTreeMap::new(),
            progress: BTreeMap::new(),
            save_started: BTreeMap::new(),
            stage: None,
            staged: BTreeMap::new(),
            answered_staged: BTreeSet::new(),
            refused_behind: None,
            no_spares: BTreeSet::new(),
        }
    }

    /// The same, accepting files staged under `stage` (`--ckpt-memory`; `None`: none).
    pub fn with_stage(mut self, stage: Option<&Path>) -> Self {
        self.stage = stage.map(Path::to_path_buf);
        self
    }

    /// The files of `step` local ranks reported staged (taken: asked once per batch).
    pub fn take_staged(&mut self, step: u64) -> Vec<String> {
        self.staged.remove(&step).unwrap_or_default()
    }

    /// Answers the ranks waiting on `step` at once: its files are staged in memory and will be
    /// persisted behind the training (`--ckpt-memory`). `spares`: whether the ranks may
    /// prepare the spare staging files of their next save (the budget keeps room for them).
    pub fn answer_staged(&mut self, step: u64, spares: bool) {
        self.answered_staged.insert(step);
        for r in self.inflight.remove(&step).unwrap_or_default() {
            let _ = r.send(json!({
                "ok": true, "step": step, "sealed": false, "staged": true,
                "manifest": null, "waiting_for": [], "spares": spares,
            }));
        }
    }

    /// The ranks' staged save of `step` did not fit the budget and goes to disk before they
    /// are answered: the answer tells them to prepare no spare for their next save.
    pub fn no_spares(&mut self, step: u64) {
        self.no_spares.insert(step);
    }

    /// Generation this state belongs to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn check_rank(&self, rank: u32) -> Result<(), CkptError> {
        if rank < self.first || rank >= self.first + self.slots {
            return Err(CkptError::ForeignRank {
                rank,
                node: self.node_id.clone(),
                first: self.first,
                end: self.first + self.slots,
            });
        }
        Ok(())
    }

    /// Notes that a local rank began saving `step` at `at_ms` (ms since the Unix epoch; the
    /// commit's `save_started_ms`): the node's commit carries the earliest.
    pub fn note_save_start(&mut self, step: u64, at_ms: u64) {
        let e = self.save_started.entry(step).or_insert(at_ms);
        *e = (*e).min(at_ms);
    }

    /// Records rank `rank`'s report of `step`; answers it at once when refused. `files` may be
    /// empty: a rank that wrote nothing of its own (e.g. a DCP rank holding no shard) is still a
    /// participant of the step. Returns the
    /// node's batched commit when this was the last local rank to report `step`.
    pub fn commit(
        &mut self,
        rank: u32,
        generation: u64,
        step: u64,
        files: Vec<FileReport>,
        cursor: Cursor,
        reply: Reply,
    ) -> Option<NodeCommit> {
        let bad = |why| Some(bad_commit(generation, step, why));
        let problem = if generation < self.generation {
            bad(format!(
                "stale commit: generation {generation} is over; this node runs generation {}",
                self.generation
            ))
        } else if generation > self.generation {
            bad(format!(
                "commit for generation {generation}, which has not begun: this node runs generation {}; send DRUN_GENERATION as the worker's environment gives it",
                self.generation
            ))
        } else if let Err(e) = self.check_rank(rank) {
            Some(e)
        } else if let Some(why) = self.refusal_behind(rank, step) {
            bad(why)
        } else if self.resume_step.is_some_and(|r| step <= r) {
            bad(format!(
                "step {step} is not after the step this generation resumed from ({})",
                self.resume_step.unwrap_or(0)
            ))
        } else if self.inflight.contains_key(&step) {
            bad(format!(
                "step {step} is already being committed by this node"
            ))
        } else if let Some(last) = self.last_step.filter(|l| step <= *l) {
            bad(format!(
                "step {step} is not after step {last}, already committed in this generation"
            ))
        } else {
            files
                .iter()
                .find_map(|f| check_file(f, self.root.as_deref(), self.stage.as_deref()).err())
        };
        if let Some(p) = problem {
            let _ = reply.send(refused(p));
            return None;
        }
        let staged: Vec<String> = files
            .iter()
            .filter(|f| f.staged)
            .map(|f| f.path.clone())
            .collect();
        if !staged.is_empty() {
            self.staged.entry(step).or_default().extend(staged);
        }
        let files = files
            .into_iter()
            .map(|f| ShardFile {
                rank,
                path: f.path,
                bytes: f.bytes,
                digest: f.sha256,
            })
            .collect();
        self.started
            .entry(step)
            .or_insert_with(|| (Instant::now(), false));
        let ranks = self.steps.entry(step).or_default();
        if let Some(old) = ranks.insert(
            rank,
            RankCommit {
                cursor,
                files,
                reply,
            },
        ) {
            let _ = old
                .reply
                .send(refused(format!("rank {rank} committed step {step} again")));
        }
        if ranks.len() < self.slots as usize {
            return None;
        }
        let ranks = self.steps.remove(&step).expect("present");
        self.started.remove(&step);
        let disagreement = cursor_disagreement(
            ranks
                .iter()
                .map(|(r, c)| (std::slice::from_ref(r), &c.cursor)),
        );
        if let Some(detail) = disagreement {
            self.staged.remove(&step);
            let msg = format!("step {step} not sealed: misaligned data: {detail}");
            tracing::error!("checkpoint {msg}");
            for (_, c) in ranks {
                let _ = c.reply.send(refused(&msg));
            }
            return None;
        }
        let mut batch = NodeCommit {
            node_id: self.node_id.clone(),
            generation: self.generation,
            step,
            ranks: ranks.keys().copied().collect(),
            cursor: ranks.values().next().expect("slots ≥ 1").cursor.clone(),
            files: Vec::new(),
            save_started_ms: self.save_started.remove(&step),
            staged_ms: None,
        };
        let mut replies = Vec::new();
        for (_, c) in ranks {
            batch.files.extend(c.files);
            replies.push(c.reply);
        }
        self.inflight.insert(step, replies);
        self.last_step = Some(self.last_step.map_or(step, |l| l.max(step)));
        Some(batch)
    }

    /// The refusal of an earlier staged step that answers rank `rank`'s commit of `step`, if
    /// any ([`RefusedBehind`]); forgotten once every local rank was told, or once a rank
    /// commits a later step than the one refused with it.
    fn refusal_behind(&mut self, rank: u32, step: u64) -> Option<String> {
        let r = self.refused_behind.as_mut()?;
        let next = *r.next.get_or_insert(step);
        if step > next {
            self.refused_behind = None;
            return None;
        }
        if step < next {
            return None;
        }
        r.told.insert(rank);
        let why = format!(
            "checkpoint step {} was refused after this node answered it staged in memory: {}; so is this commit of step {step}, on every rank of this node",
            r.step, r.why
        );
        if r.told.len() >= self.slots as usize {
            self.refused_behind = None;
        }
        Some(why)
    }

    /// The ledger refused `step` after its ranks were answered staged: waiting local ranks of a
    /// later step are refused with it now, the others on their next commit.
    fn refuse_behind(&mut self, step: u64, why: String) {
        let mut r = RefusedBehind {
            step,
            why,
            next: None,
            told: BTreeSet::new(),
        };
        if let Some((&next, _)) = self.steps.iter().find(|(s, _)| **s > step) {
            r.next = Some(next);
            self.refused_behind = Some(r);
            let waiting = self.steps.remove(&next).unwrap_or_default();
            self.started.remove(&next);
            self.staged.remove(&next);
            self.save_started.remove(&next);
            for (rank, c) in waiting {
                let why = self.refusal_behind(rank, next).expect("refused with it");
                let _ = c
                    .reply
                    .send(refused(bad_commit(self.generation, next, why)));
            }
        } else {
            self.refused_behind = Some(r);
        }
    }

    /// One line for each step some local ranks have waited on for longer than `after` (reported
    /// once per step): which ranks have not committed it.
    pub fn stalled(&mut self, after: Duration) -> Vec<String> {
        let mut out = Vec::new();
        for (step, (since, told)) in self.started.iter_mut() {
            if *told || since.elapsed() < after {
                continue;
            }
            *told = true;
            let done = self.steps.get(step);
            let missing: Vec<String> = (self.first..self.first + self.slots)
                .filter(|r| done.is_none_or(|d| !d.contains_key(r)))
                .map(|r| r.to_string())
                .collect();
            out.push(format!(
                "checkpoint step {step}: waiting {:.0} s for rank(s) {} of this node to commit it too (every rank commits every checkpointed step)",
                since.elapsed().as_secs_f64(),
                missing.join(",")
            ));
        }
        out
    }

    /// Answers the ranks waiting on `step` with the rendezvous' verdict. `manifest_file` is where
    /// the manifest was written when this node sealed the step.
    pub fn answered(
        &mut self,
        step: u64,
        result: &Result<CommitOutcome, drun_rendezvous::CommitRefused>,
        manifest_file: Option<&Path>,
    ) {
        let Some(replies) = self.inflight.remove(&step) else {
            return;
        };
        let answer = match result {
            Ok(CommitOutcome::Recorded { waiting_for }) => json!({
                "ok": true, "step": step, "sealed": false, "manifest": null,
                "waiting_for": waiting_for,
            }),
            Ok(CommitOutcome::Sealed { .. }) => json!({
                "ok": true, "step": step, "sealed": true,
                "manifest": manifest_file.map(|p| p.display().to_string()),
                "waiting_for": [],
            }),
            Err(e) => refused(e),
        };
        let mut answer = answer;
        if self.no_spares.remove(&step) {
            answer["spares"] = json!(false);
        }
        for r in replies {
            let _ = r.send(answer.clone());
        }
    }

    /// The rendezvous' answer to this node's commit of `step` of `generation` (an answer for
    /// another generation is dropped): publishes a checkpoint sealed here under `dir`, then
    /// answers the waiting ranks.
    pub fn on_committed(
        &mut self,
        generation: u64,
        step: u64,
        result: &Result<CommitOutcome, drun_rendezvous::CommitRefused>,
        dir: Option<&Path>,
    ) {
        if generation != self.generation {
            return;
        }
        let file = match result {
            Ok(CommitOutcome::Sealed {
                manifest,
                dropped,
                garbage,
            }) => super::resume::sealed_here(step, manifest, dropped, garbage, dir),
            Ok(_) => None,
            Err(e) => {
                crate::say!("drun: checkpoint commit of step {step} refused: {e}");
                None
            }
        };
        if self.answered_staged.remove(&step) {
            if let Err(e) = result {
                self.refuse_behind(step, e.to_string());
            }
            return;
        }
        self.answered(step, result, file.as_deref());
    }

    /// This node's part of `step` could not be persisted from memory (`why`: which file, what
    /// failed): the step is no resume point. Ranks still waiting for the disk (a direct save)
    /// are refused now; when they were answered staged already, their commits of the next step
    /// are refused with it, as a refusal by the ledger would be ([`NodeLedger::on_committed`]).
    pub fn not_persisted(&mut self, step: u64, why: &str) {
        let refusal = drun_rendezvous::CommitRefused::NotPersisted(why.to_string());
        if self.answered_staged.remove(&step) {
            self.refuse_behind(step, refusal.to_string());
        } else {
            self.answered(step, &Err(refusal), None);
        }
    }

    /// Notes rank `rank`'s step beacon.
    pub fn progress(&mut self, rank: u32, step: u64) -> Value {
        match self.check_rank(rank) {
            Ok(()) => {
                let s = self.progress.entry(rank).or_default();
                *s = (*s).max(step);
                json!({"ok": true})
            }
            Err(e) => refused(e),
        }
    }

    /// Highest step any local rank announced, if any did.
    pub fn reached(&self) -> Option<u64> {
        self.progress.values().copied().max()
    }
}

fn bad_commit(generation: u64, step: u64, why: String) -> CkptError {
    CkptError::BadCommit {
        generation,
        step,
        why,
    }
}

fn check_file(f: &FileReport, root: Option<&Path>, stage: Option<&Path>) -> Result<(), CkptError> {
    let bad = |why: String| {
        Err(CkptError::BadCommitFile {
            path: f.path.clone(),
            why,
        })
    };
    let path = Path::new(&f.path);
    if !path.is_absolute() {
        return bad(format!("file path '{}' must be absolute", f.path));
    }
    if let Some(root) = root.filter(|r| !path.starts_with(r)) {
        return bad(format!(
            "'{}' is outside --ckpt-dir {}; checkpoint files live inside it",
            f.path,
            root.display()
        ));
    }
    let left_to_the_agent = f.staged && f.sha256.is_empty();
    if !left_to_the_agent
        && (f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return bad(format!(
            "sha256 of '{}' must be 64 hex digits, got '{}'",
            f.path, f.sha256
        ));
    }
    // A staged file is in the agent's staging directory until the persister writes it here.
    let at = if f.staged {
        match (stage, root) {
            (Some(stage), Some(root)) => match super::memory::staged_path(stage, root, path) {
                Some(p) => p,
                None => {
                    return bad(format!(
                        "'{}' has no place in the staging directory",
                        f.path
                    ))
                }
            },
            _ => {
                return bad(format!(
                    "'{}' is reported staged, but this agent stages nothing (--ckpt-memory off)",
                    f.path
                ))
            }
        }
    } else {
        path.to_path_buf()
    };
    match std::fs::metadata(&at) {
        Ok(m) if !m.is_file() => bad(format!("'{}' is not a regular file", f.path)),
        Ok(m) if m.len() == f.bytes => Ok(()),
        Ok(m) => bad(format!(
            "'{}' has {} bytes, the commit says {} (was it fully written before commit?)",
            f.path,
            m.len(),
            f.bytes
        )),
        Err(e) => bad(format!("'{}': {e}", f.path)),
    }
}

/// The `resume` answer for `plan`: what every rank of the generation resumes from.
pub fn resume_answer(plan: &Plan, manifest_file: Option<&Path>) -> Value {
    json!({
        "ok": true,
        "generation": plan.generation,
        "world_size": plan.world_size,
        "resume": plan.resume.as_ref().map(|m: &Manifest| json!({
            "step": m.step,
            "generation": m.generation,
            "world_size": m.world_size,
            "path": super::resume_dir(m, manifest_file).map(|d| d.display().to_string()),
            "manifest": manifest_file.map(|p| p.display().to_string()),
            "cursor": m.cursor,
        })),
    })
}

#[cfg(test)]
mod tests;
