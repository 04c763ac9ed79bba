//! How the persister thread paces itself: the [`Throttle`] the agent shares with it (a byte
//! rate, and full speed on demand) and the [`Pacer`], the I/O side of [`super::super::pace`]:
//! it measures the thread's CPU and the node's idle time, sleeps the pause a decision asks, and
//! switches the thread's I/O class while it yields.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::pace::{judge, pace, pause, CpuWindow, NodeCpu, Pace, PaceInput, PaceParams};
use crate::os::background::{self, IoClass};

/// Longest sleep of the throttle between two looks at its rate, which the agent may change
/// while a file is being written ([`Throttle::set_rate`]).
const RECHECK: Duration = Duration::from_millis(50);

/// Bytes of work between two looks at the CPU throttle ([`Pacer::after_slice`]): while it
/// yields, the persister works in bursts of this much (about 25 ms of CPU with BLAKE3 digests)
/// and then pauses as long as its share asks (about 1.7 s at 1.5 % of one CPU), not a pause
/// after each slice. Each
/// time it takes a CPU from a rank, the ranks that step together with that one wait too: with
/// 2 ranks stepping together (an all-reduce a step) on 2 busy cores and a share of 5 %, the
/// steps while it persisted ran 15.5 % slower with a pause after each 4 MiB slice, 8.5-9.2 %
/// with one after each 64 MiB (8.1 % after 256 MiB), for the same CPU time and lag: the
/// training time lost per save of 2 GiB fell from 5.0 to 2.9 s a rank
/// (`cargo bench --bench ckpt`). A step smaller than this is written in one burst (its pacer
/// is the step's own); steps saved faster than the share can write them make the persister go
/// at full speed anyway (a newer step waits).
pub(super) const LOOK_EVERY: u64 = 64 << 20;

/// The window over which the persister judges whether the node has a CPU to spare
/// ([`super::super::pace::judge`]; `/proc/stat` counts in ticks of 10 ms), and the pause it
/// makes to judge again while at full speed.
const CPU_WINDOW: Duration = Duration::from_millis(250);

