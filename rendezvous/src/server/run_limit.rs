//! How many runs one `drun-rendezvous` server serves at once: a run counts while any of its
//! agents holds a session; a session of a new run past the limit is refused
//! (`ResourceExhausted`), one of a run already served never is.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::clock::now_ms;

/// Default limit of runs served at once by one server (`--max-runs`).
pub const DEFAULT_MAX_RUNS: usize = 1000;

/// Sessions open per run, bounded in the number of runs.
#[derive(Debug)]
pub struct RunTable {
    max: usize,
    open: Mutex<HashMap<String, usize>>,
    /// When any agent of each run was last heard on this server (ms since the epoch), shared by
    /// the run's sessions ([`crate::session::hold`]). Outlives the run's sessions: when every
    /// stream of a run broke at once, the sessions holding its leases must see the first agent
    /// that comes back, on whatever new session.
    contact: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

/// A session's place in its run's count; leaving it (drop) closes the place.
#[derive(Debug)]
pub struct RunSeat {
    table: Arc<RunTable>,
    run: String,
}

impl RunTable {
    /// A table serving at most `max` runs at once (at least 1).
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            open: Mutex::new(HashMap::new()),
            contact: Mutex::new(HashMap::new()),
        })
    }

    /// The last-heard clock of `run`'s agents on this server (created now if new). Clocks no
    /// session holds any more and that are older than the longest hold are dropped here.
    pub fn contact(&self, run: &str) -> Arc<AtomicU64> {
        use std::sync::atomic::Ordering;
        let mut all = self
            .contact
            .lock()
            .expect("contact table lock is never poisoned");
        let now = now_ms();
        let stale = crate::session::hold::HOLD_MAX.as_millis() as u64;
        all.retain(|r, c| {
            r == run
                || Arc::strong_count(c) > 1
                || now.saturating_sub(c.load(Ordering::SeqCst)) <= stale
        });
        all.entry(run.to_string())
            .or_insert_with(|| Arc::new(AtomicU64::new(now)))
            .clone()
    }

    /// A seat for one more session of `run`.
    ///
    /// # Errors
    /// One line when `run` is not served yet and `max` runs already are.
    pub fn enter(self: &Arc<Self>, run: &str) -> Result<RunSeat, RunLimitError> {
        let mut open = self.open.lock().expect("run table lock is never poisoned");
        if !open.contains_key(run) && open.len() >= self.max {
            return Err(RunLimitError {
                served: open.len(),
                max: self.max,
                run: run.to_string(),
            });
        }
        *open.entry(run.to_string()).or_default() += 1;
        Ok(RunSeat {
            table: self.clone(),
            run: run.to_string(),
        })
    }

    /// Runs with a session open.
    pub fn runs(&self) -> usize {
        self.open
            .lock()
            .expect("run table lock is never poisoned")
            .len()
    }
}

impl Drop for RunSeat {
    fn drop(&mut self) {
        let mut open = self
            .table
            .open
            .lock()
            .expect("run table lock is never poisoned");
        if let Some(n) = open.get_mut(&self.run) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.run);
            }
        }
    }
}

/// A new run refused because the server serves `--max-runs` runs already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this server already serves {served} runs, its limit (--max-runs {max}); run '{run}' is refused: end a run, raise --max-runs, or use another server")]
pub struct RunLimitError {
    /// Runs served now.
    pub served: usize,
    /// `--max-runs`.
    pub max: usize,
    /// The run refused.
    pub run: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_past_the_limit_is_refused_and_a_served_one_never_is() {
        let t = RunTable::new(2);
        let a1 = t.enter("a").unwrap();
        let _b = t.enter("b").unwrap();
        let err = t.enter("c").unwrap_err().to_string();
        assert!(err.contains("--max-runs 2") && err.contains("'c'"), "{err}");
        let a2 = t
            .enter("a")
            .expect("a run already served takes more sessions");
        drop(a1);
        assert!(t.enter("c").is_err(), "run a still has a session");
        drop(a2);
        assert_eq!(t.runs(), 1);
        let _c = t
            .enter("c")
            .expect("a's last session closed: a place is free");
    }
}
