//! How fast the persister goes and when the workers' end waits for it: full speed for a
//! preemption's step, the end of the workers held (bounded by `--shutdown-timeout`) until the
//! staged steps are on disk, and the persister stopped when the agent goes.

use std::time::Duration;

use super::Stage;
use crate::ckpt::memory::decide::EndWait;

impl Stage {
    /// Workers start: their end will be held for the persister again.
    pub(in crate::agent::driver) fn workers_started(&mut self) {
        self.end_judged = false;
    }

    /// A preemption or a scale-up asked for a checkpoint: staged steps go to the disk at full
    /// speed from now on, until the next generation (its step must be sealed within the grace,
    /// or while the newcomer waits; the persister no longer yields the CPU).
    pub(in crate::agent::driver) fn hurry(&mut self) {
        self.hurried = true;
        self.throttle.set_urgent(true);
    }

    /// Whether the workers' end is held back for the persister (at most `limit`, not at all
    /// once the end is `forced`); says how long it waited, or what it could not persist, when
    /// the hold ends.
    pub(in crate::agent::driver) fn hold_end(&mut self, limit: Duration, forced: bool) -> bool {
        if self.end_judged {
            return false;
        }
        let now = std::time::Instant::now();
        let since = *self.end_since.get_or_insert_with(|| {
            // No training left to protect: full speed.
            self.throttle.set_rate(self.held_rate);
            self.throttle.set_urgent(true);
            now
        });
        match self.table.end_wait(since, now, limit, forced) {
            EndWait::Wait { .. } => true,
            verdict => {
                if let Some(line) = verdict.line() {
                    crate::say!("{line}");
                }
                self.end_since = None;
                self.end_judged = true;
                self.throttle.set_rate(self.rate);
                self.throttle
                    .set_urgent(self.hurried || self.table.behind());
                false
            }
        }
    }
}

impl Drop for Stage {
    /// The agent exits (or gives up staging): the persister stops, and the file it was
    /// writing leaves no temporary file in `--ckpt-dir`.
    fn drop(&mut self) {
        self.persister.stop(&self.throttle, Duration::from_secs(1));
    }
}
