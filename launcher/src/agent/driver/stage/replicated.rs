//! The stage's side of replicas on peers (`--ckpt-replicas 1`, transport in
//! [`crate::agent::driver::replicas`]): starting them, what the loop hears of them (sent,
//! received, own copies to release for a replica), and the shelf told of this node's own
//! copies.

use tokio::sync::mpsc;

use super::{report_staging, Stage};
use crate::agent::Agent;
use crate::ckpt::node::NodeLedger;
use crate::rdzv::Link;

impl Stage {
    /// Starts replicas (`--ckpt-replicas 1`) on `listener`: the loop hears of them on the
    /// receiver returned; `None` (after one warning line) when they cannot start.
    pub(in crate::agent::driver) fn start_replicas(
        &mut self,
        listener: std::net::TcpListener,
        run_id: &str,
        me: &str,
        token: Option<String>,
    ) -> Option<mpsc::UnboundedReceiver<crate::agent::driver::replicas::Note>> {
        match crate::agent::driver::replicas::Replicas::start(
            listener,
            run_id,
            me,
            token,
            &self.ckpt_dir,
            self.dir.path(),
            self.table.budget(),
        ) {
            Ok((r, rx)) => {
                self.replicas = Some(r);
                self.sync_own();
                Some(rx)
            }
            Err(e) => {
                crate::say!("drun: warning: --ckpt-replicas: cannot start: {e}; this node's checkpoints stay on this node only");
                None
            }
        }
    }

    /// The digest of each file of own step `key` as it was sent to the neighbour, which
    /// verified it (`(final path, digest)`): a file whose rank left its digest to the agent
    /// has it from here on, so a join after a fault reports the step without hashing its
    /// files on the agent's loop ([`Stage::held`]).
    fn sent_digests(&mut self, key: super::Key, digests: &[(String, String)]) {
        let Some(h) = self.own_held.get_mut(&key) else {
            return;
        };
        for f in h.files.iter_mut().filter(|f| f.digest.is_empty()) {
            if let Some((_, d)) = digests.iter().find(|(path, _)| *path == f.path) {
                f.digest.clone_from(d);
            }
        }
    }

    /// What the loop heard of replicas: `1` when one of this node's steps was verified on its
    /// neighbour (for the metric).
    pub(in crate::agent::driver) fn replica_note(
        &mut self,
        n: crate::agent::driver::replicas::Note,
    ) -> u64 {
        use crate::agent::driver::replicas::Note;
        let Some(r) = self.replicas.as_mut() else {
            return 0;
        };
        match n {
            Note::Sent { key, to, result } => {
                r.sent(key, result.is_ok());
                match result {
                    Ok((took, digests)) => {
                        self.sent_digests(key, &digests);
                        tracing::info!(
                            step = key.0,
                            gen = key.1,
                            to = %to,
                            "checkpoint step replicated to {to} in {:.2} s",
                            took.as_secs_f64()
                        );
                        return 1;
                    }
                    Err(why) => crate::say!(
                        "drun: warning: checkpoint step {} was not replicated to {to}: {why}; it stays on this node only",
                        key.0
                    ),
                }
            }
            Note::Received { key, from } => {
                tracing::info!(step = key.0, gen = key.1, from = %from, "holding a replica of {from}'s checkpoint step {}", key.0);
            }
            Note::ReleaseOwn(keys) => {
                for k in keys {
                    let persisted = self
                        .table
                        .copies()
                        .any(|(c, copy)| *c == k && copy.state.is_persisted());
                    if persisted {
                        // Its pages are freed for the replica (which waits for it), not kept
                        // as a spare.
                        self.free_now(k, "its room is wanted for a replica");
                    }
                }
            }
        }
        0
    }

    /// Bytes of other nodes' replicas held here.
    pub(in crate::agent::driver) fn replica_bytes(&self) -> u64 {
        self.replicas.as_ref().map_or(0, |r| r.held().1)
    }

    /// Tells the replica shelf this node's own copies (its budget counts them).
    pub(super) fn sync_own(&self) {
        if let Some(r) = &self.replicas {
            r.own(
                self.table
                    .copies()
                    .map(|(k, c)| crate::ckpt::memory::replica::Held {
                        key: *k,
                        bytes: c.bytes,
                        replica: false,
                        persisted: c.state.is_persisted(),
                    })
                    .collect(),
                self.table.outside(),
            );
        }
    }
}

impl Agent {
    /// A note of replicas: recorded, shown in `status` and counted.
    pub(in crate::agent::driver) fn replica_note(
        &self,
        note: crate::agent::driver::replicas::Note,
        stage: Option<&mut Stage>,
        ledger: Option<&NodeLedger>,
        link: &Link,
    ) {
        let Some(stage) = stage else {
            return;
        };
        let sent = stage.replica_note(note);
        let generation = ledger.map_or(stage.followed, NodeLedger::generation);
        report_staging(stage, generation, link);
        if let Some(m) = &self.metrics {
            m.replicas(sent, stage.replica_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ckpt::digest::{Hasher, NEW};

    #[test]
    fn a_digest_verified_by_the_neighbour_spares_the_join_hashing_the_staged_copy() {
        let shm = tempfile::tempdir().unwrap();
        let ckpt = tempfile::tempdir().unwrap();
        let (mut s, _done) = Stage::open_in(shm.path(), 1 << 30, ckpt.path()).expect("a stage");
        let key = (4, 1);
        let target = ckpt.path().join("step-4/rank0.pt").display().to_string();
        let staged = s.dir().join("step-4/rank0.pt");
        std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
        std::fs::write(&staged, b"weights").unwrap();
        let mut h = Hasher::new(NEW);
        h.update(b"weights");
        let real = h.finish().to_string();
        s.table.add(key, 7, false, std::time::Instant::now());
        let unhashed = drun_rendezvous::HeldStep {
            step: 4,
            generation: 1,
            saved_by: "a".into(),
            world_size: Some(1),
            cursor: None,
            files: vec![drun_rendezvous::ShardFile {
                rank: 0,
                path: target.clone(),
                bytes: 7,
                digest: String::new(),
            }],
            staged_at_ms: None,
        };
        // Not sent yet: the join hashes the staged copy itself.
        s.own_held.insert(key, unhashed.clone());
        assert_eq!(s.held()[0].files[0].digest, real);
        // Sent and verified: the join takes that digest and reads nothing (the staged copy is
        // gone here, so a hash could not be taken).
        s.own_held.insert(key, unhashed);
        std::fs::remove_file(&staged).unwrap();
        s.sent_digests(key, &[(target, real.clone())]);
        assert_eq!(s.held()[0].files[0].digest, real);
    }
}
