//! Placing a benchmark's client and server on separate cores of this machine, as they are on
//! separate hosts in a deployment, so that a per-call cost is not mixed with the two competing
//! for the same cores (on a 2-vCPU VM, a process woken on the core the other one holds waits for
//! it, and a vCPU that has halted costs tens of µs to wake).

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPUs this process may run on, in ascending order.
pub fn allowed() -> Vec<usize> {
    let set = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// The allowed CPUs split in two disjoint halves (client, server), the client's half first;
/// `None` on a machine with a single CPU, where nothing can be separated.
pub fn split() -> Option<(Vec<usize>, Vec<usize>)> {
    let all = allowed();
    (all.len() >= 2).then(|| {
        let (client, server) = all.split_at(all.len() / 2);
        (client.to_vec(), server.to_vec())
    })
}

/// Runs `f` on a new thread limited to `cpus` (all allowed CPUs when `None`) and returns its
/// result. Threads and processes that `f` starts inherit the limit: a tokio runtime built in
/// `f` has its workers there, a child spawned in `f` runs there.
pub fn on<T: Send>(cpus: Option<&[usize]>, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(cpus) = cpus {
                let mut set = CpuSet::new();
                for &c in cpus {
                    set.set(c).expect("a CPU index below CpuSet::count()");
                }
                sched_setaffinity(Pid::from_raw(0), &set).expect("sched_setaffinity");
            }
            f()
        })
        .join()
        .expect("the pinned thread panicked")
    })
}
