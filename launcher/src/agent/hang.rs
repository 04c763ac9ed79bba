//! Hang detection from step beacons (`--hang-timeout`): per local rank the last beacon's step
//! and instant, and a pure verdict of (beacons, now, timeout). A rank that never sent a beacon
//! is never judged: detection is opt-in by use of `drun.progress(step)`.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// `--hang-timeout auto`: no verdict before a rank sent this many beacons.
pub const AUTO_AFTER: usize = 10;
/// `--hang-timeout auto`: this many median step times ...
pub const AUTO_FACTOR: u32 = 10;
/// ... but never less than this (long first steps, evaluation pauses).
pub const AUTO_FLOOR: Duration = Duration::from_secs(60);
/// Step times kept per rank (the median is taken over them).
const KEPT: usize = 100;

/// `--hang-timeout`: fixed, or a multiple of the observed step time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// This long.
    Fixed(Duration),
    /// [`AUTO_FACTOR`] × the median step time, at least [`AUTO_FLOOR`], once a rank sent
    /// [`AUTO_AFTER`] beacons.
    Auto,
}

/// The signal whose handler (Python's `faulthandler`) dumps a worker's stacks.
pub const DUMP_SIGNAL: nix::sys::signal::Signal = nix::sys::signal::Signal::SIGUSR1;

/// The last beacon of each rank of one generation.
#[derive(Debug, Default, Clone)]
pub struct Beacons {
    last: BTreeMap<u32, (u64, Instant)>,
    /// Recent seconds per step of each rank (between beacons that advanced the step).
    step_times: BTreeMap<u32, std::collections::VecDeque<Duration>>,
    /// When the ranks' flight recorders were last dumped ahead of a verdict
    /// ([`Beacons::snapshot_due`]).
    snapshot: Option<Instant>,
}

/// The local ranks' flight recorder dumps taken ahead of a verdict ([`Beacons::snapshot_due`]),
/// and the generation they are of.
pub struct FlightSnapshot {
    /// The generation of the ranks that wrote them.
    pub generation: u64,
    /// Each local rank's (global rank) answer.
    pub dumps: BTreeMap<u32, drun_rendezvous::decisions::flight::Outcome>,
}

/// A verdict: some ranks made no progress for the timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct Hang {
    /// Global rank, last step, silent for.
    pub stuck: Vec<(u32, u64, Duration)>,
    /// Global rank, last step of the ranks that still progress.
    pub progressing: Vec<(u32, u64)>,
}

impl Beacons {
    /// Notes a beacon of `rank` at `step`.
    pub fn beacon(&mut self, rank: u32, step: u64, now: Instant) {
        if let Some((before, at)) = self.last.insert(rank, (step, now)) {
            if step > before {
                let per_step = now.saturating_duration_since(at) / (step - before) as u32;
                let times = self.step_times.entry(rank).or_default();
                if times.len() == KEPT {
                    times.pop_front();
                }
                times.push_back(per_step);
            }
        }
    }

    /// `rank` finished (its worker exited 0): it is not judged any more.
    pub fn forget(&mut self, rank: u32) {
        self.last.remove(&rank);
        self.step_times.remove(&rank);
    }

    /// The timeout in force: `None` while `auto` has seen too few steps.
    pub fn timeout(&self, t: Timeout) -> Option<Duration> {
        let Timeout::Fixed(d) = t else {
            let seen = self.step_times.values().map(|v| v.len() + 1).max()?;
            if seen < AUTO_AFTER {
                return None;
            }
            let mut all: Vec<Duration> = self.step_times.values().flatten().copied().collect();
            all.sort();
            let median = all[all.len() / 2];
            return Some((median * AUTO_FACTOR).max(AUTO_FLOOR));
        };
        Some(d)
    }

    /// Whether the ranks' flight recorders are to be dumped now, ahead of a verdict: some rank
    /// has been silent for half the timeout in force, and no dump was taken since its last
    /// beacon. In a generation of several nodes the first node to judge the hang stops its
    /// ranks, which breaks the collective the other nodes' ranks wait in before those nodes
    /// judge it too; the snapshot keeps what their ranks waited for ([`Beacons::snapshot_held`]).
    pub fn snapshot_due(&self, now: Instant, t: Timeout) -> bool {
        let (Some(timeout), Some(since)) = (self.timeout(t), self.silent_since()) else {
            return false;
        };
        now.saturating_duration_since(since) >= timeout / 2
            && self.snapshot.is_none_or(|taken| taken < since)
    }

