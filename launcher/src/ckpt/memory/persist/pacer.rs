//! How the persister thread paces itself: the [`Throttle`] the agent shares with it (a byte
//! rate, and full speed on demand) and the [`Pacer`], the I/O side of [`super::super::pace`]:
//! it measures the thread's CPU and the node's idle time, sleeps the pause a decision asks, and
//! switches the thread's I/O class while it yields.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::pace::{pace, pause, spare_cpu, Pace, PaceInput, PaceParams};
use crate::os::background::{self, IoClass};

/// Longest sleep of the throttle between two looks at its rate, which the agent may change
/// while a file is being written ([`Throttle::set_rate`]).
const RECHECK: Duration = Duration::from_millis(50);

/// The window over which the persister judges whether the node has a CPU to spare
/// ([`super::pace::spare_cpu`]; `/proc/stat` counts in ticks of 10 ms).
const CPU_WINDOW: Duration = Duration::from_millis(250);

/// The persister's throttle, shared with the agent: a byte rate (0: no limit) and whether the
/// agent asks for full speed (the run's end, a step waiting behind); both can change while a
/// step is being written, and the write follows within [`RECHECK`].
#[derive(Debug, Clone, Default)]
pub struct Throttle {
    rate: Arc<AtomicU64>,
    urgent: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
}

impl Throttle {
    /// A throttle of `bytes_per_s` (0: no limit).
    pub fn new(bytes_per_s: u64) -> Self {
        Self {
            rate: Arc::new(AtomicU64::new(bytes_per_s)),
            urgent: Arc::default(),
            stopped: Arc::default(),
        }
    }

    /// The agent exits: the file being written is given up (its temporary file removed)
    /// within [`RECHECK`] and a slice, and nothing more is written.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub fn set_rate(&self, bytes_per_s: u64) {
        self.rate.store(bytes_per_s, Ordering::Relaxed);
    }

    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Full speed (`true`) or yielding the CPU to the training while it is busy.
    pub fn set_urgent(&self, urgent: bool) {
        self.urgent.store(urgent, Ordering::Relaxed);
    }

    pub fn urgent(&self) -> bool {
        self.urgent.load(Ordering::Relaxed)
    }
}

/// The persister thread's side of [`pace`]: it measures its own CPU time and the node's idle
/// time, pauses as the decision says, and switches its I/O class to idle while it yields.
pub struct Pacer {
    params: PaceParams,
    staged_at: Instant,
    /// The current window's start: when, the node's idle time and this thread's CPU time then.
    window: (Instant, Option<Duration>, Duration),
    /// Whether the last window had a CPU to spare.
    spare: bool,
    /// Since when the persister yields, with its CPU time then.
    yielding: Option<(Instant, Duration)>,
    /// The last decision, to log (and set the I/O class) only on a change.
    last: Option<Pace>,
}

impl Pacer {
    /// A pacer for a step staged at `staged_at`.
    pub fn new(params: PaceParams, staged_at: Instant) -> Self {
        Self {
            params,
            staged_at,
            window: (
                Instant::now(),
                background::node_idle(),
                background::thread_cpu(),
            ),
            spare: false,
            yielding: Some((Instant::now(), background::thread_cpu())),
            last: None,
        }
    }

    /// Pauses after a slice of work as the CPU throttle and the byte rate say (`written` bytes
    /// since `began`), looking again at least every [`RECHECK`] of a longer pause, and returns
    /// once the pause is slept.
    pub(super) fn after_slice(&mut self, throttle: &Throttle, written: Option<(u64, Instant)>) {
        loop {
            if throttle.stopped() {
                return;
            }
            let now = Instant::now();
            let mine = background::thread_cpu();
            let (w_at, w_idle, w_mine) = self.window;
            if now.saturating_duration_since(w_at) >= CPU_WINDOW {
                let idle = background::node_idle();
                self.spare = match (w_idle, idle) {
                    (Some(a), Some(b)) => spare_cpu(
                        now.saturating_duration_since(w_at),
                        b.saturating_sub(a),
                        mine.saturating_sub(w_mine),
                    ),
                    _ => false,
                };
                self.window = (now, idle, mine);
            }
            let (since, cpu_then) = *self.yielding.get_or_insert((now, mine));
            let decision = pace(
                &PaceInput {
                    urgent: throttle.urgent(),
                    lag: now.saturating_duration_since(self.staged_at),
                    spare: self.spare,
                    cpu: mine.saturating_sub(cpu_then),
                    elapsed: now.saturating_duration_since(since),
                },
                &self.params,
            );
            self.note(decision);
            if !decision.yields() {
                self.yielding = None;
            }
            let wait = decision
                .pause()
                .max(written.map_or(Duration::ZERO, |(n, began)| {
                    pause(n, began.elapsed(), throttle.rate())
                }));
            if wait.is_zero() {
                return;
            }
            std::thread::sleep(wait.min(RECHECK));
            // A whole pause slept: back to work. The CPU of this look and any oversleep count
            // in the next slice's (the share is reckoned from when yielding began); looking
            // again would ask a pause for this look's own CPU, then for that look's, and so on:
            // a thread that spent its share on thousands of tiny sleeps a second (measured:
            // 1,000 a second, the persister's CPU per GiB tripled, the lag bound reached).
            if wait <= RECHECK {
                return;
            }
        }
    }

