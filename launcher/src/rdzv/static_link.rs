//! `--rdzv-backend static`: no rendezvous, as in torchrun's static backend.
//!
//! The plan follows from the flags alone: `--nnodes N` nodes of `--nproc-per-node` workers each
//! (homogeneous, as the static backend assumes), this node at `--node-rank`, MASTER_ADDR and
//! MASTER_PORT from `--master-addr`/`--master-port`. Worker restarts are decided locally against
//! `--max-restarts` (other nodes learn of a failure only through their collectives, as with
//! torchrun's static backend); a successful local group ends the run.

use drun_rendezvous::round::Restarts;
use drun_rendezvous::session::{Event, Request, RunEnd, SessionConfig};
use drun_rendezvous::{Member, Plan};
use tokio::sync::mpsc;

use crate::{LaunchConfig, RendezvousMode};

/// Starts the static "session".
pub fn spawn(
    cfg: &LaunchConfig,
    session: SessionConfig,
) -> (
    mpsc::UnboundedSender<Request>,
    mpsc::UnboundedReceiver<Event>,
) {
    let RendezvousMode::Static {
        node_rank,
        master_addr,
        master_port,
    } = cfg.rdzv.mode.clone()
    else {
        unreachable!("static_link::spawn is only called for the static backend")
    };
    let nnodes = cfg.rdzv.max_nodes;
    let slots = cfg.workers.nproc_per_node;
    let (req_tx, mut req_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut restarts = Restarts::default();
        let mut generation = 0;
        while let Some(req) = req_rx.recv().await {
            let ev = match req {
                Request::Join(..) => {
                    // The master's name (TrainJob: `<job>-node-0-0.<job>`) appears in DNS once
                    // that pod runs; resolved afresh at every round (a recreated pod moves).
                    let target = format!("{master_addr}:{master_port}");
                    if let Err(why) =
                        crate::dns::wait(&target, session.round.join_timeout, "master").await
                    {
                        let _ = ev_tx.send(Event::Error(why.to_string()));
                        return;
                    }
                    generation += 1;
                    let members = (0..nnodes)
                        .map(|r| Member {
                            node_id: if r == node_rank {
                                session.node_id.clone()
                            } else {
                                format!("static-node-{r}")
                            },
                            advertise_addr: if r == 0 {
                                master_addr.clone()
                            } else {
                                String::new()
                            },
                            node_rank: r,
                            slots,
                            base_rank: r * slots,
                            probe_port: 0,
                        })
                        .collect();
                    Event::Formed(Plan {
                        run_id: session.run_id.clone(),
                        generation,
                        members,
                        world_size: nnodes * slots,
                        master_addr: master_addr.clone(),
                        master_port,
                        restarts_failures: restarts.failures,
                        restarts_membership: 0,
                        resume: None,
                        resume_memory: None,
                        notes: vec![],
                        formed_because: String::new(),
                        node_count: 0,
                    })
                }
                Request::Failed {
                    generation,
                    description,
                    ..
                } => {
                    let restart = restarts.failures < session.max_restarts;
                    restarts
                        .history
                        .push(format!("generation {generation}: {description}"));
                    if restart {
                        restarts.failures += 1;
                    }
                    tracing::debug!(%description, restart, "static backend: local restart decision");
                    Event::FailureDecision {
                        restart,
                        restarts: restarts.clone(),
                        cause: None,
                    }
                }
                Request::Succeeded(g) => Event::Finished(RunEnd {
                    success: true,
                    reason: format!("local workers of generation {g} succeeded"),
                    at_ms: 0,
                    root_cause: None,
                    retryable: false,
                    unfit: false,
                }),
                Request::KeepAlive
                | Request::MarkBad { .. }
                | Request::Preempt { .. }
                | Request::Report { .. }
                | Request::StandBy(_)
                // The other nodes of a static rendezvous are not told: each runs its own checks.
                | Request::Unfit { .. } => continue,
                Request::Commit { commit, .. } => Event::Committed {
                    generation: commit.generation,
                    step: commit.step,
                    result: Err(drun_rendezvous::CommitRefused::NoLedger),
                },
                Request::Leave => return,
            };
            if ev_tx.send(ev).is_err() {
                return;
            }
        }
    });
    (req_tx, ev_rx)
}
