//! A new generation, seen from the staged copies: replicas follow its ring, a save hurried for
//! the generation that ended no longer is, and that generation's copies not yet on disk, which
//! the ledger can never seal, are freed rather than persisted ahead of the new generation's.

use super::Stage;

impl Stage {
    /// A new generation: replicas follow its ring, and the copies of earlier generations that
    /// can never be sealed ([`Table::unsealable`]) are not persisted: they are freed, but for
    /// the step the plan resumes from memory, whose files the resume reads (they go with it:
    /// [`Stage::resuming`]).
    pub(in crate::agent::driver) fn follow(&mut self, plan: &drun_rendezvous::Plan) {
        self.followed = plan.generation;
        self.followed_world = plan.world_size;
        // A save hurried for the generation that ended (a scale-up's) is behind it: the
        // persister yields to the new generation's training again.
        self.hurried = false;
        if let Some(r) = self.replicas.as_mut() {
            r.follow(plan);
        }
        let resumed = plan
            .resume
            .as_ref()
            .filter(|_| plan.resume_memory.is_some())
            .map(|m| (m.step, m.generation));
        let stale = self.table.unsealable(plan.generation);
        let freed: Vec<String> = stale
            .iter()
            .filter(|k| Some(**k) != resumed)
            .map(|k| format!("{} (generation {})", k.0, k.1))
            .collect();
        if !freed.is_empty() {
            tracing::info!(
                "checkpoint step(s) {} staged in memory are freed, not persisted: generation {} runs, and the ledger seals no step of an earlier generation",
                freed.join(", "),
                plan.generation
            );
        }
        for key in stale {
            self.pending.remove(&key);
            if Some(key) == resumed {
                // Its files are the resumed step's now, removed with it.
                self.own_held.remove(&key);
                self.files.remove(&key);
                self.table.release(key);
                if let Some(m) = &plan.resume {
                    self.resuming(m);
                }
            } else {
                self.release(key);
            }
        }
        self.sync_own();
    }
}
