//! Stopping a worker group, as a pure state machine: the signal, the grace period, SIGKILL.
//!
//! [`StopSequence::step`] takes the current state, one [`StopInput`], whether any worker
//! still runs and the time, and returns the [`StopEffect`]s for the caller to carry out (send a
//! signal to every running worker's process group, wait until an instant). It never reads a
//! clock or touches a process, so it is tested with synthetic instants.
//!
//! The sequence: the stop signal once; up to the shutdown timeout for the workers to exit;
//! then SIGKILL and up to the kill wait for them to be reaped. A relayed signal (SIGUSR1/2)
//! during the grace is passed on; a second SIGINT ends the grace at once.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// Where a stop stands. Deadlines live in the state that owns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopState {
    /// Not started.
    Idle,
    /// `sig` went to every running worker at `since`; SIGKILL follows at `deadline`.
    Terminating {
        /// The stop signal.
        sig: Signal,
        /// When it was sent.
        since: Instant,
        /// End of the grace period (`since` + shutdown timeout).
        deadline: Instant,
        /// SIGINTs received so far (the stop signal included); two end the grace.
        sigints: usize,
    },
    /// SIGKILL went to every running worker at `since`; waiting for reaps until `deadline`.
    Killing {
        /// When SIGKILL was sent.
        since: Instant,
        /// When the wait for the reaps ends.
        deadline: Instant,
    },
    /// Finished at `at`; `abandoned`: some worker was still not reaped after SIGKILL.
    Done {
        /// When.
        at: Instant,
        /// Workers left unreaped (e.g. in uninterruptible sleep).
        abandoned: bool,
    },
}

impl StopState {
    /// The sequence is over.
    pub fn is_done(&self) -> bool {
        matches!(self, StopState::Done { .. })
    }

    /// SIGKILL has been sent.
    pub fn is_killing(&self) -> bool {
        matches!(self, StopState::Killing { .. })
    }

    /// The instant the caller should next wake up at, if any (besides child exits).
    pub fn deadline(&self) -> Option<Instant> {
        match self {
            StopState::Terminating { deadline, .. } | StopState::Killing { deadline, .. } => {
                Some(*deadline)
            }
            StopState::Idle | StopState::Done { .. } => None,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopInput {
    /// Start stopping with this signal.
    Start(Signal),
    /// A child exited, a timer fired: look again.
    Tick,
    /// A signal to pass on to the workers without changing the sequence (SIGUSR1/2).
    Relay(Signal),
    /// A teardown signal arrived while stopping (it was already forwarded once).
    Teardown(Signal),
}

/// What the caller does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopEffect {
    /// Send this signal to the process group of every running worker.
    SignalRunning(Signal),
}

/// The stop state machine of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopSequence {
    /// Current state.
    pub state: StopState,
    /// Grace between the stop signal and SIGKILL (`--shutdown-timeout`).
    pub shutdown_timeout: Duration,
    /// How long to wait for SIGKILLed workers to be reaped.
    pub kill_wait: Duration,
}

impl StopSequence {
    /// A sequence not started yet.
    pub fn new(shutdown_timeout: Duration, kill_wait: Duration) -> Self {
        Self {
            state: StopState::Idle,
            shutdown_timeout,
            kill_wait,
        }
    }

    /// One transition; `any_running` is whether a worker is still unreaped at `now`.
    pub fn step(&mut self, input: StopInput, any_running: bool, now: Instant) -> Vec<StopEffect> {
        use StopInput as I;
        use StopState as S;
        let done = |abandoned| S::Done { at: now, abandoned };
        let kill = |this: &Self| S::Killing {
            since: now,
            deadline: now + this.kill_wait,
        };
        let (next, effects) = match (self.state, input) {
            (S::Idle, I::Start(_)) if !any_running => (done(false), vec![]),
            (S::Idle, I::Start(sig)) => (
                S::Terminating {
                    sig,
                    since: now,
                    deadline: now + self.shutdown_timeout,
                    sigints: usize::from(sig == Signal::SIGINT),
                },
                vec![StopEffect::SignalRunning(sig)],
            ),
            (S::Terminating { .. } | S::Killing { .. }, I::Tick) if !any_running => {
                (done(false), vec![])
            }
            (S::Terminating { deadline, .. }, I::Tick) if now >= deadline => {
                (kill(self), vec![StopEffect::SignalRunning(Signal::SIGKILL)])
            }
            (S::Killing { deadline, .. }, I::Tick) if now >= deadline => (done(true), vec![]),
            (S::Terminating { .. }, I::Relay(sig)) if any_running => {
                (self.state, vec![StopEffect::SignalRunning(sig)])
            }
            (
                S::Terminating {
                    sig,
                    since,
                    deadline,
                    sigints,
                },
                I::Teardown(s),
            ) => {
                let sigints = sigints + usize::from(s == Signal::SIGINT);
                if sigints >= 2 && any_running {
                    (kill(self), vec![StopEffect::SignalRunning(Signal::SIGKILL)])
                } else {
                    let state = S::Terminating {
                        sig,
                        since,
                        deadline,
                        sigints,
                    };
                    (state, vec![])
                }
            }
            (state, _) => (state, vec![]),
        };
        self.state = next;
        effects
    }
}
