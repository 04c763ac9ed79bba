//! The agent's checkpoints in memory (`--ckpt-memory`, design in [`crate::ckpt::memory`]): the
//! staging directory, the table of staged copies ([`decide::Table`]) and the persister thread,
//! driven from the agent's loop — a node's batched commit of staged files is answered at once,
//! persisted behind the training, and sent to the ledger once on disk and verified; the
//! ledger's answer releases its memory. Replicas on peers are `stage/replicated.rs`; a resume
//! from memory (this node's own copy, or the survivors') is `stage/resumed.rs`; what a new
//! generation does to the copies of the one that ended is `stage/generation.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drun_rendezvous::session::Request;
use drun_rendezvous::store::reports::ReportKind;
use drun_rendezvous::{Manifest, NodeCommit};
use tokio::sync::mpsc;

use crate::agent::Agent;
use crate::ckpt::memory::decide::{Key, Table};
use crate::ckpt::memory::persist::{Done, Job, Persister, StagedFile, Throttle};
use crate::ckpt::memory::{human_bytes, remove_under, staged_path, TmpfsFit};
use crate::ckpt::node::NodeLedger;
use crate::rdzv::Link;

mod generation;
mod recycled;
mod replicated;
mod resumed;
mod room;
mod settings;
mod speed;

use settings::{pace_params, persist_rates};

/// Removes from `ckpt_dir` the persister's temporary files an agent killed mid-persist left
/// (their owner gone, [`crate::ckpt::memory::leftover`]), saying so in one line; called at the
/// start of an agent with `--ckpt-memory` (only a persister writes them: an agent without one
/// does not walk a shared `--ckpt-dir` for nothing), before its own persister writes any.
pub(super) fn sweep_leftovers(ckpt_dir: &Path) {
    if let Some(me) = crate::ckpt::memory::leftover::Owner::me() {
        let swept = crate::ckpt::memory::leftover::sweep(ckpt_dir, me);
        if let Some(line) = swept.line(ckpt_dir) {
            crate::say!("{line}");
        }
    }
}

/// A step waiting to be persisted: the node's commit to send once it is on disk.
struct Pending {
    batch: NodeCommit,
    files: Vec<StagedFile>,
}

/// The staging directory, its table and the persister.
pub(super) struct Stage {
    dir: tempfile::TempDir,
    ckpt_dir: PathBuf,
    table: Table,
    persister: Persister,
    pending: BTreeMap<Key, Pending>,
    /// The staged files of each copy in memory, for its release.
    files: BTreeMap<Key, Vec<PathBuf>>,
    /// Since when the workers' end waits for the persister.
    end_since: Option<std::time::Instant>,
    /// The workers' end was judged (persisted, or the wait given up and said): it is not held
    /// again until workers start anew.
    end_judged: bool,
    /// A preemption asked for a checkpoint: the persister goes at full speed from then on.
    hurried: bool,
    /// Bytes per second the persister writes while the workers run.
    rate: u64,
    /// Bytes per second it writes while the workers' end waits for it.
    held_rate: u64,
    /// The persister's current rate (`rate`, or `held_rate` while the end is held) and whether
    /// it goes at full speed (the end is held, or a step waits behind the one being written).
    throttle: Throttle,
    /// `--ckpt-replicas 1`: this node's replicas on its ring neighbour, and its predecessor's
    /// here.
    replicas: Option<super::replicas::Replicas>,
    /// The generation of the last plan (for reports between generations).
    followed: u64,
    /// The world size of the last plan (a staged step's, for a join's report of it).
    followed_world: u32,
    /// Per own copy in memory, what a join reports of it (its files, ranks, digests once
    /// known, cursor): a re-forming world may resume it from memory.
    own_held: BTreeMap<Key, drun_rendezvous::HeldStep>,
    /// The step this agent's workers resume from the survivors' copies (`Plan::
    /// resume_memory`; its files gathered in the staging directory): reported in its joins
    /// until this node's part of a newer step is on disk, then removed.
    resumed: Option<Manifest>,
    /// Per rank, the room kept for the spare it prepares after the last admitted save (its
    /// next save writes over it: that much of the save has its room already).
    granted: BTreeMap<u32, u64>,
    /// A rank's save was sent straight to disk for want of room ([`Stage::room`]), and said:
    /// not said again until a save finds room.
    room_said: bool,
}

