//! A worker's resident memory and CPU time from `/proc/<pid>/stat` (read at scrape time).

use std::path::Path;

/// What `/proc` says about one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcUsage {
    /// Resident set size in bytes.
    pub rss_bytes: u64,
    /// User + system CPU time in seconds.
    pub cpu_seconds: f64,
}

/// The usage of process `pid`, `None` when it is gone or `/proc` is unreadable.
pub fn usage(pid: i32) -> Option<ProcUsage> {
    let stat =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    parse_stat(&stat, clock_ticks(), page_size())
}

/// Parses a `/proc/<pid>/stat` line: utime and stime (fields 14, 15, in clock ticks) and rss
/// (field 24, in pages). The command name (field 2) may hold spaces and parentheses, so fields
/// are counted after its last `)`.
pub fn parse_stat(stat: &str, ticks_per_second: u64, page_bytes: u64) -> Option<ProcUsage> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state).
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let ticks = field(14)? + field(15)?;
    Some(ProcUsage {
        rss_bytes: field(24)? * page_bytes,
        cpu_seconds: ticks as f64 / ticks_per_second.max(1) as f64,
    })
}

fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |v| v as u64)
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |v| v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_after_the_command_name() {
        let line = "42 (python (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 1000000 300 18446744073709551615";
        let u = parse_stat(line, 100, 4096).unwrap();
        assert_eq!(u.rss_bytes, 300 * 4096);
        assert!((u.cpu_seconds - 3.0).abs() < 1e-9, "{u:?}");
        assert_eq!(parse_stat("42 (x) S 1", 100, 4096), None);
    }

    #[test]
    fn this_process_has_memory_and_cpu() {
        let u = usage(std::process::id() as i32).expect("our own /proc entry");
        assert!(u.rss_bytes > 0);
        assert!(usage(i32::MAX).is_none());
    }
}
