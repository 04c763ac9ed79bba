//! The staging side of a resume from memory: from this node's own staged copy (where it is,
//! and with `--ckpt-verify digest` whether it is still what its manifest says), and from the
//! survivors' copies (`--ckpt-replicas`): what this node reports holding in its joins, the step
//! its workers resume (kept until a newer step of this node is on disk), and the persisting of
//! the files it served for that step.

use std::path::{Path, PathBuf};

use drun_rendezvous::{Manifest, MemoryResume, NodeCommit, Plan};

use super::super::replicas::error::ReplicaError;
use super::super::replicas::fetch::gather;
use super::{Key, Pending, Stage};
use crate::ckpt::memory::persist::StagedFile;
use crate::ckpt::memory::{resume_from_memory, staged_path};

impl Stage {
    /// What this node holds in memory, as its join reports it: its own staged copies (a file
    /// whose digest the rank left to the agent, and which neither the replica sent to the
    /// neighbour nor the persister has hashed yet, is hashed here, once), the replicas it received, and the step it resumed from the survivors'
    /// copies (the files still here).
    pub(in crate::agent::driver) fn held(&mut self) -> Vec<drun_rendezvous::HeldStep> {
        let mut out = Vec::new();
        let keys: Vec<Key> = self.table.copies().map(|(k, _)| *k).collect();
        for key in keys {
            let Some(h) = self.own_held.get_mut(&key) else {
                continue;
            };
            for f in h.files.iter_mut().filter(|f| f.digest.is_empty()) {
                let digest = staged_path(self.dir.path(), &self.ckpt_dir, Path::new(&f.path))
                    .and_then(|p| crate::ckpt::digest::file(&p, crate::ckpt::digest::NEW).ok());
                if let Some((d, _)) = digest {
                    f.digest = d.to_string();
                }
            }
            out.push(h.clone());
        }
        if let Some(r) = &self.replicas {
            out.extend(r.held_steps());
        }
        if let Some(m) = &self.resumed {
            let files: Vec<_> = m
                .files
                .iter()
                .filter(|f| {
                    staged_path(self.dir.path(), &self.ckpt_dir, Path::new(&f.path))
                        .and_then(|p| std::fs::metadata(p).ok())
                        .is_some_and(|md| md.len() == f.bytes)
                })
                .cloned()
                .collect();
            if !files.is_empty() {
                out.push(drun_rendezvous::HeldStep {
                    step: m.step,
                    generation: m.generation,
                    saved_by: String::new(),
                    world_size: Some(m.world_size),
                    cursor: Some(m.cursor.clone()),
                    files,
                    staged_at_ms: None,
                });
            }
        }
        out
    }

    /// What a fetch for a resume from memory needs of this node.
    pub(in crate::agent::driver) fn local(
        &self,
        run_id: &str,
        me: &str,
        token: Option<String>,
    ) -> crate::agent::driver::replicas::fetch::Local {
        crate::agent::driver::replicas::fetch::Local {
            run_id: run_id.to_string(),
            me: me.to_string(),
            token,
            stage: self.dir.path().to_path_buf(),
            ckpt_dir: self.ckpt_dir.clone(),
        }
    }

    /// The workers resume `m` from the survivors' copies, its files gathered here: kept (and
    /// reported in joins) until this node's part of a newer step is on disk and answered by
    /// the ledger.
    pub(in crate::agent::driver) fn resuming(&mut self, m: &Manifest) {
        if self.resumed.as_ref() != Some(m) {
            self.drop_resumed();
            self.resumed = Some(m.clone());
        }
    }

