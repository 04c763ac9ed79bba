//! Durations of a launch: `--rdzv-conf` timing knobs, seconds flags, the shutdown grace.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{invalid, Host};
use crate::ConfigError;

/// The `--rdzv-conf` keys drun reads; others are reported once at start.
pub const RDZV_CONF_KEYS: [&str; 6] = [
    "join_timeout",
    "last_call_timeout",
    "lease_ttl",
    "keep_alive_interval",
    "reform_settle",
    "is_host",
];

// The longest duration a seconds flag accepts: 30 days.
pub(super) use drun_rendezvous::server::validate::MAX_SECONDS;

/// Rendezvous timing, from `--rdzv-conf` (seconds) with torchrun's defaults where it has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Give up below MIN nodes after this long (`join_timeout`, default 600 s).
    pub join_timeout: Duration,
    /// Last-call window once MIN nodes joined (`last_call_timeout`, default 30 s).
    pub last_call: Duration,
    /// Lease TTL (`lease_ttl`, default 10 s).
    pub lease_ttl: Duration,
    /// Keep-alive period (`keep_alive_interval`, default lease_ttl / 3).
    pub keep_alive_interval: Duration,
    /// Settle window of a re-form whose surviving members all rejoined with newcomers
    /// (`reform_settle`, default 1 s; never longer than the last call; none without newcomers).
    pub settle: Duration,
}

impl Timing {
    /// Reads the knobs from a parsed `--rdzv-conf`.
    ///
    /// # Errors
    /// A value that is not a non-negative number of seconds, or a keep-alive not below the TTL.
    pub fn from_conf(conf: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let secs = |key: &str, default: f64| -> Result<Duration, ConfigError> {
            match conf.get(key) {
                None => Ok(Duration::from_secs_f64(default)),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && (0.0..=MAX_SECONDS).contains(s))
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        invalid(
                            "--rdzv-conf",
                            format!("{key}={v}"),
                            "expected a number of seconds, at most 2592000 (30 days)",
                        )
                    }),
            }
        };
        let lease_ttl = secs("lease_ttl", 10.0)?;
        if lease_ttl < Duration::from_secs(1) {
            return Err(invalid(
                "--rdzv-conf",
                format!("lease_ttl={}", lease_ttl.as_secs_f64()),
                "at least 1 s: a shorter lease expires between keep-alives on a busy node",
            ));
        }
        let max_ttl = Duration::from_millis(drun_rendezvous::server::validate::MAX_LEASE_TTL_MS);
        if lease_ttl > max_ttl {
            return Err(invalid(
                "--rdzv-conf",
                format!("lease_ttl={}", lease_ttl.as_secs_f64()),
                format!(
                    "at most {} s: a dead node is noticed only after one TTL",
                    max_ttl.as_secs()
                ),
            ));
        }
        let keep_alive_interval = match conf.get("keep_alive_interval") {
            Some(_) => secs("keep_alive_interval", 0.0)?,
            None => lease_ttl / 3,
        };
        if keep_alive_interval.is_zero() || keep_alive_interval >= lease_ttl {
            return Err(invalid(
                "--rdzv-conf",
                format!("keep_alive_interval={}", keep_alive_interval.as_secs_f64()),
                "must be > 0 and below lease_ttl",
            ));
        }
        let join_timeout = secs("join_timeout", 600.0)?;
        if join_timeout.is_zero() {
            return Err(invalid(
                "--rdzv-conf",
                "join_timeout=0",
                "must be > 0: it is how long a node waits for the group to form (default 600)",
            ));
        }
        Ok(Timing {
            join_timeout,
            last_call: secs("last_call_timeout", 30.0)?,
            lease_ttl,
            keep_alive_interval,
            settle: secs(
                "reform_settle",
                drun_rendezvous::decisions::core::DEFAULT_SETTLE.as_secs_f64(),
            )?,
        })
    }
}

