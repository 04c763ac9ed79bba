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
                    Ok(took) => {
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
                        self.release(k);
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
