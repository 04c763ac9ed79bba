//! Durations, byte counts and progress lines as people read them (`3.3 s`, not `3.333333333s`
//! or `0ns`; `1.5 GiB`).

use std::time::Duration;

/// The longest timeout or interval drun takes, in seconds: 30 days (`--rdzv-conf` timeouts,
/// `--shutdown-timeout` and the other seconds flags, `--ckpt-interval`).
pub const MAX_SECONDS: f64 = 2_592_000.0;

/// A duration for a log line: `0 s`, `250 ms`, `3.3 s`, `30 s`, `600 s` (whole seconds from
/// 10 s on, one decimal below, milliseconds under a second).
///
/// ```
/// use std::time::Duration;
/// use drun_rendezvous::human::duration;
/// assert_eq!(duration(Duration::from_secs_f64(10.0 / 3.0)), "3.3 s");
/// assert_eq!(duration(Duration::from_secs_f64(25.001338091)), "25 s");
/// assert_eq!(duration(Duration::ZERO), "0 s");
/// assert_eq!(duration(Duration::from_millis(250)), "250 ms");
/// ```
pub fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s == 0.0 {
        "0 s".into()
    } else if s < 1.0 {
        format!("{} ms", d.as_millis().max(1))
    } else if s < 10.0 {
        let r = format!("{s:.1}");
        format!("{} s", r.strip_suffix(".0").unwrap_or(&r))
    } else {
        format!("{} s", s.round() as u64)
    }
}

/// A byte count for a human, in powers of 1024 as memory is budgeted and `free -h` shows it:
/// `7 B`, `12 KiB`, `300 MiB`, `1.5 GiB` (whole numbers from 100 on, one decimal below).
///
/// ```
/// use drun_rendezvous::human::bytes;
/// assert_eq!(bytes(7), "7 B");
/// assert_eq!(bytes(3 << 29), "1.5 GiB");
/// assert_eq!(bytes(1_234_567), "1.2 MiB");
/// assert_eq!(bytes(300 << 20), "300 MiB");
/// ```
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

/// A progress line without its countdown (`, last call in 12 s`, `, join timeout in 580 s`):
/// what must change for the line to be worth printing again.
///
/// ```
/// use drun_rendezvous::human::without_countdown;
/// assert_eq!(without_countdown("1/2 nodes joined (min 1), last call in 3 s"), "1/2 nodes joined (min 1)");
/// assert_eq!(without_countdown("waiting for 1 more node (1/2), join timeout in 9 s"), "waiting for 1 more node (1/2)");
/// assert_eq!(without_countdown("generation 3 is running"), "generation 3 is running");
/// ```
pub fn without_countdown(line: &str) -> &str {
    [", last call in ", ", join timeout in ", ", forming in "]
        .iter()
        .find_map(|m| line.find(m))
        .map_or(line, |i| &line[..i])
}