impl Stage {
    /// Opens the staging directory for `--ckpt-memory` `budget` and `--ckpt-dir` `ckpt_dir` on
    /// the node's tmpfs (`/dev/shm`, or `DRUN_CKPT_STAGE_PARENT`), and starts the persister;
    /// `None` (after one warning line) when it cannot: saves then go straight to disk.
    pub(super) fn open(
        budget: u64,
        ckpt_dir: &Path,
    ) -> Option<(Self, mpsc::UnboundedReceiver<Done>)> {
        let parent = std::env::var_os("DRUN_CKPT_STAGE_PARENT")
            .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from);
        Self::open_in(&parent, budget, ckpt_dir)
    }

    /// [`Stage::open`] in the tmpfs directory `parent`.
    fn open_in(
        parent: &Path,
        budget: u64,
        ckpt_dir: &Path,
    ) -> Option<(Self, mpsc::UnboundedReceiver<Done>)> {
        // The staging directory names its owner, so that the next agent on this tmpfs removes
        // it if this one is killed (its staged copies would hold memory until reboot).
        let owner = crate::ckpt::memory::leftover::Owner::me();
        if let Some(me) = owner {
            let swept = crate::ckpt::memory::leftover::sweep_stages(parent, me);
            if let Some(line) = swept.stages_line(parent) {
                crate::say!("{line}");
            }
        }
        // The tmpfs may hold less than the budget (a container's 64 MiB /dev/shm): stage no
        // more than it has free, so a save that would not fit goes to disk from the agent's
        // table, not through a write that fails half-way.
        // A full one stages nothing: every save goes straight to disk, after one line.
        let budget = match crate::ckpt::memory::fit_tmpfs(
            budget,
            crate::ckpt::memory::free_bytes(parent),
            parent,
        ) {
            TmpfsFit::Stage { budget, warning } => {
                if let Some(line) = warning {
                    crate::say!("{line}");
                }
                budget
            }
            TmpfsFit::Full(line) => {
                crate::say!("{line}");
                return None;
            }
        };
        let prefix = match owner {
            Some(me) => format!(
                "{}{}-",
                crate::ckpt::memory::leftover::STAGE_PREFIX,
                me.token()
            ),
            None => crate::ckpt::memory::leftover::STAGE_PREFIX.to_string(),
        };
        let dir = match crate::os::private_dir::create(parent, &prefix) {
            Ok(d) => d,
            Err(e) => {
                crate::say!(
                    "drun: warning: --ckpt-memory: cannot stage checkpoints in {}: {e}; saving them straight to --ckpt-dir",
                    parent.display()
                );
                return None;
            }
        };
        let (persister, done) = match Persister::start(pace_params()) {
            Ok(p) => p,
            Err(e) => {
                crate::say!("drun: warning: --ckpt-memory: cannot start the persister: {e}; saving checkpoints straight to --ckpt-dir");
                return None;
            }
        };
        let (rate, held_rate) = persist_rates();
        tracing::info!(
            dir = %dir.path().display(),
            budget = %human_bytes(budget),
            "checkpoints are staged in memory and persisted to --ckpt-dir behind the training"
        );
        Some((
            Self {
                dir,
                ckpt_dir: ckpt_dir.to_path_buf(),
                table: Table::new(budget),
                persister,
                pending: BTreeMap::new(),
                files: BTreeMap::new(),
                end_since: None,
                end_judged: false,
                hurried: false,
                rate,
                held_rate,
                throttle: Throttle::new(rate),
                replicas: None,
                followed: 0,
                followed_world: 0,
                own_held: BTreeMap::new(),
                resumed: None,
                granted: BTreeMap::new(),
                room_said: false,
            },
            done,
        ))
    }

    /// Whether the workers' end is being held for steps not yet persisted and answered by the
    /// ledger (the loop then reads the ledger's answers even while the workers stop).
    pub(super) fn awaits_answers(&self) -> bool {
        self.end_since.is_some() && !self.table.unsettled().is_empty()
    }

    /// The newest step this node holds in memory (staged, persisting or persisted), as a
    /// manifest id.
    pub(super) fn newest(&self) -> Option<String> {
        self.table
            .copies()
            .map(|(k, _)| *k)
            .max()
            .map(|(step, g)| drun_rendezvous::ledger::manifest_id(step, g))
    }

    /// The staging directory (`DRUN_CKPT_STAGE_DIR`).
    pub(super) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A local rank's share of the budget when `ranks` run here (DRUN_CKPT_STAGE_SHARE).
    pub(super) fn rank_share(&self, ranks: u32) -> u64 {
        self.table.budget() / u64::from(ranks.max(1))
    }

    /// The node's `batch` is complete: `Some(batch)` to send to the ledger now (nothing of it
    /// staged), else `None`: it is staged, persisted behind, and sent once on disk. The ranks
    /// are answered at once when it fits the budget; otherwise they wait for the disk.
    pub(super) fn complete(
        &mut self,
        mut batch: NodeCommit,
        ledger: &mut NodeLedger,
    ) -> Option<NodeCommit> {
        let mut staged = ledger.take_staged(batch.step);
        if staged.is_empty() {
            return Some(batch);
        }
        staged.sort();
        staged.dedup();
        let key = (batch.step, batch.generation);
        let files: Vec<StagedFile> = batch
            .files
            .iter()
            .filter(|f| staged.binary_search(&f.path).is_ok())
            .filter_map(|f| {
                let target = PathBuf::from(&f.path);
                Some(StagedFile {
                    staged: staged_path(self.dir(), &self.ckpt_dir, &target)?,
                    target,
                    bytes: f.bytes,
                    digest: f.digest.clone(),
                })
            })
            .collect();
        let bytes = files.iter().map(|f| f.bytes).sum();
        let rank_of = |target: &Path| {
            let t = target.display().to_string();
            batch
                .files
                .iter()
                .find(|s| s.path == t)
                .map_or(0, |s| s.rank)
        };
        let by_rank: Vec<(u32, u64)> = files
            .iter()
            .map(|f| (rank_of(&f.target), f.bytes))
            .collect();
        let direct = !self.admit(key, &by_rank, ledger);
        if !direct {
            // The training goes on from now: the seal measures its stall up to here.
            batch.staged_ms = Some(drun_rendezvous::clock::now_ms());
        }
        self.table
            .add(key, bytes, direct, std::time::Instant::now());
        self.files
            .insert(key, files.iter().map(|f| f.staged.clone()).collect());
        if !direct {
            self.own_held.insert(
                key,
                drun_rendezvous::HeldStep {
                    step: key.0,
                    generation: key.1,
                    saved_by: batch.node_id.clone(),
                    world_size: (self.followed == key.1).then_some(self.followed_world),
                    cursor: Some(batch.cursor.clone()),
                    files: files
                        .iter()
                        .map(|f| drun_rendezvous::ShardFile {
                            rank: rank_of(&f.target),
                            path: f.target.display().to_string(),
                            bytes: f.bytes,
                            digest: f.digest.clone(),
                        })
                        .collect(),
                    staged_at_ms: batch.staged_ms,
                },
            );
        }
        if let (Some(r), false) = (self.replicas.as_mut(), direct) {
            r.send(
                key,
                files
                    .iter()
                    .map(|f| {
                        (
                            f.target.display().to_string(),
                            f.staged.clone(),
                            f.bytes,
                            f.digest.clone(),
                            rank_of(&f.target),
                        )
                    })
                    .collect(),
            );
        }
        self.pending.insert(key, Pending { batch, files });
        self.pump();
        self.sync_own();
        None
    }

    /// Hands the next copy to the persister, if the table says so.
    fn pump(&mut self) {
        self.throttle
            .set_urgent(self.end_since.is_some() || self.hurried || self.table.behind());
        let Some(key) = self.table.next() else {
            return;
        };
        let Some(p) = self.pending.get(&key) else {
            self.table.release(key);
            return;
        };
        let now = std::time::Instant::now();
        let staged_at = self.table.staged_at(key).unwrap_or(now);
        self.table.start(key, now);
        self.persister.submit(Job {
            key,
            files: p.files.clone(),
            throttle: self.throttle.clone(),
            staged_at,
        });
    }

    /// The persister's outcome for one step: the node's commit to send to the ledger when it is
    /// on disk and verified; on a failure, the line saying which file, and the ranks of a
    /// direct save are refused.
    pub(super) fn done(&mut self, d: Done, ledger: Option<&mut NodeLedger>) -> Option<NodeCommit> {
        let pending = self.pending.remove(&d.key);
        let out = match d.result {
            Ok((took, digests)) => {
                tracing::debug!(
                    step = d.key.0,
                    gen = d.key.1,
                    "checkpoint step persisted to --ckpt-dir in {:.2} s",
                    took.as_secs_f64()
                );
                self.table.persisted(d.key, std::time::Instant::now());
                pending.map(|p| {
                    // The digests the persister took of the staged copies (a rank may leave
                    // them to the agent) go in the ledger.
                    let mut batch = p.batch;
                    let held = self.own_held.get_mut(&d.key);
                    let mut held_files = held.map(|h| &mut h.files);
                    for (f, digest) in p.files.iter().zip(digests) {
                        let target = f.target.display().to_string();
                        for s in batch.files.iter_mut().filter(|s| s.path == target) {
                            s.digest.clone_from(&digest);
                        }
                        for s in held_files
                            .iter_mut()
                            .flat_map(|h| h.iter_mut())
                            .filter(|s| s.path == target)
                        {
                            s.digest.clone_from(&digest);
                        }
                    }
                    batch
                })
            }
            Err(e) => {
                crate::say!(
                    "drun: checkpoint step {} was not persisted and is not a resume point: {e}",
                    d.key.0
                );
                if let Some(l) = ledger.filter(|l| l.generation() == d.key.1) {
                    l.not_persisted(d.key.0, &e.to_string());
                }
                self.release(d.key);
                None
            }
        };
        self.pump();
        self.sync_own();
        out
    }

    /// The ledger answered the node's commit of `key` (sent once persisted).
    pub(super) fn answered(&mut self, key: Key) {
        if self.table.answered(key) {
            self.remove_files(key);
        }
        self.superseded(key);
        self.sync_own();
    }

    /// Drops `key`'s copy from memory; its files become its ranks' spares when nothing reads
    /// them any more ([`Stage::reusable`]).
    fn release(&mut self, key: Key) {
        let reusable = self.reusable(key);
        self.release_as(key, reusable);
    }

    /// [`Stage::release`], its files reused as spares unless `reusable` says why not.
    fn release_as(&mut self, key: Key, reusable: Result<(), &'static str>) {
        let held = self.own_held.remove(&key);
        self.table.release(key);
        if let Some(h) = held {
            // Renamed here, before the ranks' commit is answered, so that the spare each
            // prepares once its commit returns finds it.
            self.recycle(&h, reusable);
        }
        self.remove_files(key);
        if let Some(r) = self.replicas.as_mut() {
            r.forget(key);
        }
        self.sync_own();
    }

    /// [`Stage::release_as`] with its files removed before it returns (their pages are not
    /// made spares): the room is wanted at once, by a save about to be written or a replica
    /// about to arrive, not once a thread got to it.
    fn free_now(&mut self, key: Key, why: &'static str) {
        if let Some(files) = self.files.remove(&key) {
            remove_under(&files, self.dir.path());
        }
        self.release_as(key, Err(why));
    }

    /// Removes `key`'s staged files (and the directories they leave empty) on a thread of its
    /// own: freeing a GiB of tmpfs pages takes a few hundred milliseconds, and a release made to
    /// admit a new step would otherwise hold back the answer the training waits for. (A file
    /// renamed to a rank's spare by [`Stage::recycle`] is no longer there to remove.)
    fn remove_files(&mut self, key: Key) {
        let files = self.files.remove(&key).unwrap_or_default();
        if files.is_empty() {
            return;
        }
        let root = self.dir.path().to_path_buf();
        std::thread::spawn(move || remove_under(&files, &root));
    }

    /// The bytes held in memory and how far the disk is behind (the oldest copy not yet
    /// persisted), for the metrics.
    pub(super) fn lag(&self) -> (u64, Duration) {
        (self.table.held(), self.table.lag(std::time::Instant::now()))
    }

    /// The `staging` report `status` shows (see [`ReportKind::Staging`]), from generation
    /// `generation`'s agent.
    pub(super) fn report(&self, generation: u64) -> String {
        let mut r = self.table.report(std::time::Instant::now());
        if let Some(reps) = &self.replicas {
            if let Some(steps) = r["steps"].as_array_mut() {
                for s in steps {
                    let key = (
                        s["step"].as_u64().unwrap_or(0),
                        s["generation"].as_u64().unwrap_or(0),
                    );
                    if let Some(sent) = reps.sent_state(key) {
                        s["replica"] = match sent {
                            Some(true) => "replicated",
                            Some(false) => "not replicated",
                            None => "replicating",
                        }
                        .into();
                    }
                }
            }
            r["replicas"] = reps.held().0.into();
        }
        r["generation"] = generation.into();
        r["at_ms"] = drun_rendezvous::clock::now_ms().into();
        r.to_string()
    }
}

