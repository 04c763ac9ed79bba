//! Supervising the workers ([`SupervisionConfig`]): the restart budget, the monitor interval,
//! the signals forwarded and the grace periods of a stop; validated by [`supervision`].

use std::time::Duration;

use nix::sys::signal::Signal;

use super::parse::parse_signals;
use super::timing::{seconds, shutdown_timeout};
use super::Host;
use crate::{Args, ConfigError};

/// How the agent supervises its workers.
#[derive(Debug, Clone)]
pub struct SupervisionConfig {
    /// Worker-failure restart budget.
    pub max_restarts: u32,
    /// Poll interval of worker state.
    pub monitor_interval: Duration,
    /// Signals that trigger forward + teardown.
    pub signals: Vec<Signal>,
    /// `--signals-to-handle` as given (exported as TORCHELASTIC_SIGNALS_TO_HANDLE).
    pub signals_to_handle: String,
    /// Grace between the termination signal and SIGKILL.
    pub shutdown_timeout: Duration,
    /// How long a partial success may last before it counts as a failure.
    pub peer_exit_wait: Duration,
}

/// `--max-restarts`, `--monitor-interval`, `--shutdown-timeout` (defaulted from the host:
/// Slurm's `KillWait` when `in_slurm`, Kubernetes' grace period inside a pod),
/// `--peer-exit-wait` and `--signals-to-handle`.
///
/// # Errors
/// A duration that is not a finite number of seconds in range, a signal name not known.
pub(super) fn supervision(
    a: &Args,
    host: &Host,
    in_slurm: bool,
) -> Result<SupervisionConfig, ConfigError> {
    let monitor_interval = seconds("--monitor-interval", a.monitor_interval, false)?;
    let in_k8s = crate::container::in_kubernetes(|k| host.var(k).map(str::to_string));
    let shutdown_timeout = shutdown_timeout(a.shutdown_timeout, in_slurm, in_k8s, host)?;
    let peer_exit_wait = seconds("--peer-exit-wait", a.peer_exit_wait, true)?;
    let signals = parse_signals(&a.signals_to_handle)?;
    Ok(SupervisionConfig {
        max_restarts: a.max_restarts,
        monitor_interval,
        signals,
        signals_to_handle: a.signals_to_handle.clone(),
        shutdown_timeout,
        peer_exit_wait,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, host, with_env};
    use super::*;

    fn refused(v: &[&str], h: &Host) -> String {
        supervision(&args(v), h, false)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn bad_durations_and_signals_are_refused() {
        let h = host();
        let e = refused(&["--monitor-interval", "0", "t.py"], &h);
        assert!(e.starts_with("invalid --monitor-interval '0'"), "{e}");
        let e = refused(&["--peer-exit-wait=-1", "t.py"], &h);
        assert!(e.starts_with("invalid --peer-exit-wait"), "{e}");
        let e = refused(&["--shutdown-timeout", "nan", "t.py"], &h);
        assert!(e.starts_with("invalid --shutdown-timeout"), "{e}");
        let e = refused(&["--signals-to-handle", "SIGNOPE", "t.py"], &h);
        assert!(e.starts_with("invalid --signals-to-handle"), "{e}");
    }

    #[test]
    fn a_shutdown_timeout_from_the_environment_must_be_a_number() {
        let h = with_env(&[("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon")]);
        let e = refused(&["t.py"], &h);
        assert!(
            e.contains("TORCH_ELASTIC_SHUTDOWN_TIMEOUT is not a number"),
            "{e}"
        );
    }
}
