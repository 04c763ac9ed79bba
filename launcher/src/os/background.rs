//! The operating system's side of work done behind the training (the checkpoint persister): the
//! calling thread's CPU time, the node's idle CPU time, a file range's writeback, and the
//! calling thread's I/O priority class. Thin calls; what to do with them is decided in
//! [`crate::ckpt::memory::pace::pace`].

use std::os::fd::AsRawFd;
use std::time::Duration;

/// CPU time (user and system) the calling thread has run.
pub fn thread_cpu() -> Duration {
    nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID
        .now()
        .map(Duration::from)
        .unwrap_or_default()
}

/// Idle time since boot of the CPUs this thread may run on (its affinity: a cpuset, `taskset`;
/// every CPU of the node when unrestricted), summed over them (`/proc/stat`'s idle and iowait
/// columns); `None` where it cannot be read.
pub fn node_idle() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let mine = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok();
    let allowed = |cpu: usize| {
        mine.as_ref()
            .is_none_or(|set| set.is_set(cpu).unwrap_or(false))
    };
    node_idle_of(&stat, clock_ticks()?, allowed)
}

/// The idle and iowait columns of the `cpuN` lines of a `/proc/stat` text for the CPUs
/// `allowed`, in `hz` ticks a second.
fn node_idle_of(stat: &str, hz: u64, allowed: impl Fn(usize) -> bool) -> Option<Duration> {
    let mut ticks = 0u64;
    let mut seen = false;
    for line in stat.lines() {
        let mut cols = line.split_whitespace();
        let Some(cpu) = cols
            .next()
            .and_then(|c| c.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if !allowed(cpu) {
            continue;
        }
        let cols: Vec<u64> = cols.map(|c| c.parse().ok()).collect::<Option<_>>()?;
        ticks += cols.get(3)? + cols.get(4).copied().unwrap_or(0);
        seen = true;
    }
    (seen && hz > 0).then(|| Duration::from_secs_f64(ticks as f64 / hz as f64))
}

fn clock_ticks() -> Option<u64> {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    u64::try_from(hz).ok()
}

/// Starts the writeback of `len` bytes of `file` from `offset` (`wait`: and waits for it, and
/// for any already under way there), so that a large copy reaches the disk as it goes rather
/// than in one fsync at its end.
pub fn write_back(file: &std::fs::File, offset: u64, len: u64, wait: bool) -> std::io::Result<()> {
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    // SAFETY: sync_file_range reads only its integer arguments; the descriptor is borrowed from
    // `file`, open for the whole call.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The I/O scheduling class of a thread (`ioprio_set(2)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoClass {
    /// The default: derived from the thread's nice value.
    Default,
    /// Idle: served only when no one else uses the disk (schedulers that honour classes).
    Idle,
    /// Another class, as the kernel reports it.
    Other(i32),
}

const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_SHIFT: i32 = 13;
const IOPRIO_CLASS_IDLE: i32 = 3;

/// Sets the calling thread's I/O class: [`IoClass::Idle`] or back to [`IoClass::Default`]
/// (an unprivileged thread may do both).
pub fn set_io_class(class: IoClass) -> std::io::Result<()> {
    let prio = match class {
        IoClass::Default => 0,
        IoClass::Idle => IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
        IoClass::Other(_) => return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput)),
    };
    // SAFETY: ioprio_set takes three integers (who: this thread, 0; the priority) and touches no
    // memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, prio) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The I/O class of thread `tid` (of this process or another).
pub fn io_class(tid: i32) -> std::io::Result<IoClass> {
    // SAFETY: ioprio_get takes two integers and returns one; it touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(match i32::try_from(r).unwrap_or(0) >> IOPRIO_CLASS_SHIFT {
        IOPRIO_CLASS_IDLE => IoClass::Idle,
        0 => IoClass::Default,
        c => IoClass::Other(c),
    })
}

/// The calling thread's id.
pub fn thread_id() -> i32 {
    nix::unistd::gettid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_columns_of_proc_stat_are_read_for_the_allowed_cpus() {
        let stat = "cpu  100 0 50 1000 20 0 0 0 0 0\ncpu0 50 0 25 500 10 0 0 0 0 0\ncpu1 50 0 25 300 5 0 0 0 0 0\nintr 1 2\n";
        let ms = Duration::from_millis;
        assert_eq!(node_idle_of(stat, 100, |_| true), Some(ms(8_150)));
        assert_eq!(node_idle_of(stat, 100, |c| c == 1), Some(ms(3_050)));
        assert_eq!(node_idle_of(stat, 100, |_| false), None, "no CPU allowed");
        assert_eq!(node_idle_of("cpu  1 2 3 4\n", 100, |_| true), None);
        assert_eq!(node_idle_of("cpu0 1 x 3 4 5\n", 100, |_| true), None);
        assert!(node_idle().is_some(), "this machine has /proc/stat");
    }

    #[test]
    fn a_thread_cpu_time_grows_with_work() {
        let before = thread_cpu();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() > before);
    }

    #[test]
    fn a_thread_sets_its_io_class_to_idle_and_back() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, wait) = std::sync::mpsc::channel::<IoClass>();
        let t = std::thread::spawn(move || {
            tx.send(thread_id()).unwrap();
            while let Ok(c) = wait.recv() {
                tx.send(i32::from(set_io_class(c).is_ok())).unwrap();
            }
        });
        let tid = rx.recv().unwrap();
        go.send(IoClass::Idle).unwrap();
        if rx.recv().unwrap() == 0 {
            assert!(
                std::env::var_os("DRUN_REQUIRE_IOPRIO").is_none(),
                "ioprio_set refused"
            );
            eprintln!(
                "skipped: this kernel refuses ioprio_set (DRUN_REQUIRE_IOPRIO=1 requires it)"
            );
            return;
        }
        // Read from another thread: the class is the thread's own, as the kernel holds it.
        assert_eq!(io_class(tid).unwrap(), IoClass::Idle);
        assert_ne!(
            io_class(thread_id()).unwrap(),
            IoClass::Idle,
            "only that thread"
        );
        go.send(IoClass::Default).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
        assert_ne!(io_class(tid).unwrap(), IoClass::Idle);
        drop(go);
        t.join().unwrap();
    }

    #[test]
    fn a_range_is_written_back() {
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(d.path().join("f")).unwrap();
        std::io::Write::write_all(&mut &f, &[1u8; 1 << 16]).unwrap();
        write_back(&f, 0, 1 << 15, false).unwrap();
        write_back(&f, 0, 1 << 16, true).unwrap();
    }
}
