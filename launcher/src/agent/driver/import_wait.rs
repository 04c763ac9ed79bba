//! A node's first join waits for its warm interpreters' `import torch`
//! ([`crate::warm::decide::first_join`]): it joins ready to train, so a newcomer does not stop
//! a running world for the length of its own import.

use std::time::Duration;

use drun_rendezvous::session::Request;
use drun_rendezvous::Join;

use super::World;
use crate::agent::Agent;
use crate::rdzv::Link;
use crate::warm::decide::first_join;

impl Agent {
    /// Whether the first join (`after` 0) must wait for the import; if so it is held in `w`.
    pub(super) fn hold_first_join(&self, cand: &Join, after: u64, w: &mut World) -> bool {
        if after != 0 {
            return false;
        }
        match self.first_join_verdict() {
            Ok(_) => false,
            Err(why) => {
                tracing::debug!("{why}");
                w.held_join = Some((cand.clone(), after));
                true
            }
        }
    }

    /// Sends the held first join once the rule lets it go (at each monitor tick).
    pub(super) fn release_first_join(&self, w: &mut World, link: &Link) {
        if w.held_join.is_none() {
            return;
        }
        let Ok(why) = self.first_join_verdict() else {
            return;
        };
        tracing::debug!("{why}: joining");
        let (cand, after) = w.held_join.take().expect("checked above");
        if let Some(m) = &self.metrics {
            m.joining();
        }
        let _ = link.tx.send(Request::Join(cand, after));
    }

    fn first_join_verdict(&self) -> Result<&'static str, &'static str> {
        let (importing, since) = self
            .warm
            .lock()
            .expect("warm pool mutex poisoned")
            .importing();
        first_join(importing, since.map_or(Duration::ZERO, |s| s.elapsed()))
    }
}
