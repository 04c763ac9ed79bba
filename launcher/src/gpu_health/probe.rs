//! The seam: runs `nvidia-smi` (bounded: it hangs on a wedged GPU) and reads the kernel log's
//! records and the time since boot, for [`super::judge`].

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::Duration;

use super::judge::Probe;
use super::read;
use crate::fingerprint::bounded::{self, Bounded};

/// Longest `nvidia-smi` may run before the probe gives up (the check is then unknown).
pub const NVIDIA_SMI_TIMEOUT: Duration = crate::fingerprint::NVIDIA_SMI_TIMEOUT;
/// At most this much of the kernel log is read.
const KMSG_LIMIT: usize = 4 << 20;

/// Whether this node has the NVIDIA driver or `nvidia-smi` (otherwise there is nothing to check).
pub fn has_nvidia() -> bool {
    std::path::Path::new("/proc/driver/nvidia/gpus").is_dir() || on_path("nvidia-smi")
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p)
            .any(|d| std::fs::metadata(d.join(name)).is_ok_and(|m| m.is_file()))
    })
}

/// One probe: `nvidia-smi`'s readings (its error lines too), the kernel log's Xids and the
/// time since boot. Blocking: run it off the agent's loop.
pub fn probe() -> Probe {
    let mut c = Command::new("nvidia-smi");
    c.args([
        &format!("--query-gpu={}", read::QUERY),
        "--format=csv,noheader,nounits",
    ]);
    let mut p = Probe {
        xids: read::xids(&kmsg()),
        uptime: uptime(),
        ..Probe::default()
    };
    match bounded::output_within_with_errors(&mut c, NVIDIA_SMI_TIMEOUT) {
        Bounded::Exited(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            (p.readings, p.lost) = read::readings(&text);
            if p.readings.is_empty() && p.lost.is_empty() {
                let first = text
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("no output");
                p.failed = Some(format!(
                    "nvidia-smi answered no GPU ({}: {})",
                    out.status,
                    first.trim()
                ));
            }
        }
        Bounded::TimedOut => {
            p.failed = Some(format!(
                "nvidia-smi did not answer within {} (a wedged GPU?)",
                drun_rendezvous::human::duration(NVIDIA_SMI_TIMEOUT)
            ));
        }
        Bounded::CannotRun(e) => p.failed = Some(format!("cannot run nvidia-smi: {e}")),
    }
    p
}

/// Seconds since boot (`/proc/uptime`).
fn uptime() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The kernel log's records still in its ring buffer (`/dev/kmsg`, read without blocking);
/// empty where it cannot be read (no privilege, a container).
fn kmsg() -> String {
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
    else {
        return String::new();
    };
    // Each read returns one record; EAGAIN at the end of the buffer, EPIPE for a record
    // overwritten while reading (skipped).
    let mut out = String::new();
    let mut buf = vec![0u8; 8192];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.push_str(&String::from_utf8_lossy(&buf[..n]));
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                if out.len() > KMSG_LIMIT {
                    break;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    out
}