    /// The workers of `plan` resume its step from the survivors' copies: this node persists
    /// the files of the ranks the plan names it the source of (each file of the step is
    /// written by exactly one member: its saver when it survived, else the survivor that served
    /// its replica), verified by digest like any staged step, then commits them — an empty
    /// commit when it serves none — so the ledger seals the step as its generation saved it
    /// once every member's part is on disk. Once per plan.
    pub(in crate::agent::driver) fn persist_resumed(
        &mut self,
        plan: &drun_rendezvous::Plan,
        me: &str,
    ) {
        let (Some(m), Some(mem)) = (&plan.resume, &plan.resume_memory) else {
            return;
        };
        let key = (m.step, plan.generation);
        if self.pending.contains_key(&key) || self.table.copies().any(|(k, _)| *k == key) {
            return;
        }
        let served: Vec<drun_rendezvous::ShardFile> = m
            .files
            .iter()
            .filter(|f| mem.sources.get(&f.rank).map(String::as_str) == Some(me))
            .cloned()
            .collect();
        let files: Vec<StagedFile> = served
            .iter()
            .filter_map(|f| {
                Some(StagedFile {
                    staged: staged_path(self.dir(), &self.ckpt_dir, Path::new(&f.path))?,
                    target: PathBuf::from(&f.path),
                    bytes: f.bytes,
                    digest: f.digest.clone(),
                })
            })
            .collect();
        let batch = NodeCommit {
            node_id: me.to_string(),
            generation: plan.generation,
            step: m.step,
            ranks: Vec::new(),
            cursor: m.cursor.clone(),
            files: served,
            save_started_ms: None,
            staged_ms: None,
        };
        tracing::info!(
            step = m.step,
            "persisting {} file(s) of checkpoint step {} (resumed from memory) to --ckpt-dir",
            files.len(),
            m.step
        );
        let bytes = files.iter().map(|f| f.bytes).sum();
        self.table.add(key, bytes, false, std::time::Instant::now());
        // Its files are the resumed step's (released with it), not a copy of their own.
        self.files.insert(key, Vec::new());
        self.pending.insert(key, Pending { batch, files });
        self.pump();
        self.sync_own();
    }

    /// This node's part of step `key` (of a later generation) is on disk and answered: a
    /// resumed step older than it is no longer kept in memory.
    pub(super) fn superseded(&mut self, key: Key) {
        if self
            .resumed
            .as_ref()
            .is_some_and(|m| m.step < key.0 && m.generation < key.1)
        {
            self.drop_resumed();
        }
    }

    /// Bytes of the resumed step's files that no other count holds: gathered here, not one of
    /// this node's own staged copies (the table counts those), and with no second link (a
    /// replica linked in is counted by the replicas it still is): the files fetched from
    /// other nodes, or a replica released since. They take tmpfs like a staged copy until the
    /// step is superseded, so they count in the budget.
    pub(super) fn fetched_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let Some(m) = &self.resumed else {
            return 0;
        };
        let own: std::collections::BTreeSet<&PathBuf> = self.files.values().flatten().collect();
        m.files
            .iter()
            .filter_map(|f| staged_path(self.dir.path(), &self.ckpt_dir, Path::new(&f.path)))
            .filter(|p| !own.contains(p))
            .filter_map(|p| std::fs::metadata(p).ok())
            .filter(|md| md.nlink() == 1)
            .map(|md| md.len().max(md.blocks() * 512))
            .sum()
    }

    /// Removes the resumed step's files gathered here, but for this node's own staged copies
    /// (released with their copy).
    fn drop_resumed(&mut self) {
        let Some(m) = self.resumed.take() else {
            return;
        };
        let own: std::collections::BTreeSet<&PathBuf> = self.files.values().flatten().collect();
        let mut gathered: Vec<PathBuf> = m
            .files
            .iter()
            .filter_map(|f| staged_path(self.dir.path(), &self.ckpt_dir, Path::new(&f.path)))
            .filter(|p| !own.contains(p))
            .collect();
        if let Some(d) = staged_path(self.dir.path(), &self.ckpt_dir, &m.dir()) {
            gathered.push(d.join(m.file_name()));
        }
        for f in gathered {
            let _ = std::fs::remove_file(f);
        }
    }

    /// The staged directory a resume of `m` reads instead of `--ckpt-dir`, when this agent
    /// holds every file of it.
    pub(in crate::agent::driver) fn resume_dir(&self, m: &Manifest) -> Option<PathBuf> {
        resume_from_memory(self.dir(), &self.ckpt_dir, m)
    }

    /// With `--ckpt-verify digest`: why the staged copy of `m` is not what its manifest says
    /// (`None`: it is), hashed off the async threads.
    pub(in crate::agent::driver) async fn staged_differs(&self, m: &Manifest) -> Option<String> {
        let (stage, ckpt_dir, m) = (self.dir().to_path_buf(), self.ckpt_dir.clone(), m.clone());
        tokio::task::spawn_blocking(move || {
            crate::ckpt::memory::staged_differs(&stage, &ckpt_dir, &m)
        })
        .await
        .unwrap_or_else(|e| Some(format!("the check did not finish: {e}")))
    }
}

