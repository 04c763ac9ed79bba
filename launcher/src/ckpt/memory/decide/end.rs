//! The end of the workers, held for the staged copies: how long the agent waits for the disk
//! (at most `--shutdown-timeout`, not at all after a second SIGINT), and the line it says.

use std::time::{Duration, Instant};

use super::{Key, Table};

impl Table {
    /// Whether the workers' end is reported yet: the agent began waiting for its staged
    /// copies at `since` — until each is on disk and its node commit answered by the ledger
    /// (sealed or recorded: its manifest file and `latest` pointer are written then) — and
    /// waits at most `limit` (`--shutdown-timeout`), or not at all once the user `forced` the
    /// end (a second SIGINT: the agent exits now).
    pub fn end_wait(&self, since: Instant, now: Instant, limit: Duration, forced: bool) -> EndWait {
        let pending = self.unsettled();
        let waited = now.saturating_duration_since(since);
        if pending.is_empty() {
            EndWait::Done { waited }
        } else if forced || waited >= limit {
            EndWait::GiveUp {
                waited,
                unpersisted: pending,
                forced,
            }
        } else {
            EndWait::Wait {
                until: since + limit,
            }
        }
    }
}

/// The end-of-run judgement ([`Table::end_wait`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndWait {
    /// Every staged copy is on disk: report the end (after `waited`).
    Done {
        /// How long the end waited.
        waited: Duration,
    },
    /// Some are still being written: wait, at most until `until`.
    Wait {
        /// The limit.
        until: Instant,
    },
    /// The limit passed: report the end; these steps are not on disk.
    GiveUp {
        /// How long the end waited.
        waited: Duration,
        /// Steps not persisted.
        unpersisted: Vec<Key>,
        /// Given up at a second SIGINT, not at the limit.
        forced: bool,
    },
}

impl EndWait {
    /// The line the agent says about the wait; `None` when it did not wait at all.
    pub fn line(&self) -> Option<String> {
        match self {
            EndWait::Done { waited } if waited.is_zero() => None,
            EndWait::Done { waited } => Some(format!(
                "drun: waited {:.2} s for the staged checkpoints to be persisted to --ckpt-dir",
                waited.as_secs_f64()
            )),
            EndWait::Wait { .. } => None,
            EndWait::GiveUp {
                waited,
                unpersisted,
                forced,
            } => Some(format!(
                "drun: after {:.1} s ({}) checkpoint step(s) {} are not persisted to --ckpt-dir and sealed: they are no resume point, and their staged copies go with this agent",
                waited.as_secs_f64(),
                if *forced {
                    "a second SIGINT"
                } else {
                    "--shutdown-timeout"
                },
                unpersisted
                    .iter()
                    .map(|(s, g)| format!("{s} (generation {g})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_end_waits_for_the_disk_up_to_the_shutdown_timeout() {
        let now = Instant::now();
        let limit = Duration::from_secs(30);
        let mut t = Table::new(100 * MIB);
        assert_eq!(
            t.end_wait(now, now, limit, false),
            EndWait::Done {
                waited: Duration::ZERO
            }
        );
        assert_eq!(t.end_wait(now, now, limit, false).line(), None);
        t.add((7, 1), MIB, false, now);
        assert_eq!(
            t.end_wait(now, now + Duration::from_secs(3), limit, false),
            EndWait::Wait { until: now + limit }
        );
        let gave_up = t.end_wait(now, now + limit, limit, false);
        assert_eq!(
            gave_up,
            EndWait::GiveUp {
                waited: limit,
                unpersisted: vec![(7, 1)],
                forced: false,
            }
        );
        let line = gave_up.line().unwrap();
        assert!(
            line.contains(
                "(--shutdown-timeout) checkpoint step(s) 7 (generation 1) are not persisted"
            ),
            "{line}"
        );
        // A second SIGINT: the agent exits now, and names what it leaves.
        let forced = t.end_wait(now, now + Duration::from_secs(3), limit, true);
        let line = forced.line().unwrap();
        assert!(
            line.contains("after 3.0 s (a second SIGINT) checkpoint step(s) 7 (generation 1)"),
            "{line}"
        );
        t.persisted((7, 1), now + Duration::from_secs(2));
        assert_eq!(
            t.end_wait(now, now + Duration::from_secs(2), limit, false),
            EndWait::Wait { until: now + limit },
            "on disk, but the ledger has not answered its commit: no manifest file yet"
        );
        t.answered((7, 1));
        let done = t.end_wait(now, now + Duration::from_secs(2), limit, false);
        assert!(done.line().unwrap().contains("waited 2.00 s"), "{done:?}");
    }
}