impl Agent {
    /// The persister's outcome for one step: once on disk and verified, the node's commit goes
    /// to the ledger.
    pub(super) fn persisted(
        &self,
        done: Done,
        stage: Option<&mut Stage>,
        ledger: Option<&mut NodeLedger>,
        link: &Link,
    ) {
        let Some(stage) = stage else {
            return;
        };
        let persisted = u64::from(done.result.is_ok());
        let generation = ledger.as_ref().map_or(done.key.1, |l| l.generation());
        let batch = stage.done(done, ledger);
        report_staging(stage, generation, link);
        if let Some(m) = &self.metrics {
            let (held, lag) = stage.lag();
            m.staging(held, lag, persisted);
        }
        if let Some(batch) = batch {
            let _ = link.tx.send(Request::Commit {
                commit: batch,
                retention: self.cfg.ckpt.retention,
            });
        }
    }

    /// The ledger's answer to a node commit (`--ckpt-memory`): a staged step's memory may go;
    /// one sealed after its generation's workers stopped (no ledger of that generation to
    /// publish it) still gets its manifest file and `latest` pointer in --ckpt-dir.
    pub(super) fn answered(
        &self,
        generation: u64,
        step: u64,
        result: &Result<drun_rendezvous::CommitOutcome, drun_rendezvous::CommitRefused>,
        stage: Option<&mut Stage>,
        ledger: Option<&NodeLedger>,
    ) {
        let Some(stage) = stage else {
            return;
        };
        stage.answered((step, generation));
        let published_by_ledger = ledger.is_some_and(|l| l.generation() == generation);
        if let (
            false,
            Ok(drun_rendezvous::CommitOutcome::Sealed {
                manifest,
                dropped,
                garbage,
            }),
        ) = (published_by_ledger, result)
        {
            crate::ckpt::resume::sealed_here(
                step,
                manifest,
                dropped,
                garbage,
                self.cfg.ckpt.dir.as_deref(),
            );
        }
    }
}

/// Sends this node's `staging` report (`status` shows it): at each change of its copies.
pub(super) fn report_staging(stage: &Stage, generation: u64, link: &Link) {
    let _ = link.tx.send(Request::Report {
        kind: ReportKind::Staging,
        json: stage.report(generation),
    });
}

/// The persister's next outcome, or never without one.
pub(super) async fn next_done(rx: &mut Option<mpsc::UnboundedReceiver<Done>>) -> Option<Done> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
