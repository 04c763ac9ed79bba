//! What drun records for the container it runs in (Kubernetes): the termination message and
//! the restart counter's directory, flattened into [`super::Args`].

use std::path::PathBuf;

use clap::Args;

/// `--termination-log` and `--state-dir`, raw.
#[derive(Debug, Clone, Default, Args)]
pub struct ContainerArgs {
    /// Where the exit's root cause goes, as one JSON object of at most 4 KiB (exit code, its
    /// class for failure policies, reason, run id): shown by `kubectl describe pod`. Default:
    /// /dev/termination-log when the kubelet mounted it, else nowhere.
    #[arg(
        long = "termination-log",
        env = "DRUN_TERMINATION_LOG",
        value_name = "PATH",
        help_heading = "Kubernetes"
    )]
    pub termination_log: Option<PathBuf>,

    /// A directory on a volume that outlives the container (e.g. an emptyDir): drun counts its
    /// starts there (`container_restarts`, monotonic across in-place container restarts),
    /// printed at start and in the termination message.
    #[arg(
        long = "state-dir",
        env = "DRUN_STATE_DIR",
        value_name = "DIR",
        help_heading = "Kubernetes"
    )]
    pub state_dir: Option<PathBuf>,
}
