//! The agent's own short-lived helper processes (`nvidia-smi` for the GPU health check and the
//! fingerprint, a `--fingerprint-cmd`): children of the agent, but not what the workers left
//! behind, so the sweep after a stop ([`super::Os::descendants`]) spares them. A GPU health
//! check started when a worker fails runs while that worker's group is stopped and swept.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// The pids of the helpers running now.
static RUNNING: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// A running helper, known to the sweep until this is dropped (after the helper was waited for).
#[derive(Debug)]
pub struct Held(i32);

/// Notes helper `pid` as running, until the returned [`Held`] is dropped.
pub fn hold(pid: i32) -> Held {
    RUNNING.lock().expect("helpers mutex poisoned").insert(pid);
    Held(pid)
}

impl Drop for Held {
    fn drop(&mut self) {
        RUNNING
            .lock()
            .expect("helpers mutex poisoned")
            .remove(&self.0);
    }
}

/// Whether `pid` is one of the agent's running helpers.
pub fn is_running(pid: i32) -> bool {
    RUNNING
        .lock()
        .expect("helpers mutex poisoned")
        .contains(&pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_is_known_while_held_and_forgotten_after() {
        let held = hold(i32::MAX - 7);
        assert!(is_running(i32::MAX - 7));
        assert!(!is_running(i32::MAX - 8));
        drop(held);
        assert!(!is_running(i32::MAX - 7));
    }
}
