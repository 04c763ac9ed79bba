//! Straggler verdicts from step beacons: a rank whose recent step time exceeds the median of
//! the other ranks' by `--straggler-factor` for a whole window of steps is flagged once, and
//! cleared once when it comes back. Pure: step times (seconds) and instants come in as
//! arguments.
//!
//! The median covers every other rank of the job: this node's from their beacons, the other
//! nodes' from the job's pace ([`Detector::set_job_pace`]: every node reports its ranks'
//! medians every few seconds through the rendezvous, runs of at most
//! [`drun_rendezvous::store::reports::PACE_MAX_NODES`] nodes). Without the pace (larger runs, the
//! static backend) it covers this node's other ranks. Only this node's ranks are judged, so a
//! straggler is reported once, by its own node.

use std::collections::{BTreeMap, VecDeque};

use tokio::time::Instant;

/// How many recent steps a rank's step time is the median of, and how many consecutive steps
/// it must stay over the factor before it is flagged.
pub const WINDOW: usize = 20;
/// A straggler clears when its ratio to the median falls under `factor × CLEAR` (hysteresis).
pub const CLEAR: f64 = 0.9;

/// One rank's verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RankState {
    /// Runs with the others.
    Even,
    /// Slower than `factor ×` the median since `since`: its step time and the median then, in
    /// seconds per step.
    Straggling {
        since: Instant,
        step_time: f64,
        median: f64,
    },
}

/// A change of verdict, reported once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    /// `rank` takes `step_time` seconds per step, the others' median is `median` seconds.
    Started {
        rank: u32,
        step_time: f64,
        median: f64,
    },
    /// `rank` came back to `step_time` seconds per step.
    Cleared { rank: u32, step_time: f64 },
}

impl Event {
    /// The one line naming the rank, its node (rank) and host, its step time and the median.
    pub fn line(&self, node_rank: u32, host: &str, factor: f64) -> String {
        match *self {
            Event::Started {
                rank,
                step_time,
                median,
            } => format!(
                "straggler: rank {rank} (node {node_rank}, host {host}) takes {step_time:.2} s per \
                 step, {:.1}× the job median {median:.2} s (--straggler-factor {factor})",
                step_time / median
            ),
            Event::Cleared { rank, step_time } => format!(
                "rank {rank} (node {node_rank}, host {host}) is no longer a straggler \
                 ({step_time:.2} s per step)"
            ),
        }
    }
}

#[derive(Debug, Clone)]
struct Track {
    /// The last [`WINDOW`] step times, seconds.
    recent: VecDeque<f64>,
    /// Consecutive steps over the factor while [`RankState::Even`].
    over: usize,
    state: RankState,
}

/// The verdicts of one generation's ranks.
#[derive(Debug, Clone)]
pub struct Detector {
    /// `--straggler-factor` (> 1 to detect anything).
    factor: f64,
    ranks: BTreeMap<u32, Track>,
    /// The other nodes' ranks: median seconds per step, from the job's pace.
    remote: BTreeMap<u32, f64>,
}

impl Detector {
    /// A detector flagging ranks slower than `factor ×` the median.
    pub fn new(factor: f64) -> Self {
        Self {
            factor,
            ranks: BTreeMap::new(),
            remote: BTreeMap::new(),
        }
    }

    /// The job's pace (rank → median seconds per step, every node's report): the ranks of
    /// other nodes join the median the local ranks are compared with.
    pub fn set_job_pace(&mut self, pace: BTreeMap<u32, f64>) {
        self.remote = pace
            .into_iter()
            .filter(|(r, s)| !self.ranks.contains_key(r) && s.is_finite() && *s > 0.0)
            .collect();
    }

    /// This node's ranks with enough steps for a median: rank → median seconds per step (the
    /// node's pace report).
    pub fn medians(&self) -> BTreeMap<u32, f64> {
        self.ranks
            .iter()
            .filter(|(_, t)| t.recent.len() >= WINDOW / 2)
            .map(|(&r, t)| (r, median(t.recent.iter().copied())))
            .collect()
    }

