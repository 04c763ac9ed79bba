//! Agent exit codes (`docs/architecture.md` §5). Documented in `drun --help` and
//! `docs/reference/exit-codes.md` (which `tests/k8s_examples.rs` checks against the examples).

/// Text appended to `drun --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0        all workers succeeded
  1        a worker failed and the restart budget (--max-restarts) is spent
  2        usage or configuration error (nothing was started); also on every node when
           the nodes' launch configs or environments do not match (--env-check)
  3        rendezvous failed (join timeout, closed run, unreachable store, token refused)
  4        fenced: lost membership and could not rejoin
  5        preempted: a coordinated checkpoint was sealed after a preemption warning
           (--on-preempt checkpoint); requeue the job to resume from it
  6        a GPU of this node failed its health check (--gpu-health) and the run's size is
           fixed, so the node cannot join
  128+N    the agent was stopped by signal N (workers were signalled and reaped first)
For Kubernetes failure policies (podFailurePolicy, JobSet): 1 and 2 are fatal (the same
error would recur); 3, 4, 5, 6 and 128+N are retryable (infrastructure, preemption).

drun doctor [FLAGS] [SCRIPT]: print every setting this command line resolves to, where each
came from (flag, PET_*, Slurm, the Kubernetes operator, default) and the known traps.";

/// How the agent ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentExit {
    /// Every worker exited 0.
    Success,
    /// A worker failed after the restart budget was spent.
    WorkerFailure,
    /// Bad flags or configuration; nothing was started.
    Usage,
    /// The rendezvous failed.
    Rendezvous,
    /// Fenced and could not rejoin.
    Fenced,
    /// Checkpointed after a preemption warning: requeue me.
    Preempted,
    /// A GPU of this node failed its health check and the run's size is fixed: it cannot join.
    GpuUnhealthy,
    /// Stopped by this signal number after tearing the workers down.
    Signal(i32),
}

impl AgentExit {
    /// The process exit code (0–255).
    ///
    /// ```
    /// use drun_launcher::AgentExit;
    /// assert_eq!(AgentExit::WorkerFailure.code(), 1);
    /// assert_eq!(AgentExit::Signal(15).code(), 143);
    /// ```
    pub fn code(self) -> u8 {
        match self {
            AgentExit::Success => 0,
            AgentExit::WorkerFailure => 1,
            AgentExit::Usage => 2,
            AgentExit::Rendezvous => 3,
            AgentExit::Fenced => 4,
            AgentExit::Preempted => 5,
            AgentExit::GpuUnhealthy => 6,
            AgentExit::Signal(n) => (128 + n).clamp(0, 255) as u8,
        }
    }
}