/// How long quiet windows must find a CPU spare, in a row, before the persister goes at full
/// speed: the ranks of a step leave a core idle for a moment after a save (one waits in the
/// step's collective for the other), and full speed there slowed the steps after a
/// `dcp.save` 1.5 to 6.8 times for up to 1.6 s (measured with a 250 ms window and no
/// confirmation). A second's delay where a CPU is truly spare costs a lag of tens of seconds
/// little.
const SPARE_CONFIRM: Duration = Duration::from_secs(1);

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
    /// What the windows so far say of the node's CPUs.
    node: NodeCpu,
    /// Since when the persister yields, with its CPU time then.
    yielding: Option<(Instant, Duration)>,
    /// The last decision, to log (and set the I/O class) only on a change.
    last: Option<Pace>,
    /// Bytes of work since the last look at the CPU throttle.
    unlooked: u64,
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
            node: NodeCpu::Busy,
            yielding: Some((Instant::now(), background::thread_cpu())),
            last: None,
            unlooked: 0,
        }
    }

    /// After a slice of `bytes`: pauses as the byte rate says (`written` bytes since `began`)
    /// and, once [`LOOK_EVERY`] bytes of work were done since its last look, as the CPU
    /// throttle says, looking again at least every [`RECHECK`] of a longer pause; returns once
    /// the pause is slept. The work of the slices between two looks counts in the second's
    /// pause: the share is reckoned on CPU time, however often the persister looks.
    pub(super) fn after_slice(
        &mut self,
        bytes: usize,
        throttle: &Throttle,
        written: Option<(u64, Instant)>,
    ) {
        self.unlooked += bytes as u64;
        let look = self.unlooked >= LOOK_EVERY;
        if look {
            self.unlooked = 0;
        }
        loop {
            if throttle.stopped() {
                return;
            }
            let by_rate = written.map_or(Duration::ZERO, |(n, began)| {
                pause(n, began.elapsed(), throttle.rate())
            });
            let (wait, probe) = if look {
                let decision = self.look(throttle);
                (decision.pause().max(by_rate), decision.probes())
            } else {
                (by_rate, false)
            };
            if wait.is_zero() {
                return;
            }
            std::thread::sleep(wait.min(RECHECK));
            // A whole pause slept: back to work. The CPU of this look and any oversleep count
            // in the next burst's (the share is reckoned from when yielding began); looking
            // again would ask a pause for this look's own CPU, then for that look's, and so on:
            // a thread that spent its share on thousands of tiny sleeps a second (measured:
            // 1,000 a second, the persister's CPU per GiB tripled, the lag bound reached).
            // A probe's pause ends with a look: its window is judged before any more work.
            if wait <= RECHECK && !probe {
                return;
            }
        }
    }

    /// One look at the CPU throttle: the node's idle time once a [`CPU_WINDOW`] (the window
    /// judged), this thread's CPU time, the decision (noted).
    fn look(&mut self, throttle: &Throttle) -> Pace {
        let now = Instant::now();
        let mine = background::thread_cpu();
        let (w_at, w_idle, w_mine) = self.window;
        if now.saturating_duration_since(w_at) >= CPU_WINDOW {
            let idle = background::node_idle();
            let node = match (w_idle, idle) {
                (Some(a), Some(b)) => {
                    let w = CpuWindow {
                        start: w_at,
                        end: now,
                        idle: b.saturating_sub(a),
                        mine: mine.saturating_sub(w_mine),
                    };
                    let node = judge(self.node, &w, SPARE_CONFIRM);
                    if std::mem::discriminant(&node) != std::mem::discriminant(&self.node) {
                        tracing::debug!(
                            from = ?self.node,
                            to = ?node,
                            window_ms = w.end.saturating_duration_since(w.start).as_millis() as u64,
                            idle_ms = w.idle.as_millis() as u64,
                            mine_ms = w.mine.as_millis() as u64,
                            "checkpoint persister: the node's CPUs"
                        );
                    }
                    node
                }
                _ => NodeCpu::Busy,
            };
            self.node = node;
            self.window = (now, idle, mine);
        }
        let (since, cpu_then) = *self.yielding.get_or_insert((now, mine));
        let decision = pace(
            &PaceInput {
                urgent: throttle.urgent(),
                lag: now.saturating_duration_since(self.staged_at),
                node: self.node,
                window_left: CPU_WINDOW
                    .saturating_sub(now.saturating_duration_since(self.window.0)),
                cpu: mine.saturating_sub(cpu_then),
                elapsed: now.saturating_duration_since(since),
            },
            &self.params,
        );
        self.note(decision);
        if !decision.yields() {
            self.yielding = None;
        }
        decision
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
        p.after_slice(LOOK_EVERY as usize, &Throttle::new(0), None);
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
        p.after_slice(LOOK_EVERY as usize, &urgent, None);
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    }

    #[test]
    fn the_persister_pauses_after_a_burst_of_slices_not_after_each() {
        let params = PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        };
        let slice = (LOOK_EVERY / 4) as usize;
        let began = Instant::now();
        let mut p = Pacer::new(params, Instant::now());
        let from = background::thread_cpu();
        while background::thread_cpu() - from < Duration::from_millis(5) {
            std::hint::black_box(0u64);
        }
        // Three slices short of LOOK_EVERY: no look, no pause, though 5 ms of CPU ask 100 ms.
        for _ in 0..3 {
            p.after_slice(slice, &Throttle::new(0), None);
        }
        assert!(
            began.elapsed() < Duration::from_millis(60),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(p.last, None, "no decision taken yet");
        // The fourth completes the burst: the pause the work of all four asks.
        p.after_slice(slice, &Throttle::new(0), None);
        assert!(
            began.elapsed() >= Duration::from_millis(95),
            "{:?}",
            began.elapsed()
        );
        assert!(p.last.is_some_and(|d| d.yields()));
        // Between looks, the byte rate still holds: 1 MiB at 8 MiB/s is due after 125 ms.
        let t = Instant::now();
        p.after_slice(1 << 20, &Throttle::new(8 << 20), Some((1 << 20, t)));
        assert!(
            t.elapsed() >= Duration::from_millis(120),
            "{:?}",
            t.elapsed()
        );
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
        let created = Instant::now();
        let mut p = Pacer::new(params, created);
        let from = background::thread_cpu();
        while background::thread_cpu() - from < Duration::from_millis(8) {
            std::hint::black_box(0u64);
        }
        // 8 ms of CPU at 5 %: due 160 ms after the pacer began yielding (the wall time the 8 ms
        // took included, however busy the machine), at most 50 ms a sleep (RECHECK).
        let (before, began) = (switches(), Instant::now());
        p.after_slice(LOOK_EVERY as usize, &Throttle::new(0), None);
        let (slept, took) = (switches() - before, began.elapsed());
        assert!(
            created.elapsed() >= Duration::from_millis(159),
            "{:?} since it began yielding",
            created.elapsed()
        );
        assert!(
            slept <= 8,
            "{slept} sleeps in {took:?}: each look's own CPU asked for another pause"
        );
    }

    #[test]
    fn a_probing_persister_pauses_the_whole_window_and_judges_it_before_more_work() {
        let params = PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        };
        let mut p = Pacer::new(params, Instant::now());
        // As after a window at full speed that left less than a CPU idle beside it.
        p.node = NodeCpu::Probing;
        let began = Instant::now();
        p.window = (began, background::node_idle(), background::thread_cpu());
        p.after_slice(LOOK_EVERY as usize, &Throttle::new(0), None);
        // The pause is longer than one sleep (RECHECK): it still returns only once the
        // window is over and judged, whatever it found.
        assert!(began.elapsed() >= CPU_WINDOW, "{:?}", began.elapsed());
        assert_ne!(p.node, NodeCpu::Probing, "the probe's window was judged");
        assert!(p.window.0 >= began + CPU_WINDOW, "a new window began");
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