    /// Forget every rank (a new generation).
    pub fn reset(&mut self) {
        self.ranks.clear();
        self.remote.clear();
    }

    /// The ranks flagged now: rank, its step time and the median then (seconds per step).
    pub fn stragglers(&self) -> Vec<(u32, f64, f64)> {
        self.ranks
            .iter()
            .filter_map(|(&r, t)| match t.state {
                RankState::Straggling {
                    step_time, median, ..
                } => Some((r, step_time, median)),
                RankState::Even => None,
            })
            .collect()
    }

    /// Rank `rank`'s verdict (`Even` for a rank never seen).
    pub fn state(&self, rank: u32) -> RankState {
        self.ranks.get(&rank).map_or(RankState::Even, |t| t.state)
    }

    /// Rank `rank` took `seconds` per step, measured at `now`: the change of its verdict, if any.
    pub fn observe(&mut self, rank: u32, seconds: f64, now: Instant) -> Option<Event> {
        let t = self.ranks.entry(rank).or_insert_with(|| Track {
            recent: VecDeque::with_capacity(WINDOW),
            over: 0,
            state: RankState::Even,
        });
        if t.recent.len() == WINDOW {
            t.recent.pop_front();
        }
        t.recent.push_back(seconds);
        if t.recent.len() < WINDOW {
            return None;
        }
        let mine = median(t.recent.iter().copied());
        let others = median(
            self.ranks
                .iter()
                .filter(|(&r, o)| r != rank && o.recent.len() >= WINDOW / 2)
                .map(|(_, o)| median(o.recent.iter().copied()))
                .chain(self.remote.values().copied()),
        );
        let t = self.ranks.get_mut(&rank).expect("inserted above");
        if others.is_nan() || others <= 0.0 {
            return None;
        }
        let ratio = mine / others;
        match t.state {
            RankState::Even if ratio > self.factor => {
                t.over += 1;
                if t.over < WINDOW {
                    return None;
                }
                t.over = 0;
                t.state = RankState::Straggling {
                    since: now,
                    step_time: mine,
                    median: others,
                };
                Some(Event::Started {
                    rank,
                    step_time: mine,
                    median: others,
                })
            }
            RankState::Even => {
                t.over = 0;
                None
            }
            RankState::Straggling { .. } if ratio < self.factor * CLEAR => {
                t.state = RankState::Even;
                Some(Event::Cleared {
                    rank,
                    step_time: mine,
                })
            }
            RankState::Straggling { .. } => None,
        }
    }
}

