//! How the persister shares the node with the training: a byte-rate throttle ([`pause`]) and
//! the CPU ([`pace`]): while the CPUs it may run on are busy it keeps to a share of one CPU,
//! at full speed when the agent asks, past a lag bound, or while a CPU is spare ([`judge`],
//! over windows of the node's idle time). Pure decisions; the persister ([`super::persist`])
//! measures and sleeps.

use std::time::{Duration, Instant};

/// The throttle: how long to pause after `written` bytes in `elapsed` so the copy runs at no
/// more than `rate` bytes per second (`0`: no limit).
pub fn pause(written: u64, elapsed: Duration, rate: u64) -> Duration {
    if rate == 0 {
        return Duration::ZERO;
    }
    let due = Duration::from_secs_f64(written as f64 / rate as f64);
    due.saturating_sub(elapsed)
}

/// How the persister shares the node's CPUs with the training ([`pace`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceParams {
    /// The share of one CPU the persister keeps to while the node's CPUs are busy (0.05: at
    /// most 50 ms of CPU time per second).
    pub share: f64,
    /// Past this lag (the step being written staged this long ago) it goes at full speed: the
    /// training's slowdown is bounded, and so is the disk's delay.
    pub lag_bound: Duration,
}

/// What the persister sees when it decides whether to yield the CPU ([`pace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceInput {
    /// The agent asks for full speed: the workers' end waits for the disk (no training left
    /// to protect), or a newer step is staged behind this one (the disk falls behind the
    /// saves).
    pub urgent: bool,
    /// How long ago the step being written was staged.
    pub lag: Duration,
    /// What the windows so far say of the node's CPUs ([`judge`]).
    pub node: NodeCpu,
    /// What is left of the current window (how long a [`NodeCpu::Probing`] pause lasts).
    pub window_left: Duration,
    /// The persister's CPU time since it began yielding, and the wall time since then.
    pub cpu: Duration,
    /// Wall time since it began yielding.
    pub elapsed: Duration,
}

/// Why the persister goes at full speed, or how long it yields ([`pace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// The agent asked for it ([`PaceInput::urgent`]).
    Urgent,
    /// The step waited past [`PaceParams::lag_bound`].
    LagBound,
    /// The node has a CPU the training does not use: the persister takes nothing from it.
    SpareCpu,
    /// It went at full speed on a spare CPU, and the last window left less than a CPU idle
    /// beside it: it pauses this long, for one window, to see whether the CPU is still spare
    /// ([`NodeCpu::Probing`]).
    Probe {
        /// The pause: the rest of the window.
        pause: Duration,
    },
    /// The node's CPUs are busy: the persister keeps to its share of one CPU, pausing this
    /// long first (zero: it is within its share).
    Yield {
        /// The pause.
        pause: Duration,
    },
}

impl Pace {
    /// Whether the persister yields the CPU (and the disk: it asks for the idle I/O class).
    pub fn yields(&self) -> bool {
        matches!(self, Pace::Yield { .. } | Pace::Probe { .. })
    }

    /// Whether it pauses only to measure: the whole pause is slept before it works again.
    pub fn probes(&self) -> bool {
        matches!(self, Pace::Probe { .. })
    }

    /// The pause before the next slice of work (zero at full speed).
    pub fn pause(&self) -> Duration {
        match self {
            Pace::Yield { pause } | Pace::Probe { pause } => *pause,
            _ => Duration::ZERO,
        }
    }

    /// Why, in a few words (for the persister's log).
    pub fn reason(&self) -> &'static str {
        match self {
            Pace::Urgent => "full speed: the run's end or a newer step waits for the disk",
            Pace::LagBound => "full speed: the step waited past the persistence lag bound",
            Pace::SpareCpu => "full speed: the node has a CPU to spare",
            Pace::Probe { .. } => "pausing a window: is the node's CPU still spare?",
            Pace::Yield { .. } => "yielding: the node's CPUs are busy with the training",
        }
    }
}