    /// Logs a change of the decision and follows it with the thread's I/O class.
    fn note(&mut self, decision: Pace) {
        let changed = self
            .last
            .is_none_or(|l| l.yields() != decision.yields() || (!l.yields() && l != decision));
        if changed {
            tracing::debug!(reason = decision.reason(), "checkpoint persister");
            if self.last.is_none_or(|l| l.yields() != decision.yields()) {
                let class = if decision.yields() {
                    IoClass::Idle
                } else {
                    IoClass::Default
                };
                let _ = background::set_io_class(class);
            }
        }
        self.last = Some(decision);
    }

    /// The step is done: the thread's I/O class back to the default.
    pub(super) fn finish(&mut self) {
        if self.last.is_some_and(|l| l.yields()) {
            let _ = background::set_io_class(IoClass::Default);
        }
        self.last = None;
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A pacer that never yields (its lag bound is zero).
    pub(in super::super) fn full() -> Pacer {
        Pacer::new(
            PaceParams {
                share: 0.05,
                lag_bound: Duration::ZERO,
            },
            Instant::now(),
        )
    }

    #[test]
    fn a_slice_of_work_is_followed_by_the_pause_its_cpu_share_asks() {
        let params = PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        };
        let burn = |cpu: Duration| {
            let from = background::thread_cpu();
            let mut x = 1u64;
            while background::thread_cpu() - from < cpu {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        };
        // 5 ms of CPU at 5 % of one CPU: 100 ms from the start (the first window of 250 ms
        // counts as busy).
        let began = Instant::now();
        let mut p = Pacer::new(params, Instant::now());
        burn(Duration::from_millis(5));
        p.after_slice(&Throttle::new(0), None);
        assert!(
            began.elapsed() >= Duration::from_millis(95),
            "{:?}",
            began.elapsed()
        );
        // Asked for full speed, it does not pause.
        let urgent = Throttle::new(0);
        urgent.set_urgent(true);
        let mut p = Pacer::new(params, Instant::now());
        burn(Duration::from_millis(5));
        let t = Instant::now();
        p.after_slice(&urgent, None);
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    }

    /// The voluntary context switches of the calling thread so far.
    fn switches() -> u64 {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    }

    #[test]
    fn a_paused_persister_sleeps_its_pause_in_few_sleeps_not_in_thousands() {
        let params = PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        };
        let mut p = Pacer::new(params, Instant::now());
        let from = background::thread_cpu();
        while background::thread_cpu() - from < Duration::from_millis(8) {
            std::hint::black_box(0u64);
        }
        // 8 ms of CPU at 5 %: about 160 ms of pause, at most 50 ms a sleep (RECHECK).
        let (before, began) = (switches(), Instant::now());
        p.after_slice(&Throttle::new(0), None);
        let (slept, took) = (switches() - before, began.elapsed());
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(
            slept <= 8,
            "{slept} sleeps in {took:?}: each look's own CPU asked for another pause"
        );
    }

    #[test]
    fn a_yielding_persister_thread_is_in_the_idle_io_class() {
        let (tx, rx) = std::sync::mpsc::channel();
        // Some(decision): the pacer notes it; None: the step is done.
        let (go, wait) = std::sync::mpsc::channel::<Option<Pace>>();
        let t = std::thread::spawn(move || {
            let mut p = full();
            tx.send(background::thread_id()).unwrap();
            while let Ok(decision) = wait.recv() {
                match decision {
                    Some(d) => p.note(d),
                    None => p.finish(),
                }
                tx.send(0).unwrap();
            }
        });
        let tid = rx.recv().unwrap();
        let ask = |d: Option<Pace>| {
            go.send(d).unwrap();
            rx.recv().unwrap();
            background::io_class(tid).unwrap()
        };
        let yielding = Some(Pace::Yield {
            pause: Duration::ZERO,
        });
        match ask(yielding) {
            IoClass::Idle => {}
            other if std::env::var_os("DRUN_REQUIRE_IOPRIO").is_none() => {
                eprintln!("skipped: the kernel did not take the idle I/O class ({other:?}); DRUN_REQUIRE_IOPRIO=1 requires it");
                return;
            }
            other => panic!("the yielding persister is not in the idle I/O class: {other:?}"),
        }
        assert_ne!(
            background::io_class(background::thread_id()).unwrap(),
            IoClass::Idle,
            "only the persister's thread"
        );
        assert_ne!(ask(Some(Pace::Urgent)), IoClass::Idle, "full speed");
        assert_eq!(ask(yielding), IoClass::Idle);
        assert_ne!(ask(None), IoClass::Idle, "the step is done");
        drop(go);
        t.join().unwrap();
    }
}