/// Parses `--rdzv-conf k=v,k2=v2` (keys stripped; a key without `=value` is an error).
pub fn parse_rdzv_conf(v: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut m = BTreeMap::new();
    for part in v.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, val) = part.split_once('=').ok_or_else(|| {
            invalid(
                "--rdzv-conf",
                v,
                format!("'{part}' has no value; use key=value"),
            )
        })?;
        m.insert(k.trim().to_string(), val.to_string());
    }
    Ok(m)
}

/// One note per `--rdzv-conf` key drun does not read.
pub(super) fn unused_conf_notes(conf: &BTreeMap<String, String>) -> Vec<String> {
    conf.keys()
        .filter(|k| !RDZV_CONF_KEYS.contains(&k.as_str()))
        // torchrun passes unknown keys to custom handlers; drun has none: say so once.
        .map(|key| {
            format!(
                "--rdzv-conf {key} is not used by drun (it reads {})",
                RDZV_CONF_KEYS.join(", ")
            )
        })
        .collect()
}

/// A seconds flag as a [`Duration`]: finite, at most [`MAX_SECONDS`], and (unless `allow_zero`)
/// at least one millisecond, the resolution drun works at.
pub(super) fn seconds(
    flag: &'static str,
    v: f64,
    allow_zero: bool,
) -> Result<Duration, ConfigError> {
    let bad = |why: &str| Err(invalid(flag, v.to_string(), why));
    if !v.is_finite() {
        return bad("must be a finite number of seconds");
    }
    if v > MAX_SECONDS {
        return bad("must be at most 2592000 seconds (30 days)");
    }
    if v < 0.0 || (!allow_zero && v < 0.001) {
        let bound = if allow_zero {
            ">= 0 seconds"
        } else {
            "at least 0.001 seconds"
        };
        return bad(&format!("must be {bound}"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// `--shutdown-timeout`, else `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, else (inside Slurm) Slurm's
/// `KillWait` minus 2 s so workers stop before Slurm's SIGKILL, else (inside Kubernetes) 25 s,
/// within the default `terminationGracePeriodSeconds` of 30 s, else 30 s.
pub(super) fn shutdown_timeout(
    flag: Option<f64>,
    in_slurm: bool,
    in_k8s: bool,
    host: &Host,
) -> Result<Duration, ConfigError> {
    let shutdown = match flag {
        Some(s) => s,
        None => match host.var("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
            Some(v) => v.trim().parse::<f64>().map_err(|_| {
                invalid(
                    "--shutdown-timeout",
                    v,
                    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT is not a number",
                )
            })?,
            None => match host.slurm_kill_wait.filter(|_| in_slurm) {
                // Stop the workers before Slurm's SIGKILL (KillWait after its SIGTERM).
                Some(kw) => (kw.as_secs_f64() - 2.0).max(1.0),
                None if in_k8s => crate::container::K8S_SHUTDOWN_TIMEOUT.as_secs_f64(),
                None => 30.0,
            },
        },
    };
    seconds("--shutdown-timeout", shutdown, true)
}

/// `--hang-timeout`: `off`, seconds, or seconds/minutes/hours with a suffix (`90s`, `5m`).
pub(super) fn hang_timeout(v: &str) -> Result<Option<crate::agent::hang::Timeout>, ConfigError> {
    use crate::agent::hang::Timeout;
    let flag = "--hang-timeout";
    let v = v.trim();
    if v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    if v.eq_ignore_ascii_case("auto") {
        return Ok(Some(Timeout::Auto));
    }
    let (num, unit) = match v.char_indices().last() {
        Some((i, 's')) => (&v[..i], 1.0),
        Some((i, 'm')) => (&v[..i], 60.0),
        Some((i, 'h')) => (&v[..i], 3600.0),
        _ => (v, 1.0),
    };
    let secs: f64 = num.trim().parse().map_err(|_| {
        invalid(
            flag,
            v.to_string(),
            "must be `off`, `auto` or a number of seconds (or with a suffix s, m, h)",
        )
    })?;
    seconds(flag, secs * unit, false).map(|d| Some(Timeout::Fixed(d)))
}