/// The persister's CPU throttle: full speed when the agent asks for it, past the lag bound, or
/// while the node has a CPU to spare (a pause of the rest of the window while it measures
/// again whether it has); else it pauses so that its CPU time since it began yielding stays
/// within `share` of one CPU over the wall time since then.
pub fn pace(i: &PaceInput, p: &PaceParams) -> Pace {
    if i.urgent {
        return Pace::Urgent;
    }
    if i.lag >= p.lag_bound {
        return Pace::LagBound;
    }
    match i.node {
        NodeCpu::Spare => return Pace::SpareCpu,
        NodeCpu::Probing => {
            return Pace::Probe {
                pause: i.window_left,
            }
        }
        NodeCpu::Busy | NodeCpu::Seen { .. } => {}
    }
    if p.share <= 0.0 || !p.share.is_finite() {
        return Pace::Yield {
            pause: Duration::ZERO,
        };
    }
    let due = Duration::from_secs_f64(i.cpu.as_secs_f64() / p.share.min(1.0));
    Pace::Yield {
        pause: due.saturating_sub(i.elapsed),
    }
}

/// Whether the node had a CPU to spare over a `window` of wall time in which its CPUs were idle
/// for `idle` in all (summed over CPUs) and the persister ran for `mine`: what the persister
/// took counts as spare, so it is spare when the rest of the node left at least nine tenths of
/// one CPU unused.
pub fn spare_cpu(window: Duration, idle: Duration, mine: Duration) -> bool {
    !window.is_zero() && (idle + mine).as_secs_f64() >= 0.9 * window.as_secs_f64()
}

/// What the persister knows of the node's CPUs, from windows of their idle time ([`judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCpu {
    /// The training keeps the CPUs busy, or nothing is known yet: the persister yields.
    Busy,
    /// Quiet windows (the persister paused through them) have each left a CPU spare since
    /// `since`, not yet for long enough to go at full speed: the ranks of a step leave a core
    /// idle for a moment after a save, one waiting in the step's collective for the other.
    Seen {
        /// When the first of those windows began.
        since: Instant,
    },
    /// A CPU is spare: the persister goes at full speed.
    Spare,
    /// A window at full speed left less than a CPU idle beside the persister: it pauses for a
    /// window to see whether the CPU is still spare without it. While it runs, its own CPU and
    /// the waits it causes (ranks that step together wait for the one it slows) would look
    /// like a spare CPU, and full speed would hold itself.
    Probing,
}

/// One window of the node's CPU time, as the persister measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuWindow {
    /// When it began and ended.
    pub start: Instant,
    pub end: Instant,
    /// The idle time of the CPUs the persister may run on, summed over them.
    pub idle: Duration,
    /// The persister's own CPU time in it.
    pub mine: Duration,
}

impl CpuWindow {
    fn len(&self) -> Duration {
        self.end.saturating_duration_since(self.start)
    }

    /// Whether the persister paused through it (ran for at most a tenth of it): only such a
    /// window says what the training leaves idle.
    fn quiet(&self) -> bool {
        self.mine <= self.len() / 10
    }
}

