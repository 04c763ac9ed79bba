//! `/proc` scans and signalling helpers.

use std::fs;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Sends `sig` to process group `pgid`. A group that is already gone (ESRCH) counts as success.
pub fn signal_group(pgid: Pid, sig: Signal) {
    match killpg(pgid, sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pgid = pgid.as_raw(), ?sig, error = %e, "killpg failed"),
    }
}

/// Sends `sig` to one process; ESRCH counts as success.
pub fn signal_process(pid: Pid, sig: Signal) {
    match kill(pid, sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pid = pid.as_raw(), ?sig, error = %e, "kill failed"),
    }
}

fn pids() -> impl Iterator<Item = Pid> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .map(Pid::from_raw)
}

/// Parent pid of `pid` from `/proc/<pid>/stat` (the field after the parenthesised comm).
pub fn parent_of(pid: Pid) -> Option<Pid> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse::<i32>().ok().map(Pid::from_raw)
}

/// Whether `pid` is a zombie (exited, not yet reaped).
pub fn is_zombie(pid: Pid) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = &s[s.rfind(')')? + 1..];
            after.split_whitespace().next().map(|st| st == "Z")
        })
        .unwrap_or(false)
}

/// Whether `pid` is stopped (`T`: SIGSTOP, SIGTSTP; `t`: held by a tracer).
pub fn is_stopped(pid: Pid) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = &s[s.rfind(')')? + 1..];
            after
                .split_whitespace()
                .next()
                .map(|st| st == "T" || st == "t")
        })
        .unwrap_or(false)
}

/// Live (non-zombie) children of `parent`.
pub fn children_of(parent: Pid) -> Vec<Pid> {
    pids()
        .filter(|p| parent_of(*p) == Some(parent) && !is_zombie(*p))
        .collect()
}

/// Live processes whose environment holds `key=value` (e.g. `DRUN_AGENT_ID=<id>`), excluding
/// this process.
pub fn with_env(key: &str, value: &str) -> Vec<Pid> {
    let needle = format!("{key}={value}\0").into_bytes();
    let me = nix::unistd::getpid();
    pids()
        .filter(|p| *p != me)
        .filter(|p| {
            fs::read(format!("/proc/{p}/environ"))
                .map(|env| env.windows(needle.len()).any(|w| w == needle.as_slice()))
                .unwrap_or(false)
        })
        .filter(|p| !is_zombie(*p))
        .collect()
}
