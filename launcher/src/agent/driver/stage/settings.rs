//! The persister's settings: its defaults and the environment variables that override them
//! (`DRUN_CKPT_PERSIST_RATE`, `DRUN_CKPT_PERSIST_CPU`, `DRUN_CKPT_PERSIST_LAG`, and the test
//! knob `DRUN_CKPT_PERSIST_RATE_HELD`), read once when the stage opens.

use std::time::Duration;

use crate::ckpt::memory::pace::PaceParams;

/// How fast the persister writes, bytes per second, unless `DRUN_CKPT_PERSIST_RATE` says
/// otherwise: below a local NVMe's or a parallel file system client's bandwidth, so the
/// training's own I/O (data loading, logs) keeps the rest.
const PERSIST_RATE: u64 = 1 << 30;

/// The share of one CPU the persister keeps to while the node's CPUs are busy (the training's
/// ranks on every core), unless `DRUN_CKPT_PERSIST_CPU` says otherwise: on 2 ranks over 2
/// cores, a slowdown of their steps of about half of it.
const PERSIST_CPU_SHARE: f64 = 0.05;

/// How long a staged step may wait for the disk before the persister stops yielding the CPU to
/// the training, unless `DRUN_CKPT_PERSIST_LAG` says otherwise.
const PERSIST_LAG_BOUND: Duration = Duration::from_secs(120);

/// How the persister shares the CPU: [`PERSIST_CPU_SHARE`] and [`PERSIST_LAG_BOUND`], or what
/// `DRUN_CKPT_PERSIST_CPU` (a fraction of one CPU) and `DRUN_CKPT_PERSIST_LAG` (seconds)
/// say.
pub(super) fn pace_params() -> PaceParams {
    let share = std::env::var("DRUN_CKPT_PERSIST_CPU")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(PERSIST_CPU_SHARE);
    let lag_bound = std::env::var("DRUN_CKPT_PERSIST_LAG")
        .ok()
        .and_then(|v| v.trim().trim_end_matches('s').parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(PERSIST_LAG_BOUND, Duration::from_secs_f64);
    PaceParams { share, lag_bound }
}

/// The persister's byte rates: while the workers run ([`PERSIST_RATE`] unless
/// `DRUN_CKPT_PERSIST_RATE` says otherwise) and while the workers' end waits for it.
pub(super) fn persist_rates() -> (u64, u64) {
    let env_rate = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|r| crate::ckpt::memory::parse_size(&r))
    };
    let rate = env_rate("DRUN_CKPT_PERSIST_RATE").unwrap_or(PERSIST_RATE);
    // A test knob: the rate while the workers' end waits for the persister (the same unless
    // set). Tests slow the persister so a fault lands while the disk lags, and set this so the
    // waits that follow the fault do not crawl at the same rate.
    let held_rate = env_rate("DRUN_CKPT_PERSIST_RATE_HELD").unwrap_or(rate);
    (rate, held_rate)
}
