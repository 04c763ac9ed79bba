//! Process bookkeeping for the benchmarks: every process a run starts carries a tag in its
//! environment, so the run can find, stop and kill all of them at the end — also workers that
//! left their launcher's process group (torchrun starts each worker in a new session) — and
//! readings of one process from `/proc`.

use std::fs;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Environment variable naming the run a process belongs to.
pub const RUN_TAG: &str = "DRUN_BENCH_RUN";
/// Environment variable naming the simulated node (agent and its workers) within a run.
pub const NODE_TAG: &str = "DRUN_BENCH_NODE";

/// Live processes (zombies excluded: their environment reads empty) whose environment holds
/// `key=value`.
pub fn tagged(key: &str, value: &str) -> Vec<Pid> {
    let needle = format!("{key}={value}");
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            out.push(Pid::from_raw(pid));
        }
    }
    out
}

/// Sends `sig` to every process tagged `key=value`; returns how many there were.
pub fn signal_tagged(key: &str, value: &str, sig: Signal) -> usize {
    let pids = tagged(key, value);
    for &p in &pids {
        let _ = kill(p, sig); // ESRCH: already gone
    }
    pids.len()
}

/// The processes of one benchmark run: each launcher in its own process group, all tagged.
/// Dropping it (or [`Procs::kill_all`]) SIGKILLs every group and every tagged process until
/// none is left, and reaps the launchers.
pub struct Procs {
    pub tag: String,
    children: Vec<Child>,
}

impl Procs {
    pub fn new(label: &str) -> Procs {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Procs {
            tag: format!("{label}-{}-{n}", std::process::id()),
            children: Vec::new(),
        }
    }

    /// The node tag value of node `i` of this run.
    pub fn node(&self, i: usize) -> String {
        format!("{}/{i}", self.tag)
    }

    /// Starts `cmd` as node `i` in a new process group; returns its pid.
    pub fn spawn(&mut self, mut cmd: Command, i: usize) -> std::io::Result<Pid> {
        use std::os::unix::process::CommandExt;
        cmd.env(RUN_TAG, &self.tag)
            .env(NODE_TAG, self.node(i))
            .process_group(0);
        let child = cmd.spawn()?;
        let pid = Pid::from_raw(child.id() as i32);
        self.children.push(child);
        Ok(pid)
    }

    /// SIGKILLs node `i`: every process tagged with it (launcher and workers alike).
    pub fn signal_node(&self, i: usize, sig: Signal) -> usize {
        signal_tagged(NODE_TAG, &self.node(i), sig)
    }

    pub fn kill_all(&mut self) {
        for c in &self.children {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
        }
        // Rescan: a process may have been forking while the first pass ran.
        let deadline = Instant::now() + Duration::from_secs(10);
        while signal_tagged(RUN_TAG, &self.tag, Signal::SIGKILL) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for mut c in self.children.drain(..) {
            let _ = c.wait();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// `VmHWM` (peak resident set) of `pid` in KiB.
pub fn peak_rss_kib(pid: Pid) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `VmRSS` (current resident set) of `pid` in KiB.
pub fn rss_kib(pid: Pid) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User + system CPU time of `pid` itself (not its children), from `/proc/<pid>/stat`.
pub fn cpu_time(pid: Pid) -> Option<Duration> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name start at field 3 (state); utime and stime
    // are fields 14 and 15, in clock ticks of USER_HZ, which Linux fixes at 100 for userspace.
    let f: Vec<&str> = s[s.rfind(')')? + 1..].split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// User + system CPU time of this process, all its threads (10 ms ticks).
pub fn own_cpu_time() -> Duration {
    cpu_time(Pid::this()).unwrap_or_default()
}

/// User + system CPU time of this process's children that have been waited for (`cutime` and
/// `cstime` of `/proc/self/stat`, 10 ms ticks).
pub fn waited_children_cpu_time() -> Duration {
    let s = fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = s[s.rfind(')').map_or(0, |i| i + 1)..]
        .split_whitespace()
        .collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((tick(13) + tick(14)) * 10)
}

/// Whether something listens on loopback TCP `port` (IPv4 or IPv6), from `/proc/net/tcp*`:
/// no connection is made, so a store that counts its clients sees none.
pub fn listening(port: u16) -> bool {
    listening_in("self", port)
}

/// Whether something listens on TCP `port` in the network namespace of process `pid` (a pid,
/// or `self`), from `/proc/<pid>/net/tcp*`.
pub fn listening_in(pid: &str, port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|t| {
        let f = format!("/proc/{pid}/net/{t}");
        fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&hex) && cols[3] == "0A"
            })
        })
    })
}