/// The median of `xs` (NaN when empty).
fn median(xs: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = xs.collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Feeds `steps` rounds of every rank's step time (`time(rank, step)`, seconds), ranks
    /// stepping on their own clocks; returns every event.
    fn run(d: &mut Detector, ranks: u32, steps: u64, time: impl Fn(u32, u64) -> f64) -> Vec<Event> {
        let t0 = Instant::now();
        let mut clock = vec![0.0; ranks as usize];
        let mut events = Vec::new();
        for step in 0..steps {
            for rank in 0..ranks {
                let dt = time(rank, step);
                clock[rank as usize] += dt;
                let now = t0 + Duration::from_secs_f64(clock[rank as usize]);
                events.extend(d.observe(rank, dt, now));
            }
        }
        events
    }

    #[test]
    fn other_nodes_pace_makes_a_lone_local_rank_comparable() {
        // One local rank at 0.3 s per step: alone it has nothing to lag behind ...
        let mut alone = Detector::new(1.5);
        assert!(run(&mut alone, 1, 60, |_, _| 0.3).is_empty());
        // ... with three remote ranks at 0.1 s it is a straggler, once.
        let mut d = Detector::new(1.5);
        d.set_job_pace(BTreeMap::from([(1, 0.1), (2, 0.1), (3, 0.11)]));
        let ev = run(&mut d, 1, 60, |_, _| 0.3);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert!(
            matches!(ev[0], Event::Started { rank: 0, median, .. } if (median - 0.1).abs() < 1e-9)
        );
        assert_eq!(d.stragglers().len(), 1);
        assert_eq!(d.medians().get(&0).copied(), Some(0.3));
        // A remote report for a local rank is ignored (its own beacons are fresher).
        d.set_job_pace(BTreeMap::from([(0, 9.0), (1, 0.3)]));
        assert_eq!(d.remote, BTreeMap::from([(1, 0.3)]));
    }

    /// Deterministic jitter in [-1, 1).
    fn jitter(rank: u32, step: u64) -> f64 {
        let mut x = (u64::from(rank) << 32 | step).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 32;
        (x % 2000) as f64 / 1000.0 - 1.0
    }

    #[test]
    fn a_three_times_slower_rank_is_flagged_once() {
        let mut d = Detector::new(1.5);
        let ev = run(&mut d, 4, 200, |r, s| {
            0.02 * (1.0 + 0.2 * jitter(r, s)) * if r == 3 { 3.0 } else { 1.0 }
        });
        assert_eq!(ev.len(), 1, "{ev:?}");
        let Event::Started {
            rank,
            step_time,
            median,
        } = ev[0]
        else {
            panic!("{ev:?}")
        };
        assert_eq!(rank, 3);
        assert!((step_time / median - 3.0).abs() < 0.5, "{ev:?}");
        assert!(matches!(d.state(3), RankState::Straggling { .. }));
        assert_eq!(d.state(0), RankState::Even);
        let line = ev[0].line(1, "h2", 1.5);
        assert!(
            line.starts_with("straggler: rank 3 (node 1, host h2) takes 0.06 s per step"),
            "{line}"
        );
    }

    #[test]
    fn two_ranks_suffice_the_slow_one_is_flagged() {
        let mut d = Detector::new(1.5);
        let ev = run(&mut d, 2, 100, |r, _| if r == 1 { 0.06 } else { 0.02 });
        assert_eq!(
            ev.iter()
                .map(|e| matches!(e, Event::Started { rank: 1, .. }))
                .filter(|&b| b)
                .count(),
            1,
            "{ev:?}"
        );
        assert_eq!(ev.len(), 1, "{ev:?}");
    }

    #[test]
    fn noisy_even_ranks_are_never_flagged() {
        let mut d = Detector::new(1.5);
        let ev = run(&mut d, 4, 300, |r, s| 0.02 * (1.0 + 0.2 * jitter(r, s)));
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn a_recovered_rank_is_cleared_once() {
        let mut d = Detector::new(1.5);
        let ev = run(&mut d, 4, 300, |r, s| {
            0.02 * if r == 2 && (50..150).contains(&s) {
                3.0
            } else {
                1.0
            }
        });
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(matches!(ev[0], Event::Started { rank: 2, .. }), "{ev:?}");
        assert!(matches!(ev[1], Event::Cleared { rank: 2, .. }), "{ev:?}");
        assert_eq!(d.state(2), RankState::Even);
        assert!(ev[1]
            .line(0, "h", 1.5)
            .contains("rank 2 (node 0, host h) is no longer a straggler"));
    }

    #[test]
    fn single_slow_steps_do_not_flag() {
        let mut d = Detector::new(1.5);
        // A checkpoint save every 25 steps takes 50 steps' time.
        let ev = run(&mut d, 4, 300, |r, s| {
            if r == 1 && s % 25 == 0 {
                1.0
            } else {
                0.02
            }
        });
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn a_lone_rank_has_no_median_to_lag() {
        let mut d = Detector::new(1.5);
        assert!(run(&mut d, 1, 100, |_, _| 1.0).is_empty());
    }
}
