//! The session of one node in one run: the state machine between an agent and the store.
//!
//! # Theory of operation
//!
//! [`spawn_session`] starts an actor that owns the node's lease and speaks in [`Request`]s
//! (from the agent) and [`Event`]s (to the agent). The same actor runs inside the agent when the
//! agent talks to the store directly (embedded in-memory store, `--rdzv-backend etcd`), and inside
//! a `drun-rendezvous` replica for each connected agent (then the agent's keep-alive messages, not
//! a timer, renew the lease, so a dead agent's lease really expires).
//!
//! * **Join** writes `waiting/<node>` under the lease and runs [`Round::wait_for_plan`]; when the
//!   group forms the node's `members/<g>/<node>` key is written and [`Event::Formed`] sent. A
//!   round that fails (join timeout, a set that cannot form) is published by its decider, so
//!   every session waiting in it sends the same [`Event::Error`] line.
//! * While generation `g` runs, a prefix watch looks for what ends it: `gen/<g>/closed` (someone
//!   asked for a re-form), a member key of `g` deleted (a node left or its lease expired), a new
//!   node waiting while the group is below MAX (scale-up), or `finished`. Whoever sees a cause
//!   first closes `g` in a transaction guarded by `gen/current == g`, so all members receive the
//!   same [`Event::Reform`].
//! * **Succeeded** records `done/<g>/<node>`; when every member of `g` has, `finished` is
//!   written once and every session reports [`Event::Finished`] (the exit barrier).
//! * **Failed** spends one unit of the job-wide `--max-restarts` budget in a transaction and
//!   closes `g`, or, with the budget spent, ends the run as failed.
//! * A lost lease (expired or revoked) is [`Event::Fenced`]: the node is no longer a member and
//!   must stop its workers; its next Join starts over with a new lease.
//!
//! Layout: [`protocol`](self) types here; `state.rs` (the phase, the lease and the last
//! generation, the inputs and effects), `step.rs` (the pure transitions over every input),
//! `actor.rs` (the driver: the one `select!` loop that executes the step's effects),
//! `open.rs` (opening: a reconnecting agent taken over, or a fresh lease),
//! `requests.rs` (the store work of the agent's requests),
//! `generation.rs` (the pure generation core: every decision of a running generation),
//! `running.rs` (entering and watching a generation), `writes.rs` (guarded store writes),
//! `membership.rs` (node loss), `keeper.rs` (the lease keeper).

mod actor;
#[cfg(test)]
mod attribution_tests;
#[cfg(test)]
mod door_tests;
#[cfg(test)]
mod enter_tests;
mod generation;
pub mod hold;
mod interval;
mod keeper;
mod liveness;
mod membership;
mod open;
#[cfg(test)]
mod outage_tests;
mod protocol;
mod requests;
#[cfg(test)]
mod resume_tests;
mod running;
mod save_clock;
mod silence;
#[cfg(test)]
mod silence_tests;
pub mod split;
pub mod standby;
#[cfg(test)]
mod standby_tests;
mod state;
mod step;
#[cfg(test)]
mod test_support;
mod verdicts;
mod watch;
mod writes;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::clock::now_ms;
use crate::store::Store;
use actor::Actor;

pub use protocol::{
    CommitRefused, Emit, Event, Request, Resume, RunEnd, SaveRequest, SessionConfig,
};

/// Starts a session actor; it ends when the request sender is dropped or after `Leave`.
pub fn spawn_session(
    store: Arc<dyn Store>,
    cfg: SessionConfig,
    resume: Option<Resume>,
) -> (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
) {
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let emit: Emit = Arc::new(move |ev| {
        let _ = ev_tx.send(ev);
    });
    let requests = spawn_server_session(store, cfg, resume, None, emit, || {});
    let (req_tx, mut outer_rx) = mpsc::unbounded_channel();
    // Notes when the agent was last heard from, even while the actor is busy with the store.
    tokio::spawn(async move {
        while let Some(r) = outer_rx.recv().await {
            if requests.send(r).is_err() {
                return;
            }
        }
    });
    (req_tx, ev_rx)
}

/// The sending side of a session's requests: each send notes when the agent was last heard
/// from (the session's clock, and the run's when it has one), even while the actor is busy
/// with the store. A server-side session keeps the lease alive only for an agent that still
/// talks.
pub struct Requests {
    /// Boxed: a channel holds room for 32 of its items from the start, and a server holds a
    /// session per agent.
    tx: mpsc::UnboundedSender<Box<Request>>,
    heard: Arc<AtomicU64>,
    run_heard: Option<Arc<AtomicU64>>,
}

impl Requests {
    /// Hands `request` to the session; an error when it has ended.
    pub fn send(&self, request: Request) -> Result<(), mpsc::error::SendError<Box<Request>>> {
        let now = now_ms();
        self.heard.store(now, Ordering::SeqCst);
        if let Some(run) = &self.run_heard {
            run.fetch_max(now, Ordering::SeqCst);
        }
        self.tx.send(Box::new(request))
    }
}

/// Calls its function when dropped: the session's end, however its task ends.
struct OnEnd<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnEnd<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// [`spawn_session`] for a server, with the clock of when any agent of the run was last heard
/// on this server (`run_heard`, ms since the epoch; shared by the run's sessions): it keeps the
/// leases of a run it hears nobody of ([`hold`]). The session's events go to `emit` as they
/// happen, and `ended` is called once when the session ends; the server's stream reader sends
/// through [`Requests`] itself: no task or channel between the stream and the actor.
pub fn spawn_server_session(
    store: Arc<dyn Store>,
    cfg: SessionConfig,
    resume: Option<Resume>,
    run_heard: Option<Arc<AtomicU64>>,
    emit: Emit,
    ended: impl FnOnce() + Send + 'static,
) -> Requests {
    let (tx, req_rx) = mpsc::unbounded_channel();
    let heard = Arc::new(AtomicU64::new(now_ms()));
    let requests = Requests {
        tx,
        heard: heard.clone(),
        run_heard: run_heard.clone(),
    };
    // The caller's span (an agent's `node=...`) stays on the session's lines.
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        let _end = OnEnd(Some(ended));
        let mut actor = Actor::new(store, cfg, emit, heard, run_heard);
        if let Err(e) = actor.run(resume, req_rx).await {
            actor.emit(Event::Error(e.to_string()));
        }
        actor.stop_keeper();
    }));
    requests
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::MemoryStore;

    fn cfg(i: usize, n: usize) -> SessionConfig {
        test_support::config("many", &format!("node{i:04}"), n, n)
    }

    #[tokio::test]
    async fn many_sessions_form_one_group() {
        let n = 64;
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let mut links: Vec<_> = (0..n)
            .map(|i| spawn_session(store.clone(), cfg(i, n), None))
            .collect();
        for (i, (tx, _)) in links.iter().enumerate() {
            tx.send(Request::Join(
                test_support::join(&format!("node{i:04}"), 2),
                0,
            ))
            .unwrap();
        }
        let mut plans = Vec::new();
        for (_, rx) in links.iter_mut() {
            let plan = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    match rx.recv().await.unwrap() {
                        Event::Formed(p) => return p,
                        Event::Error(e) => panic!("{e}"),
                        _ => {}
                    }
                }
            })
            .await
            .expect("formed in time");
            plans.push(plan);
        }
        assert!(plans.windows(2).all(|w| w[0] == w[1]), "one identical plan");
        assert_eq!(plans[0].world_size, 2 * n as u32);
    }
}
