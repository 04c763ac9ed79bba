//! Where the time of one generation went, from the progress beacons and the seals: the work
//! a seal made durable (for goodput), the work a re-form threw away (lost work), and each
//! rank's step time. Pure: instants come in as arguments.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// The steps of one generation of this node's ranks.
#[derive(Debug, Clone)]
pub struct WorkClock {
    /// When the first local rank reached each step not sealed yet.
    reached: BTreeMap<u64, Instant>,
    /// The newest durable step (sealed, or resumed from) and when it was reached (for the
    /// resume point: when the workers were spawned).
    durable: (u64, Instant),
    /// Highest step any local rank announced.
    top: Option<u64>,
    /// Each rank's last beacon.
    ranks: RankClock,
}

/// Each rank's last beacon (its step and when), measuring the next one against it.
#[derive(Debug, Clone, Default)]
pub struct RankClock {
    last: BTreeMap<u32, (u64, Instant)>,
}

impl RankClock {
    /// Rank `rank` reached `step` at `now`; its step time when it moved on since its last
    /// beacon (`None` for its first beacon, or a repeated/older step).
    pub fn beacon(&mut self, rank: u32, step: u64, now: Instant) -> Option<StepTime> {
        let before = self.last.insert(rank, (step, now));
        let (prev, at) = before?;
        if step <= prev {
            self.last.insert(rank, (prev, at));
            return None;
        }
        let steps = step - prev;
        Some(StepTime {
            steps,
            seconds: now.saturating_duration_since(at).as_secs_f64() / steps as f64,
        })
    }
}

/// One rank's beacon, measured against its previous one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    /// Steps since the previous beacon (≥ 1).
    pub steps: u64,
    /// Seconds per step since the previous beacon.
    pub seconds: f64,
}

impl WorkClock {
    /// A generation spawned at `spawned`, resuming after step `resume_step` (0: fresh).
    pub fn new(spawned: Instant, resume_step: u64) -> Self {
        Self {
            reached: BTreeMap::new(),
            durable: (resume_step, spawned),
            top: None,
            ranks: RankClock::default(),
        }
    }

    /// Rank `rank` reached `step` at `now`; its step time when it moved on since its last
    /// beacon (`None` for its first beacon, or a repeated/older step).
    pub fn beacon(&mut self, rank: u32, step: u64, now: Instant) -> Option<StepTime> {
        if step > self.durable.0 {
            self.reached.entry(step).or_insert(now);
        }
        self.top = Some(self.top.map_or(step, |t| t.max(step)));
        self.ranks.beacon(rank, step, now)
    }

    /// Step `step` was sealed: the wall time it made durable since the previous durable step
    /// (from when that one was reached to when `step` was; zero if no local rank announced a
    /// step up to `step`, or it is not newer).
    pub fn sealed(&mut self, step: u64) -> Duration {
        if step <= self.durable.0 {
            return Duration::ZERO;
        }
        let Some((_, &at)) = self.reached.range(..=step).next_back() else {
            return Duration::ZERO;
        };
        let gained = at.saturating_duration_since(self.durable.1);
        self.durable = (step, at);
        self.reached = self.reached.split_off(&(step + 1));
        gained
    }

    /// What stopping the generation at `now` throws away: the wall time since the newest
    /// durable step was reached, and the steps announced past it.
    pub fn lost(&self, now: Instant) -> (Duration, u64) {
        let steps = self.top.map_or(0, |t| t.saturating_sub(self.durable.0));
        (now.saturating_duration_since(self.durable.1), steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn step_time_is_the_gap_between_a_ranks_beacons_per_step() {
        let t0 = Instant::now();
        let mut w = WorkClock::new(t0, 0);
        assert_eq!(w.beacon(0, 1, t0 + s(1.0)), None);
        let st = w.beacon(0, 3, t0 + s(2.0)).unwrap();
        assert_eq!(st.steps, 2);
        assert!((st.seconds - 0.5).abs() < 1e-9, "{st:?}");
        assert_eq!(
            w.beacon(0, 3, t0 + s(3.0)),
            None,
            "a repeated step is no step"
        );
        let st = w.beacon(0, 4, t0 + s(3.0)).unwrap();
        assert!(
            (st.seconds - 1.0).abs() < 1e-9,
            "measured from the last step, {st:?}"
        );
        assert_eq!(
            w.beacon(1, 4, t0 + s(3.0)),
            None,
            "ranks are measured apart"
        );
    }

    #[test]
    fn a_seal_makes_the_work_up_to_its_step_durable_and_the_rest_is_lost() {
        let t0 = Instant::now();
        let mut w = WorkClock::new(t0, 0);
        for step in 1..=6 {
            w.beacon(0, step, t0 + s(step as f64));
            w.beacon(1, step, t0 + s(step as f64 + 0.5));
        }
        assert_eq!(
            w.sealed(4),
            s(4.0),
            "spawn to the first rank reaching step 4"
        );
        assert_eq!(w.sealed(4), Duration::ZERO, "counted once");
        assert_eq!(w.lost(t0 + s(10.0)), (s(6.0), 2));
        assert_eq!(w.sealed(6), s(2.0));
        assert_eq!(w.lost(t0 + s(10.0)), (s(4.0), 0));
    }

    #[test]
    fn a_resumed_generation_counts_from_its_spawn_and_its_resume_step() {
        let t0 = Instant::now();
        let mut w = WorkClock::new(t0, 10);
        assert_eq!(w.lost(t0 + s(3.0)), (s(3.0), 0), "nothing announced yet");
        w.beacon(0, 11, t0 + s(4.0));
        w.beacon(0, 12, t0 + s(5.0));
        assert_eq!(w.sealed(9), Duration::ZERO, "older than the resume point");
        assert_eq!(w.lost(t0 + s(6.0)), (s(6.0), 2));
        assert_eq!(w.sealed(12), s(5.0));
    }
}
