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
    /// `--gpu-health`: how often the node's GPUs are checked while it trains or stands by (and
    /// before every join); `None`: off.
    pub gpu_health: Option<std::time::Duration>,
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
        gpu_health: gpu_health(&a.observe.gpu_health)?,
    })
}

/// `--gpu-health`: `off`, or seconds (with an optional suffix `s`, `m` or `h`), from 1 s to 30
/// days.
fn gpu_health(v: &str) -> Result<Option<std::time::Duration>, ConfigError> {
    let flag = "--gpu-health";
    let v = v.trim();
    if v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let (num, unit) = match v.char_indices().last() {
        Some((i, 's')) => (&v[..i], 1.0),
        Some((i, 'm')) => (&v[..i], 60.0),
        Some((i, 'h')) => (&v[..i], 3600.0),
        _ => (v, 1.0),
    };
    let secs = num
        .trim()
        .parse::<f64>()
        .map(|n| n * unit)
        .unwrap_or(f64::NAN);
    if !(1.0..=2_592_000.0).contains(&secs) {
        return Err(invalid(
            flag,
            v.to_string(),
            "must be `off` or a number of seconds from 1 to 2592000 (30 days), or with a suffix s, m, h; e.g. 30",
        ));
    }
    Ok(Some(std::time::Duration::from_secs_f64(secs)))
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
    fn gpu_health_is_every_30_s_by_default_and_can_be_off() {
        let d = observe(&args(&["t.py"])).unwrap();
        assert_eq!(d.gpu_health, Some(std::time::Duration::from_secs(30)));
        let off = observe(&args(&["--gpu-health", "off", "t.py"])).unwrap();
        assert_eq!(off.gpu_health, None);
        let m = observe(&args(&["--gpu-health", "2m", "t.py"])).unwrap();
        assert_eq!(m.gpu_health, Some(std::time::Duration::from_secs(120)));
        let h = observe(&args(&["--gpu-health", "1h", "t.py"])).unwrap();
        assert_eq!(h.gpu_health, Some(std::time::Duration::from_secs(3600)));
        for bad in ["0", "0.5", "soon", "-3", "NaN", "1e9", "inf"] {
            let e = refused(&["--gpu-health", bad, "t.py"]);
            assert!(
                e.starts_with(&format!("invalid --gpu-health '{bad}'")),
                "{bad}: {e}"
            );
        }
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
