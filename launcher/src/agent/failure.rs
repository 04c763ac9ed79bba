//! Reporting a worker failure to the rendezvous and acting on the job-wide decision: restart,
//! end, or — when the failure came from a lost node or this node was fenced — re-form without
//! spending the restart budget.

use std::time::Duration;

use drun_rendezvous::session::{Event, Request};
use drun_rendezvous::Plan;
use tokio::time::Instant;

use super::Agent;
use crate::rdzv::Link;
use crate::{AgentExit, LaunchError};

impl Agent {
    /// Reports a failure of generation `g` and waits for the job-wide decision: `Ok((restart,
    /// history))`, or `Err(exit)` when a signal or the end of the session came first.
    pub(super) async fn report_failure(
        &mut self,
        link: &mut Link,
        plan: &Plan,
        description: String,
    ) -> Result<Result<(bool, Vec<String>), AgentExit>, LaunchError> {
        let _ = link.tx.send(Request::Failed {
            generation: plan.generation,
            description: description.clone(),
        });
        // Why the generation closed, if the session says (before or after the decision).
        let mut reform: Option<String> = None;
        loop {
            tokio::select! {
                ev = link.rx.recv() => match ev {
                    Some(Event::FailureDecision { restart, restarts }) => {
                        if restart && restarts.failures <= plan.restarts_failures {
                            // Not the workers' own failure: say what closed the generation.
                            if reform.is_none() {
                                reform = self.reform_reason(link).await;
                            }
                            tracing::warn!(
                                "{description}; re-forming the group: {}; the restart budget is not spent ({}/{} used)",
                                reform.as_deref().unwrap_or("a membership change"),
                                restarts.failures,
                                self.cfg.max_restarts
                            );
                        } else if restart {
                            tracing::warn!(
                                "{description}; restarting the worker group ({}/{} restarts used)",
                                restarts.failures,
                                self.cfg.max_restarts
                            );
                        }
                        return Ok(Ok((restart, restarts.history)));
                    }
                    Some(Event::Reform { reason, .. }) => reform = Some(reason),
                    // Fenced by the rendezvous (this agent was stopped past its lease): the
                    // group went on without this node, so its failure is moot; it joins again
                    // as a newcomer, as after any fence.
                    Some(Event::Fenced(e)) if !e.starts_with(crate::rdzv::grpc::UNREACHABLE) => {
                        tracing::warn!("{description}; fenced while reporting it: {e}; the group went on without this node: joining again");
                        return Ok(Ok((true, Vec::new())));
                    }
                    // The worker failure stays the primary error when the rendezvous is gone;
                    // the rendezvous trouble is appended, and nothing restarts without a
                    // decision.
                    Some(Event::Error(e)) | Some(Event::Fenced(e)) => {
                        self.also.push(format!("could not report the failure to the rendezvous: {e}"));
                        return Ok(Ok((false, Vec::new())));
                    }
                    None => return Ok(Ok((false, Vec::new()))),
                    Some(_) => {}
                },
                sig = self.next_teardown_signal() => return Ok(Err(AgentExit::Signal(sig as i32))),
            }
        }
    }

    /// The reason of the re-form the session announces next (it follows a failure decision
    /// that the loss of a node caused); `None` if none comes within 2 s.
    async fn reform_reason(&mut self, link: &mut Link) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            tokio::select! {
                ev = link.rx.recv() => match ev {
                    Some(Event::Reform { reason, .. }) => return Some(reason),
                    None => return None,
                    Some(_) => {}
                },
                _ = tokio::time::sleep_until(deadline) => return None,
            }
        }
    }

    /// A failure with no worker exit to summarise (a partial success): reports it and returns
    /// `Some(exit)` when the run ends here, `None` when the group restarts.
    pub(super) async fn fail_without_summary(
        &mut self,
        link: &mut Link,
        plan: &Plan,
        description: String,
    ) -> Result<Option<AgentExit>, LaunchError> {
        Ok(
            match self.report_failure(link, plan, description.clone()).await? {
                Ok((true, _)) => None,
                Ok((false, _)) => {
                    crate::say!("drun: {description}");
                    Some(AgentExit::WorkerFailure)
                }
                Err(exit) => Some(exit),
            },
        )
    }
}
