//! The persister's decisions on memory, pure: whether a staged save fits the budget (and which
//! persisted copies and replicas make room for it, `decide/budget.rs`), what to persist next,
//! and whether the end of the run still waits (`decide/end.rs`) — each a function of (table, input, now) with a reason, tested
//! on synthetic instants. How fast it persists (the throttle, yielding the CPU) is
//! [`super::pace`].

mod budget;
mod end;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::human_bytes;

pub use budget::Admit;
pub use end::EndWait;

/// A step of this node: `(step, generation)`; orders like the ledger's ids.
pub type Key = (u64, u64);

/// Where this node's copy of a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyState {
    /// In memory only; the ranks were answered (or wait, for a direct save).
    Staged {
        /// When the ranks' commit completed.
        at: Instant,
    },
    /// Being written to `--ckpt-dir`.
    Persisting {
        /// When it was staged.
        staged_at: Instant,
        /// When the writing began.
        since: Instant,
    },
    /// Every file written, fsynced and verified in `--ckpt-dir`; the staged copy is kept for a
    /// resume from memory until the budget needs its room.
    Persisted {
        /// When it was staged.
        staged_at: Instant,
        /// When the last file was verified.
        at: Instant,
    },
}

impl CopyState {
    /// On disk, verified.
    pub fn is_persisted(&self) -> bool {
        matches!(self, CopyState::Persisted { .. })
    }
}

/// One step's staged copy on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    /// Bytes it holds in memory.
    pub bytes: u64,
    /// Where it stands.
    pub state: CopyState,
    /// It did not fit the budget: the ranks wait until it is persisted (a direct save), and
    /// its memory is released once the ledger answered.
    pub direct: bool,
    /// The ledger answered the node's commit sent once it was persisted (sealed, recorded, or
    /// refused): nothing of it is in flight any more.
    pub answered: bool,
}

/// This node's staged copies and the budget they share (`--ckpt-memory`).
#[derive(Debug, Clone, Default)]
pub struct Table {
    budget: u64,
    copies: BTreeMap<Key, Copy>,
    /// Bytes of the staging directory the budget holds besides the copies: the ranks' spare
    /// files ([`Table::set_outside`]).
    outside: u64,
    /// Room kept for the spares the ranks prepare after the last admitted save
    /// ([`Table::keep_for_spares`]), until the next save measures what they took.
    kept: u64,
    /// Room kept for the ranks' saves being written now ([`Table::room`]), until their step
    /// is admitted.
    reserved: u64,
    /// Bytes of replicas this node holds for other nodes (`--ckpt-replicas`): in the budget
    /// too, released after this node's own copies on disk ([`Table::set_replicas`]).
    replicas: u64,
}

