//! Watching the workers ([`ObserveConfig`]): hangs, stragglers, the metrics endpoint and the
//! preflight check; validated by [`observe`].

use super::{invalid, Preflight};
use crate::{Args, ConfigError};

/// How the agent watches its workers.
#[derive(Debug, Clone)]
pub struct ObserveConfig {
    /// `--hang-timeout`: how long a rank that sent step beacons may send none; `None`: off.
    pub hang_timeout: Option<crate::agent::hang::Timeout>,
    /// `--straggler-factor`: 0 (off) or > 1.
    pub straggler_factor: f64,
    /// `--metrics-port` (0: any free port); `None`: no metrics endpoint.
    pub metrics_port: Option<u16>,
    /// `--preflight`, with its `--preflight-min-gbps` (Gbit/s); `None`: no check.
    pub preflight: Option<Preflight>,
}

/// `--hang-timeout`, `--straggler-factor`, `--metrics-port`, `--preflight` and
/// `--preflight-min-gbps`.
///
/// # Errors
/// A malformed hang timeout, a straggler factor that is neither 0 nor above 1, a bandwidth that
/// is not above 0 or given without `--preflight`.
pub(super) fn observe(a: &Args) -> Result<ObserveConfig, ConfigError> {
    Ok(ObserveConfig {
        hang_timeout: super::timing::hang_timeout(&a.hang_timeout)?,
        straggler_factor: straggler_factor(a.observe.straggler_factor)?,
        metrics_port: a.observe.metrics_port,
        preflight: preflight(a)?,
    })
}

/// `--preflight` and `--preflight-min-gbps` (a positive, finite number; only with `--preflight`).
fn preflight(a: &Args) -> Result<Option<Preflight>, ConfigError> {
    if let Some(v) = a.observe.preflight_min_gbps {
        if !(v.is_finite() && v > 0.0) {
            return Err(invalid(
                "--preflight-min-gbps",
                v.to_string(),
                "expected a bandwidth in Gbit/s above 0, e.g. 10",
            ));
        }
        if !a.observe.preflight {
            return Err(invalid(
                "--preflight-min-gbps",
                v.to_string(),
                "it only applies with --preflight; add --preflight",
            ));
        }
    }
    Ok(a.observe.preflight.then_some(Preflight {
        min_gbps: a.observe.preflight_min_gbps,
    }))
}

/// `--straggler-factor`: 0 (off) or a finite factor > 1.
fn straggler_factor(v: f64) -> Result<f64, ConfigError> {
    if v == 0.0 || (v.is_finite() && v > 1.0) {
        return Ok(v);
    }
    Err(invalid(
        "--straggler-factor",
        v.to_string(),
        "expected 0 (off) or a factor above 1, e.g. 1.5",
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::args;
    use super::*;

    fn refused(v: &[&str]) -> String {
        observe(&args(v)).expect_err("refused").to_string()
    }

    #[test]
    fn straggler_factors_of_one_or_less_are_refused() {
        for bad in ["1", "0.5", "-2", "inf", "NaN"] {
            let e = refused(&["--straggler-factor", bad, "t.py"]);
            assert!(
                e.contains("expected 0 (off) or a factor above 1"),
                "{bad}: {e}"
            );
        }
        let off = observe(&args(&["--straggler-factor", "0", "t.py"])).unwrap();
        assert_eq!(off.straggler_factor, 0.0);
    }

    #[test]
    fn a_bandwidth_needs_preflight_and_must_be_positive() {
        let e = refused(&["--preflight-min-gbps", "10", "t.py"]);
        assert!(e.contains("add --preflight"), "{e}");
        let e = refused(&["--preflight", "--preflight-min-gbps", "0", "t.py"]);
        assert!(e.contains("above 0"), "{e}");
        let p = observe(&args(&[
            "--preflight",
            "--preflight-min-gbps",
            "10",
            "t.py",
        ]))
        .unwrap();
        assert_eq!(
            p.preflight,
            Some(Preflight {
                min_gbps: Some(10.0)
            })
        );
    }

    #[test]
    fn malformed_hang_timeouts_are_refused() {
        let e = refused(&["--hang-timeout", "soon", "t.py"]);
        assert!(e.starts_with("invalid --hang-timeout 'soon'"), "{e}");
    }
}
