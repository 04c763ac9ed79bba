//! What the run's surroundings decide ([`SchedulerConfig`]): the Slurm or Kubernetes job it
//! runs in, preemption and requeue, and the container's termination log and state directory.

use std::path::PathBuf;

use nix::sys::signal::Signal;

use crate::k8s::K8sJob;
use crate::slurm::{OnPreempt, SlurmJob};

/// The batch system or container the run lives in, and what drun does at its edges.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// The Slurm job drun runs in, if any.
    pub slurm: Option<SlurmJob>,
    /// What was taken from Slurm, one line (printed at start).
    pub slurm_line: Option<String>,
    /// The Kubernetes job drun runs in, if one was recognized.
    pub k8s: Option<K8sJob>,
    /// What was taken from it, one line (printed at start).
    pub k8s_line: Option<String>,
    /// `--termination-log`.
    pub termination_log: Option<PathBuf>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
    /// This container's start count on `--state-dir` (0: first start), counted by
    /// [`super::prepare`].
    pub container_restarts: Option<u64>,
    /// `--on-preempt`.
    pub on_preempt: OnPreempt,
    /// `--preempt-signal`.
    pub preempt_signal: Signal,
    /// `--requeue`.
    pub requeue: bool,
}
