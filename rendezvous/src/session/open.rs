//! Opening a session: a reconnecting agent's lease, generation or pending join taken over, a
//! fence when its lease is gone, or a fresh lease. What it found goes to the step as
//! [`Input::Leased`](super::state::Input::Leased) and [`Input::Opened`](super::state::Input::Opened).

use super::actor::Actor;
use super::protocol::{Event, Resume};
use super::state::{LeaseChange, Opened, Phase};
use crate::RendezvousError;

impl Actor {
    /// The first phase: a reconnecting agent's state taken over, or a fresh lease (the lease
    /// goes to the step as [`Input::Leased`], the phase as [`Input::Opened`]).
    pub(super) async fn open(&mut self, resume: Option<Resume>) -> Result<Opened, RendezvousError> {
        let mut last_gen = self.state.last_gen;
        let phase = match resume {
            Some(r) if self.round.state().keep_alive(r.lease).await.is_ok() => {
                // The node's membership (re-entering its generation) or its join (admitted
                // while away, or waiting on) is written again below under the resumed lease:
                // a lease adopted from another replica brings neither along
                // (`store/shared_lease.rs`, `keys::rewritten_on_resume`).
                self.lease_changed(LeaseChange::Granted(r.lease));
                self.start_keeper(r.lease);
                self.claim(r.lease).await?;
                self.emit(Event::Opened { lease: r.lease });
                if r.generation > 0 {
                    match self.round.plan(r.generation).await? {
                        Some(plan) => {
                            last_gen = r.generation;
                            self.running(plan, None, &mut false).await?
                        }
                        None => Phase::Idle,
                    }
                } else if let Some(c) = r.waiting {
                    match self.admitted_while_away().await? {
                        Some(plan) => {
                            last_gen = plan.generation;
                            self.running(plan, None, &mut true).await?
                        }
                        None => self.join(c).await?,
                    }
                } else {
                    Phase::Idle
                }
            }
            Some(r) => {
                // The next world must be newer than the one this node was fenced from.
                last_gen = last_gen.max(r.generation);
                // A store that no longer holds the generation this node ran in has lost the
                // run's state (a restarted server on the memory store keeps none): that, not
                // an expiry, is why the lease is unknown.
                let (current, _) = self.round.current_generation().await?;
                let why = if current < r.generation {
                    format!(
                        "the rendezvous store ({}) no longer holds this run's generation {} (a restarted server on the memory store keeps no state), so lease {:#x} is gone",
                        self.store.name(),
                        r.generation,
                        r.lease
                    )
                } else {
                    format!("lease {:#x} expired while reconnecting", r.lease)
                };
                self.emit(Event::Fenced(why.clone()));
                Phase::Fenced { reason: why }
            }
            None => {
                if let Some(end) = self.finished().await? {
                    self.emit(Event::Finished(end));
                    return Ok(Opened {
                        phase: None,
                        last_gen,
                    });
                }
                self.ensure_lease().await?;
                Phase::Idle
            }
        };
        Ok(Opened {
            phase: Some(phase),
            last_gen,
        })
    }
}