    /// The oldest of the ranks' last beacons: when the longest silence began.
    fn silent_since(&self) -> Option<Instant> {
        self.last.values().map(|&(_, at)| at).min()
    }

    /// The snapshot was asked for at `now`.
    pub fn snapshot_taken(&mut self, now: Instant) {
        self.snapshot = Some(now);
    }

    /// Whether a snapshot was taken in the silence that goes on: the rank silent longest has
    /// sent no beacon since.
    pub fn snapshot_held(&self) -> bool {
        self.snapshot
            .zip(self.silent_since())
            .is_some_and(|(taken, since)| taken > since)
    }

    /// The hang, if a rank sent no beacon for the timeout `t` (see [`Beacons::timeout`]).
    pub fn judge(&self, now: Instant, t: Timeout) -> Option<Hang> {
        self.decide(now, self.timeout(t)?)
    }

    /// The hang, if a rank sent no beacon for `timeout`. Once one has, every rank silent for
    /// half the timeout is counted stuck with it: ranks blocked in the collective the first
    /// one left stop at about the same moment, and their stacks tell the story too. The stuck
    /// are listed silent longest first.
    pub fn decide(&self, now: Instant, timeout: Duration) -> Option<Hang> {
        let mut hang = Hang {
            stuck: Vec::new(),
            progressing: Vec::new(),
        };
        let silent = |at: Instant| now.saturating_duration_since(at);
        if !self.last.values().any(|&(_, at)| silent(at) >= timeout) {
            return None;
        }
        for (&rank, &(step, at)) in &self.last {
            let silent = silent(at);
            if silent >= timeout / 2 {
                hang.stuck.push((rank, step, silent));
            } else {
                hang.progressing.push((rank, step));
            }
        }
        // The rank silent longest first: the one the others wait for, most likely.
        hang.stuck.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        Some(hang)
    }
}

impl Hang {
    /// The stuck ranks.
    pub fn ranks(&self) -> Vec<u32> {
        self.stuck.iter().map(|s| s.0).collect()
    }

