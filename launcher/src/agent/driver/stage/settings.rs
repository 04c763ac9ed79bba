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
/// ranks on every core), unless `DRUN_CKPT_PERSIST_CPU` says otherwise. Ranks that step
/// together (an all-reduce a step) all wait for the one whose core the persister took, so the
/// steps while it persists slow by about one and a half to two and a half times the share: on 2
/// ranks over 2 busy cores, 4.7 % at 3 % of one CPU with SHA-256 digests, 6.7-8.7 % at 3 % and
/// 4.8-5.0 % at 2 % with BLAKE3 (its work per GiB is half, the same training time lost per save
/// is spread over half the lag). At 1.5 % a node's 2 GiB take about 55 s (the lag bound is
/// 120 s); where a CPU is spare the persister goes at full speed whatever the share
/// (`docs/contributing/benchmarks.md`, "BLAKE3 digests").
const PERSIST_CPU_SHARE: f64 = 0.015;

/// How long a staged step may wait for the disk before the persister stops yielding the CPU to
/// the training, unless `DRUN_CKPT_PERSIST_LAG` says otherwise.
const PERSIST_LAG_BOUND: Duration = Duration::from_secs(120);

/// How the persister shares the CPU: [`PERSIST_CPU_SHARE`] and [`PERSIST_LAG_BOUND`], or what
/// `DRUN_CKPT_PERSIST_CPU` (a fraction of one CPU) and `DRUN_CKPT_PERSIST_LAG` (seconds)
/// say.
pub(super) fn pace_params() -> PaceParams {
    let share = setting(
        "DRUN_CKPT_PERSIST_CPU",
        |v| v.parse::<f64>().ok().filter(|s| s.is_finite() && *s > 0.0),
        PERSIST_CPU_SHARE,
        "a share of one CPU (e.g. 0.015)",
        &PERSIST_CPU_SHARE.to_string(),
    );
    let lag_bound = setting(
        "DRUN_CKPT_PERSIST_LAG",
        |v| {
            v.trim_end_matches('s')
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
        },
        PERSIST_LAG_BOUND,
        "a number of seconds (e.g. 120)",
        &format!("{} s", PERSIST_LAG_BOUND.as_secs()),
    );
    PaceParams { share, lag_bound }
}

/// The persister's byte rates: while the workers run ([`PERSIST_RATE`] unless
/// `DRUN_CKPT_PERSIST_RATE` says otherwise) and while the workers' end waits for it.
pub(super) fn persist_rates() -> (u64, u64) {
    let rate = |v: &str| crate::ckpt::memory::parse_size(v);
    let what = "a rate (a size per second such as 200M)";
    let shown = |r: u64| format!("{}/s", crate::ckpt::memory::human_bytes(r));
    let run = setting(
        "DRUN_CKPT_PERSIST_RATE",
        rate,
        PERSIST_RATE,
        what,
        &shown(PERSIST_RATE),
    );
    // A test knob: the rate while the workers' end waits for the persister (the same unless
    // set). Tests slow the persister so a fault lands while the disk lags, and set this so the
    // waits that follow the fault do not crawl at the same rate.
    let held = setting("DRUN_CKPT_PERSIST_RATE_HELD", rate, run, what, &shown(run));
    (run, held)
}

/// The value of environment variable `var` read by `parse`, or `default` when unset; a value
/// it cannot read is said in one warning line naming `what` it should be, and the default
/// (`shown`) stands.
fn setting<T>(
    var: &str,
    parse: impl Fn(&str) -> Option<T>,
    default: T,
    what: &str,
    shown: &str,
) -> T {
    let Ok(v) = std::env::var(var) else {
        return default;
    };
    parse(v.trim()).unwrap_or_else(|| {
        crate::say!("drun: warning: {var}={v:?} is not {what}; {shown} is used");
        default
    })
}