/// The next [`NodeCpu`] after window `w`: a CPU is spare once quiet windows have found one
/// spare ([`spare_cpu`]) for `confirm` in a row; at full speed it stays spare while a window
/// leaves most of a CPU idle beside the persister, else the persister pauses a window
/// ([`NodeCpu::Probing`]) and that quiet window decides.
pub fn judge(node: NodeCpu, w: &CpuWindow, confirm: Duration) -> NodeCpu {
    let len = w.len();
    if len.is_zero() {
        return node;
    }
    let spare_without_me = w.quiet() && spare_cpu(len, w.idle, w.mine);
    match node {
        NodeCpu::Busy | NodeCpu::Seen { .. } if spare_without_me => {
            let since = match node {
                NodeCpu::Seen { since } => since,
                _ => w.start,
            };
            if w.end.saturating_duration_since(since) >= confirm {
                NodeCpu::Spare
            } else {
                NodeCpu::Seen { since }
            }
        }
        NodeCpu::Busy | NodeCpu::Seen { .. } => NodeCpu::Busy,
        NodeCpu::Spare if spare_cpu(len, w.idle, Duration::ZERO) => NodeCpu::Spare,
        NodeCpu::Spare => NodeCpu::Probing,
        NodeCpu::Probing if spare_without_me => NodeCpu::Spare,
        NodeCpu::Probing => NodeCpu::Busy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn input(cpu_ms: u64, elapsed_ms: u64) -> PaceInput {
        PaceInput {
            urgent: false,
            lag: Duration::from_secs(1),
            node: NodeCpu::Busy,
            window_left: Duration::ZERO,
            cpu: Duration::from_millis(cpu_ms),
            elapsed: Duration::from_millis(elapsed_ms),
        }
    }

    const PARAMS: PaceParams = PaceParams {
        share: 0.05,
        lag_bound: Duration::from_secs(60),
    };

    #[test]
    fn on_busy_cpus_the_persister_keeps_to_its_share_of_one() {
        let ms = Duration::from_millis;
        // 10 ms of CPU at 5 % is due after 200 ms: 150 ms to go after 50 ms.
        assert_eq!(
            pace(&input(10, 50), &PARAMS),
            Pace::Yield { pause: ms(150) }
        );
        assert_eq!(pace(&input(10, 50), &PARAMS).pause(), ms(150));
        assert!(pace(&input(10, 50), &PARAMS).yields());
        // Within its share: no pause, but still yielding (idle I/O class).
        let within = pace(&input(10, 400), &PARAMS);
        assert_eq!(within, Pace::Yield { pause: ms(0) });
        assert!(within.yields());
        // A share of more than one CPU is one CPU; none at all is no pause.
        let whole = PaceParams {
            share: 3.0,
            ..PARAMS
        };
        assert_eq!(pace(&input(100, 40), &whole).pause(), ms(60));
        let none = PaceParams {
            share: 0.0,
            ..PARAMS
        };
        assert_eq!(pace(&input(100, 40), &none).pause(), ms(0));
    }

    #[test]
    fn the_persister_goes_full_speed_at_the_end_past_the_lag_bound_or_on_a_spare_cpu() {
        let busy = input(1_000, 100);
        let urgent = PaceInput {
            urgent: true,
            ..busy
        };
        assert_eq!(pace(&urgent, &PARAMS), Pace::Urgent);
        let late = PaceInput {
            lag: PARAMS.lag_bound,
            ..busy
        };
        assert_eq!(pace(&late, &PARAMS), Pace::LagBound);
        let spare = PaceInput {
            node: NodeCpu::Spare,
            ..busy
        };
        assert_eq!(pace(&spare, &PARAMS), Pace::SpareCpu);
        let seen = PaceInput {
            node: NodeCpu::Seen {
                since: Instant::now(),
            },
            ..busy
        };
        assert!(pace(&seen, &PARAMS).yields(), "not yet confirmed");
        for p in [Pace::Urgent, Pace::LagBound, Pace::SpareCpu] {
            assert!(!p.yields() && p.pause().is_zero(), "{p:?}");
            assert!(p.reason().starts_with("full speed"), "{p:?}");
        }
        assert!(pace(&busy, &PARAMS).reason().starts_with("yielding"));
    }

    #[test]
    fn a_cpu_is_spare_when_the_rest_of_the_node_leaves_most_of_one_unused() {
        let ms = Duration::from_millis;
        // 2 CPUs, 200 ms: the training keeps both busy while the persister got 60 ms.
        assert!(!spare_cpu(ms(200), ms(0), ms(60)));
        // One rank on one CPU, the persister alone on the other.
        assert!(spare_cpu(ms(200), ms(5), ms(190)));
        // The persister paused and the other CPU idled.
        assert!(spare_cpu(ms(200), ms(200), ms(0)));
        assert!(
            !spare_cpu(ms(200), ms(100), ms(50)),
            "three quarters of a CPU"
        );
        assert!(!spare_cpu(ms(0), ms(0), ms(0)), "no window yet");
    }

    /// Windows of 250 ms from `t0`, on 2 CPUs: window `n` with `idle` and `mine` ms.
    fn window(t0: Instant, n: u32, idle: u64, mine: u64) -> CpuWindow {
        let ms = Duration::from_millis;
        CpuWindow {
            start: t0 + ms(250) * n,
            end: t0 + ms(250) * (n + 1),
            idle: ms(idle),
            mine: ms(mine),
        }
    }

    const CONFIRM: Duration = Duration::from_secs(1);

    #[test]
    fn a_moment_of_idle_after_a_save_does_not_send_the_persister_to_full_speed() {
        let t0 = Instant::now();
        // The ranks leave a core idle for half a second after a save, while the persister
        // pauses between its bursts; then they step again.
        let mut node = NodeCpu::Busy;
        node = judge(node, &window(t0, 0, 240, 0), CONFIRM);
        assert_eq!(node, NodeCpu::Seen { since: t0 });
        node = judge(node, &window(t0, 1, 230, 2), CONFIRM);
        assert_eq!(
            node,
            NodeCpu::Seen { since: t0 },
            "half a second is not enough"
        );
        assert!(pace(
            &PaceInput {
                node,
                ..input(0, 0)
            },
            &PARAMS
        )
        .yields());
        node = judge(node, &window(t0, 2, 20, 0), CONFIRM);
        assert_eq!(node, NodeCpu::Busy, "the ranks step again");
        // A window with a burst of the persister's own in it says nothing of a spare CPU,
        // however much idle its burst caused (the ranks waiting for the one it slowed).
        node = judge(node, &window(t0, 3, 200, 60), CONFIRM);
        assert_eq!(node, NodeCpu::Busy);
        let seen = judge(NodeCpu::Busy, &window(t0, 4, 240, 0), CONFIRM);
        assert_eq!(judge(seen, &window(t0, 5, 200, 60), CONFIRM), NodeCpu::Busy);
    }

    #[test]
    fn a_cpu_spare_for_a_second_sends_it_to_full_speed_and_a_pause_checks_it_again() {
        let t0 = Instant::now();
        let mut node = NodeCpu::Busy;
        for n in 0..3 {
            node = judge(node, &window(t0, n, 245, 3), CONFIRM);
            assert_eq!(node, NodeCpu::Seen { since: t0 }, "window {n}");
        }
        node = judge(node, &window(t0, 3, 245, 3), CONFIRM);
        assert_eq!(node, NodeCpu::Spare, "spare for a second");
        // At full speed: the other CPU stays idle beside it, so it stays at full speed.
        node = judge(node, &window(t0, 4, 240, 250), CONFIRM);
        assert_eq!(node, NodeCpu::Spare);
        // Less than a CPU idle beside it, though idle and its own CPU make more than one: its
        // own work may be what idles the ranks. It pauses the next window to see.
        node = judge(node, &window(t0, 5, 60, 250), CONFIRM);
        assert_eq!(node, NodeCpu::Probing);
        let probing = PaceInput {
            node,
            window_left: Duration::from_millis(180),
            ..input(0, 0)
        };
        let probe = pace(&probing, &PARAMS);
        assert_eq!(
            probe,
            Pace::Probe {
                pause: Duration::from_millis(180)
            }
        );
        assert!(probe.yields() && probe.probes());
        assert_eq!(probe.pause(), Duration::from_millis(180));
        assert!(!pace(&input(10, 50), &PARAMS).probes());
        let urgent = PaceInput {
            urgent: true,
            ..probing
        };
        assert_eq!(pace(&urgent, &PARAMS), Pace::Urgent, "the run's end waits");
        // Without it the CPU is spare: full speed again, no second confirmation.
        assert_eq!(judge(node, &window(t0, 6, 240, 1), CONFIRM), NodeCpu::Spare);
        // It was the persister's: the ranks use both CPUs when it pauses.
        assert_eq!(judge(node, &window(t0, 6, 30, 1), CONFIRM), NodeCpu::Busy);
        // A window of no length changes nothing.
        let at = t0 + Duration::from_secs(2);
        let empty = CpuWindow {
            start: at,
            end: at,
            idle: Duration::ZERO,
            mine: Duration::ZERO,
        };
        assert_eq!(judge(NodeCpu::Spare, &empty, CONFIRM), NodeCpu::Spare);
    }

    #[test]
    fn the_throttle_pauses_to_the_rate() {
        let s = Duration::from_secs;
        assert_eq!(pause(100 * MIB, s(0), 0), Duration::ZERO, "no limit");
        assert_eq!(pause(100 * MIB, s(0), 100 * MIB), s(1));
        assert_eq!(
            pause(100 * MIB, Duration::from_millis(400), 100 * MIB),
            Duration::from_millis(600)
        );
        assert_eq!(pause(100 * MIB, s(2), 100 * MIB), Duration::ZERO, "behind");
    }
}