impl Table {
    /// An empty table with `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            copies: BTreeMap::new(),
            outside: 0,
            kept: 0,
            reserved: 0,
            replicas: 0,
        }
    }

    /// The budget, bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes every copy holds in memory.
    pub fn held(&self) -> u64 {
        self.copies.values().map(|c| c.bytes).sum()
    }

    /// The copies, oldest step first.
    pub fn copies(&self) -> impl Iterator<Item = (&Key, &Copy)> {
        self.copies.iter()
    }

    /// Records `key`'s copy of `bytes`, staged at `now` (`direct`: the ranks wait for it).
    pub fn add(&mut self, key: Key, bytes: u64, direct: bool, now: Instant) {
        self.copies.insert(
            key,
            Copy {
                bytes,
                state: CopyState::Staged { at: now },
                direct,
                answered: false,
            },
        );
    }

    /// The copy to persist next: none while one is being written (one at a time, so the
    /// training's own I/O keeps the rest of the disk), else the oldest staged one (steps reach
    /// the ledger in order).
    pub fn next(&self) -> Option<Key> {
        if self
            .copies
            .values()
            .any(|c| matches!(c.state, CopyState::Persisting { .. }))
        {
            return None;
        }
        self.copies
            .iter()
            .find(|(_, c)| matches!(c.state, CopyState::Staged { .. }))
            .map(|(k, _)| *k)
    }

    /// When `key` was staged (its lag counts from then).
    pub fn staged_at(&self, key: Key) -> Option<Instant> {
        self.copies.get(&key).map(|c| match c.state {
            CopyState::Staged { at }
            | CopyState::Persisting { staged_at: at, .. }
            | CopyState::Persisted { staged_at: at, .. } => at,
        })
    }

    /// `key` began persisting at `now`.
    pub fn start(&mut self, key: Key, now: Instant) {
        if let Some(c) = self.copies.get_mut(&key) {
            if let CopyState::Staged { at } = c.state {
                c.state = CopyState::Persisting {
                    staged_at: at,
                    since: now,
                };
            }
        }
    }

    /// `key` is on disk, verified, at `now` (its node commit goes to the ledger).
    pub fn persisted(&mut self, key: Key, now: Instant) {
        let Some(c) = self.copies.get_mut(&key) else {
            return;
        };
        let staged_at = match c.state {
            CopyState::Staged { at } => at,
            CopyState::Persisting { staged_at, .. } | CopyState::Persisted { staged_at, .. } => {
                staged_at
            }
        };
        c.state = CopyState::Persisted { staged_at, at: now };
    }

    /// The ledger answered `key`'s commit. Returns whether its memory goes now (a direct save
    /// keeps none).
    pub fn answered(&mut self, key: Key) -> bool {
        let Some(c) = self.copies.get_mut(&key) else {
            return false;
        };
        c.answered = true;
        if c.direct {
            self.copies.remove(&key);
            return true;
        }
        false
    }

    /// Whether `key` is done with: on disk and answered by the ledger.
    fn settled(c: &Copy) -> bool {
        c.state.is_persisted() && c.answered
    }

    /// Forgets `key` (released, or its persisting failed).
    pub fn release(&mut self, key: Key) {
        self.copies.remove(&key);
    }

    /// Copies that can never be sealed once generation `running` runs: saved by an earlier
    /// generation and not begun persisting. The ledger refuses a commit of a generation that
    /// no longer runs, so writing them to disk would only delay the new generation's steps
    /// behind them and leave files no manifest names. (A copy being written is left to finish;
    /// copies on disk were committed in their own generation.)
    pub fn unsealable(&self, running: u64) -> Vec<Key> {
        self.copies
            .iter()
            .filter(|(k, c)| k.1 < running && matches!(c.state, CopyState::Staged { .. }))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Steps not yet on disk, oldest first (once on disk their node commits are on their
    /// way to the ledger, ahead of anything the agent sends after).
    pub fn pending(&self) -> Vec<Key> {
        self.copies
            .iter()
            .filter(|(_, c)| !c.state.is_persisted())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Whether a staged step waits behind another not yet on disk: the disk falls behind the
    /// saves, and the persister stops yielding the CPU to the training ([`super::pace::PaceInput::urgent`]).
    pub fn behind(&self) -> bool {
        self.copies
            .values()
            .filter(|c| !c.state.is_persisted())
            .nth(1)
            .is_some()
    }

    /// Steps not yet settled, oldest first: not on disk, or on disk with their node commit not
    /// yet answered by the ledger (not sealed or recorded yet).
    pub fn unsettled(&self) -> Vec<Key> {
        self.copies
            .iter()
            .filter(|(_, c)| !Self::settled(c))
            .map(|(k, _)| *k)
            .collect()
    }

    /// How far the disk is behind at `now`: the age of the oldest copy not yet persisted
    /// (zero when every copy is on disk).
    pub fn lag(&self, now: Instant) -> Duration {
        self.copies
            .values()
            .filter_map(|c| match c.state {
                CopyState::Staged { at } | CopyState::Persisting { staged_at: at, .. } => {
                    Some(now.saturating_duration_since(at))
                }
                CopyState::Persisted { .. } => None,
            })
            .max()
            .unwrap_or_default()
    }
}

impl Table {
    /// What `status` shows of this node's copies at `now` (the `staging` report, without its
    /// generation and time): the budget, the bytes held, the lag, and each copy, oldest first,
    /// with where it stands.
    pub fn report(&self, now: Instant) -> serde_json::Value {
        let steps: Vec<serde_json::Value> = self
            .copies
            .iter()
            .map(|((step, generation), c)| {
                let state = match c.state {
                    CopyState::Staged { .. } => "staged",
                    CopyState::Persisting { .. } => "persisting",
                    CopyState::Persisted { .. } => "persisted",
                };
                serde_json::json!({
                    "step": step, "generation": generation, "state": state, "bytes": c.bytes,
                })
            })
            .collect();
        serde_json::json!({
            "budget": self.budget,
            "held": self.held(),
            "outside": self.outside(),
            "lag_ms": u64::try_from(self.lag(now).as_millis()).unwrap_or(u64::MAX),
            "steps": steps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn an_earlier_generations_copies_not_yet_written_can_never_be_sealed() {
        let now = t0();
        let mut t = Table::new(100 * MIB);
        t.add((10, 1), MIB, false, now);
        t.add((15, 1), MIB, false, now);
        t.add((20, 1), MIB, false, now);
        t.add((25, 2), MIB, false, now);
        t.start((10, 1), now);
        t.persisted((10, 1), now);
        t.start((15, 1), now);
        assert_eq!(t.unsealable(1), vec![], "generation 1 still runs");
        assert_eq!(
            t.unsealable(2),
            vec![(20, 1)],
            "on disk or being written: left alone"
        );
        assert_eq!(t.unsealable(3), vec![(20, 1), (25, 2)]);
    }

    #[test]
    fn one_copy_is_persisted_at_a_time_oldest_first() {
        let now = t0();
        let mut t = Table::new(100 * MIB);
        assert_eq!(t.next(), None);
        t.add((5, 2), MIB, false, now);
        t.add((3, 2), MIB, false, now);
        assert_eq!(t.next(), Some((3, 2)));
        t.start((3, 2), now);
        assert_eq!(t.next(), None, "one at a time");
        t.persisted((3, 2), now);
        assert_eq!(t.next(), Some((5, 2)));
        assert_eq!(t.pending(), vec![(5, 2)]);
        assert!(!t.behind(), "one step left to write");
        t.add((7, 2), MIB, false, now);
        assert!(t.behind(), "step 7 waits behind step 5");
        t.start((5, 2), now);
        t.persisted((5, 2), now);
        assert!(!t.behind());
    }

    #[test]
    fn the_lag_is_the_age_of_the_oldest_copy_not_on_disk() {
        let now = t0();
        let mut t = Table::new(100 * MIB);
        t.add((1, 1), MIB, false, now);
        t.add((2, 1), MIB, false, now + Duration::from_secs(4));
        assert_eq!(
            t.lag(now + Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        t.start((1, 1), now + Duration::from_secs(1));
        assert_eq!(
            t.lag(now + Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        assert_eq!(t.staged_at((1, 1)), Some(now), "writing");
        assert_eq!(t.staged_at((2, 1)), Some(now + Duration::from_secs(4)));
        assert_eq!(t.staged_at((3, 1)), None);
        t.persisted((1, 1), now + Duration::from_secs(5));
        assert_eq!(t.lag(now + Duration::from_secs(10)), Duration::from_secs(6));
        t.persisted((2, 1), now + Duration::from_secs(6));
        assert_eq!(t.lag(now + Duration::from_secs(10)), Duration::ZERO);
    }

    #[test]
    fn the_report_shows_each_copy_and_the_lag() {
        let now = t0();
        let mut t = Table::new(100 * MIB);
        t.add((4, 1), MIB, false, now);
        t.add((8, 1), 2 * MIB, false, now + Duration::from_secs(1));
        t.start((4, 1), now);
        let r = t.report(now + Duration::from_millis(2_500));
        assert_eq!(r["budget"], 100 * MIB);
        assert_eq!(r["held"], 3 * MIB);
        assert_eq!(r["lag_ms"], 2_500);
        let states: Vec<(u64, &str)> = r["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["step"].as_u64().unwrap(), s["state"].as_str().unwrap()))
            .collect();
        assert_eq!(states, [(4, "persisting"), (8, "staged")]);
        t.persisted((4, 1), now + Duration::from_secs(3));
        t.persisted((8, 1), now + Duration::from_secs(3));
        let r = t.report(now + Duration::from_secs(4));
        assert_eq!(r["lag_ms"], 0);
        assert_eq!(r["steps"][1]["state"], "persisted");
    }

    #[test]
    fn a_direct_save_keeps_no_memory_once_on_disk() {
        let now = t0();
        let mut t = Table::new(10 * MIB);
        t.add((1, 1), 20 * MIB, true, now);
        t.persisted((1, 1), now);
        assert_eq!(t.held(), 20 * MIB, "until the ledger answers");
        assert!(t.answered((1, 1)));
        assert_eq!(t.held(), 0);
    }
}