    /// One line: "rank 1 on node n1 made no progress for 5.0 s (last step 37); ranks 0, 2
    /// were at steps 52, 52".
    pub fn line(&self, node: &str) -> String {
        let stuck: Vec<String> = self
            .stuck
            .iter()
            .map(|(r, step, silent)| {
                format!(
                    "rank {r} on node {node} made no progress for {:.1} s (last step {step})",
                    silent.as_secs_f64()
                )
            })
            .collect();
        let mut line = format!("hang: {}", stuck.join("; "));
        if !self.progressing.is_empty() {
            let join = |v: Vec<String>| v.join(", ");
            let (ranks, steps): (Vec<String>, Vec<String>) = self
                .progressing
                .iter()
                .map(|(r, s)| (r.to_string(), s.to_string()))
                .unzip();
            let (rk, wr) = if ranks.len() == 1 {
                ("rank", "was at step")
            } else {
                ("ranks", "were at steps")
            };
            line.push_str(&format!("; {rk} {} {wr} {}", join(ranks), join(steps)));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn auto_waits_for_ten_steps_then_takes_ten_median_steps_with_a_60_s_floor() {
        let t0 = Instant::now();
        let mut b = Beacons::default();
        for i in 0..9u64 {
            b.beacon(0, i, t0 + s(10.0 * i as f64));
        }
        assert_eq!(b.timeout(Timeout::Auto), None);
        assert_eq!(b.judge(t0 + s(3600.0), Timeout::Auto), None);
        b.beacon(0, 9, t0 + s(90.0));
        assert_eq!(b.timeout(Timeout::Auto), Some(s(100.0)));
        assert!(b.judge(t0 + s(189.0), Timeout::Auto).is_none());
        assert_eq!(
            b.judge(t0 + s(190.0), Timeout::Auto).unwrap().ranks(),
            vec![0]
        );
        // Fast steps: the floor.
        let mut fast = Beacons::default();
        for i in 0..20u64 {
            fast.beacon(0, i, t0 + s(0.1 * i as f64));
        }
        assert_eq!(fast.timeout(Timeout::Auto), Some(AUTO_FLOOR));
        assert_eq!(fast.timeout(Timeout::Fixed(s(5.0))), Some(s(5.0)));
    }

    #[test]
    fn no_beacons_are_never_a_hang() {
        let t0 = Instant::now();
        assert_eq!(Beacons::default().decide(t0 + s(3600.0), s(5.0)), None);
    }

    #[test]
    fn a_rank_silent_for_the_timeout_is_stuck_while_the_others_progress() {
        let t0 = Instant::now();
        let mut b = Beacons::default();
        for i in 0..100u64 {
            let at = t0 + s(0.05 * i as f64);
            b.beacon(0, i, at);
            if i <= 37 {
                b.beacon(1, i, at);
            }
        }
        let last0 = t0 + s(0.05 * 99.0);
        assert_eq!(b.decide(last0, s(5.0)), None);
        let now = t0 + s(0.05 * 37.0) + s(5.0);
        b.beacon(0, 140, now);
        let hang = b.decide(now, s(5.0)).expect("rank 1 is silent for 5 s");
        assert_eq!(hang.ranks(), vec![1]);
        assert_eq!(hang.stuck[0].1, 37);
        assert_eq!(hang.progressing, vec![(0, 140)]);
        assert_eq!(
            hang.line("n1"),
            "hang: rank 1 on node n1 made no progress for 5.0 s (last step 37); rank 0 was at step 140"
        );
    }

    #[test]
    fn the_whole_job_silent_is_a_hang_of_every_rank() {
        let t0 = Instant::now();
        let mut b = Beacons::default();
        b.beacon(0, 3, t0);
        b.beacon(1, 4, t0 + s(3.0));
        assert_eq!(b.decide(t0 + s(4.9), s(5.0)), None);
        // Rank 1, silent for 2.0 s of 5, still counts as progressing.
        assert_eq!(b.decide(t0 + s(5.0), s(5.0)).unwrap().ranks(), vec![0]);
        // Silent for half the timeout when rank 0 is judged: stuck with it.
        let all = b.decide(t0 + s(5.5), s(5.0)).unwrap();
        assert_eq!(all.ranks(), vec![0, 1]);
        assert!(all.progressing.is_empty());
        assert!(!all.line("n").contains("were at"));
    }

    #[test]
    fn the_rank_silent_longest_is_named_first() {
        let t0 = Instant::now();
        let mut b = Beacons::default();
        b.beacon(0, 40, t0 + s(1.0));
        b.beacon(1, 19, t0);
        let hang = b.decide(t0 + s(5.0), s(4.0)).unwrap();
        assert_eq!(hang.ranks(), vec![1, 0]);
        assert!(hang.line("n").starts_with("hang: rank 1 on node n"));
        // Forgotten (its worker exited 0): only rank 1 is judged.
        b.forget(0);
        assert_eq!(b.decide(t0 + s(5.0), s(4.0)).unwrap().ranks(), vec![1]);
    }

    #[test]
    fn the_flight_recorders_are_dumped_once_at_half_the_timeout_of_a_silence() {
        let t0 = Instant::now();
        let t = Timeout::Fixed(s(4.0));
        let mut b = Beacons::default();
        assert!(
            !b.snapshot_due(t0 + s(60.0), t),
            "no beacons: nothing to judge"
        );
        b.beacon(0, 19, t0);
        b.beacon(1, 19, t0 + s(0.1));
        assert!(!b.snapshot_due(t0 + s(1.9), t));
        assert!(
            b.snapshot_due(t0 + s(2.0), t),
            "rank 0 silent for half the timeout"
        );
        assert!(!b.snapshot_held());
        b.snapshot_taken(t0 + s(2.0));
        assert!(b.snapshot_held());
        // Once per silence, though rank 1 goes on sending beacons.
        b.beacon(1, 20, t0 + s(2.5));
        assert!(!b.snapshot_due(t0 + s(3.0), t));
        assert!(b.snapshot_held(), "rank 0 is still silent");
        // Rank 0 moves on: the snapshot is of a silence that ended; a new one gets its own.
        b.beacon(0, 20, t0 + s(3.0));
        assert!(!b.snapshot_held());
        assert!(!b.snapshot_due(t0 + s(4.0), t));
        assert!(b.snapshot_due(t0 + s(4.5), t), "rank 1 silent since 2.5 s");
        // `auto` before it has a timeout: no snapshot either.
        let mut a = Beacons::default();
        a.beacon(0, 1, t0);
        assert!(!a.snapshot_due(t0 + s(3600.0), Timeout::Auto));
    }
}