impl crate::agent::Agent {
    /// The resume check of a plan resuming `m` from the survivors' copies (`sources`): the
    /// files gathered into this node's staging directory and verified, in the background;
    /// `Use` with the manifest file written there, or `Bad` (marked, the group re-forms onto
    /// the persisted step) with the line why.
    pub(in crate::agent::driver) fn resume_from_peers(
        &self,
        plan: &Plan,
        m: Manifest,
        sources: MemoryResume,
        stage: Option<&mut Stage>,
    ) -> tokio::task::JoinHandle<crate::ckpt::resume::Verdict> {
        use crate::ckpt::resume::Verdict;
        let local = stage.map(|s| {
            s.resuming(&m);
            s.local(
                &self.cfg.run_id,
                &self.cfg.node_id,
                self.cfg.security.rdzv_token_text(),
            )
        });
        let plan = plan.clone();
        tokio::spawn(async move {
            let ready = match &local {
                Some(local) => gather(local, &plan, &m, &sources).await,
                None => Err(ReplicaError::NoStage),
            };
            match ready {
                Ok(manifest_file) => {
                    tracing::info!(
                        "resuming from checkpoint step {} (saved by generation {} at world size {}, now {}) from the survivors' copies in memory, every file verified by its digest; data: epoch {}, sample {} of its permutation",
                        m.step,
                        m.generation,
                        m.world_size,
                        plan.world_size,
                        m.cursor.epoch,
                        m.cursor.consumed_in_epoch
                    );
                    Verdict::Use(Some(manifest_file))
                }
                Err(reason) => {
                    crate::say!(
                        "drun: checkpoint step {} (generation {}) could not be gathered from the survivors' copies: {reason}; marked bad, falling back to the persisted step",
                        m.step,
                        m.generation
                    );
                    Verdict::Bad {
                        id: m.id(),
                        reason: reason.to_string(),
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::{Cursor, ShardFile};

    /// A file of `bytes` at `rel` under the staging directory `stage`.
    fn staged(stage: &Path, rel: &str, bytes: usize) -> PathBuf {
        let p = stage.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, vec![7u8; bytes]).unwrap();
        p
    }

    #[test]
    fn fetched_files_of_a_resumed_step_count_in_the_budget_and_own_or_linked_ones_do_not() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let (mut s, _done) = Stage::open_in(shm.path(), 1 << 30, ckpt.path()).expect("a stage");
        let stage = s.dir().to_path_buf();
        const PAGE: usize = 4096;
        // Rank 0's file is this node's own staged copy (the table counts it); rank 1's was
        // fetched from another node; rank 2's is a replica this node holds, linked in.
        let own = staged(&stage, "step-6/rank0.pt", PAGE);
        s.files.insert((6, 1), vec![own]);
        staged(&stage, "step-6/rank1.pt", 2 * PAGE);
        let replica = staged(&stage, ".replicas/step-6-rank2.pt", 3 * PAGE);
        std::fs::hard_link(&replica, stage.join("step-6/rank2.pt")).unwrap();
        let file = |rank: u32, pages: usize| ShardFile {
            rank,
            path: ckpt
                .path()
                .join(format!("step-6/rank{rank}.pt"))
                .display()
                .to_string(),
            bytes: (pages * PAGE) as u64,
            digest: String::new(),
        };
        let m = Manifest {
            run_id: "run".into(),
            step: 6,
            generation: 1,
            world_size: 3,
            cursor: Cursor::default(),
            files: vec![file(0, 1), file(1, 2), file(2, 3)],
            sealed_at_ms: 0,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        };
        assert_eq!(s.fetched_bytes(), 0, "nothing resumed yet");
        s.resuming(&m);
        assert_eq!(
            s.fetched_bytes(),
            (2 * PAGE) as u64,
            "the fetched file alone"
        );
        assert!(s.spares().is_empty(), "no spare files here");
        // The replica is released: its link here is the last one, and now counts.
        std::fs::remove_file(&replica).unwrap();
        assert_eq!(s.fetched_bytes(), (5 * PAGE) as u64);
        // A newer step of this node is on disk: the resumed one is dropped, and so is its count.
        s.superseded((8, 2));
        assert_eq!(s.fetched_bytes(), 0);
        assert!(
            !stage.join("step-6/rank1.pt").exists(),
            "the fetched file removed"
        );
    }
}
