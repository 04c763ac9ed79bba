//! The agent's answers to its workers: the worker API requests (resume point, should-save, step
//! beacons, checkpoint commits; a step beacon goes on to the machine, which judges hangs and
//! stragglers), and the reports to the job: a straggler verdict, silent peers.

use drun_rendezvous::session::Request;
use drun_rendezvous::store::reports::ReportKind;
use drun_rendezvous::Plan;
use tokio::time::Instant;

use super::World;
use crate::agent::state::{Input, Machine};
use crate::agent::Agent;
use crate::agent::{hang, preflight, straggler};
use crate::ckpt::api::{refused, ApiRequest};
use crate::ckpt::node::resume_answer;
use crate::rdzv::Link;

impl Agent {
    /// A local rank's straggler verdict changed (`event`; `stragglers`: every local rank
    /// flagged now): the line naming it, the metrics, and the node's report to the job.
    pub(super) fn straggler(
        &self,
        event: straggler::Event,
        stragglers: &[(u32, f64, f64)],
        plan: &Plan,
        link: &Link,
    ) {
        let node = plan.member(&self.cfg.node_id).map_or(0, |m| m.node_rank);
        let line = event.line(node, &self.hostname, self.cfg.observe.straggler_factor);
        tracing::warn!(run = %self.cfg.run_id, gen = plan.generation, "{line}");
        if let Some(m) = &self.metrics {
            m.straggler(event);
        }
        let list: Vec<_> = stragglers
            .iter()
            .map(|(rank, step_time, median)| {
                serde_json::json!({"rank": rank, "step_time": step_time, "median": median})
            })
            .collect();
        let report = serde_json::json!({
            "generation": plan.generation,
            "node_rank": node,
            "host": self.hostname,
            "stragglers": list,
        });
        let _ = link.tx.send(Request::Report {
            kind: ReportKind::Stragglers,
            json: report.to_string(),
        });
    }

    /// Says which peers of the running generation stopped answering the probes, or that all
    /// answer again, once per change, and reports it to the rendezvous (`status` shows the
    /// broken pairs). While some stay silent the report goes again every [`super::REPORT_AGAIN`]: the
    /// node a partition sends away decides for itself when it reports, and the other side's
    /// report may land after its own.
    pub(super) fn check_peers(&self, m: &Machine, w: &mut World, link: &Link) {
        let (Some(probes), Some(plan)) = (self.peers.as_ref(), m.plan()) else {
            return;
        };
        if matches!(m.phase, crate::agent::Phase::Forming { .. }) {
            // The plan is the generation that ended: its members that are gone left it (the
            // session said why), they are not cut off from this node.
            return;
        }
        let health = probes.health();
        if health.generation() != plan.generation {
            return;
        }
        let silent = match health.verdict(tokio::time::Instant::now()) {
            crate::peers::Verdict::Silent(ranks) => ranks,
            _ => Vec::new(),
        };
        let now = tokio::time::Instant::now();
        if silent == w.silent_peers {
            let due = w
                .peers_reported
                .is_none_or(|at| now.duration_since(at) >= super::REPORT_AGAIN);
            if !silent.is_empty() && due {
                self.report_peers(plan, &silent, link);
                w.peers_reported = Some(now);
            }
            return;
        }
        let named: Vec<String> = silent
            .iter()
            .map(|r| match plan.members.iter().find(|m| m.node_rank == *r) {
                Some(m) => format!("node rank {r} ({})", m.advertise_addr),
                None => format!("node rank {r}"),
            })
            .collect();
        if named.is_empty() {
            tracing::info!(
                "every peer of generation {} answers the probes again",
                plan.generation
            );
        } else {
            tracing::warn!(
                "cannot reach {} of generation {}: no answer to the probes for {} (the workers' collectives with it will stall or fail)",
                named.join(", "),
                plan.generation,
                drun_rendezvous::human::duration(crate::peers::QUIET)
            );
        }
        self.report_peers(plan, &silent, link);
        w.peers_reported = Some(now);
        w.silent_peers = silent;
    }

    /// Sends this node's peers report for `plan`'s generation.
    fn report_peers(&self, plan: &drun_rendezvous::Plan, silent: &[u32], link: &Link) {
        let me = plan.member(&self.cfg.node_id).map_or(0, |m| m.node_rank);
        let json = serde_json::json!({
            "generation": plan.generation,
            "node_rank": me,
            "silent": silent,
        });
        let _ = link.tx.send(Request::Report {
            kind: ReportKind::Peers,
            json: json.to_string(),
        });
    }

    /// Answers one worker API request (see [`crate::ckpt::api`]); a step beacon it accepted
    /// goes on to the machine.
    pub(super) fn serve(
        &mut self,
        should_save: bool,
        plan: Option<&Plan>,
        w: &mut World,
        link: &Link,
    ) -> Option<Input> {
        let (req, reply) = w.call.take()?;
        let (Some(ledger), Some(plan)) = (w.ledger.as_mut(), plan) else {
            let _ = reply.send(refused("no worker group is running"));
            return None;
        };
        match req {
            ApiRequest::Resume => {
                let _ = reply.send(resume_answer(plan, w.resume_file.as_deref()));
            }
            ApiRequest::Hello { .. } => {
                // Answered by the socket itself; kept for completeness.
                let _ = reply.send(serde_json::json!({
                    "ok": true, "protocol": crate::ckpt::api::PROTOCOL,
                }));
            }
            ApiRequest::ShouldSave { .. } => {
                let _ = reply.send(serde_json::json!({"ok": true, "save": should_save}));
            }
            ApiRequest::Progress {
                rank,
                step,
                samples,
            } => {
                let mut answer = ledger.progress(rank, step);
                let accepted = answer["ok"] == true;
                if accepted {
                    if let Some(m) = &self.metrics {
                        m.progress(rank, step, samples, Instant::now());
                    }
                    if self.cfg.observe.hang_timeout.is_some() {
                        // The worker registers faulthandler for this signal (its stack dump).
                        answer["hang_dump_signal"] = serde_json::json!(hang::DUMP_SIGNAL as i32);
                        // And listens for the agent's request of its flight-recorder dump.
                        if let Some(api) = &self.api {
                            let p = crate::os::flight_recorder::paths(api.dir(), rank);
                            answer["flight_recorder"] = serde_json::json!({
                                "request": p.request, "dump": p.dump,
                            });
                        }
                    }
                }
                let _ = reply.send(answer);
                // The machine judges it: hangs and stragglers.
                return accepted.then_some(Input::Beacon { rank, step });
            }
            ApiRequest::StageRoom {
                rank,
                generation,
                bytes,
            } => {
                let stage = w
                    .stage
                    .as_mut()
                    .filter(|_| generation == ledger.generation());
                let room = stage.is_none_or(|s| s.room(rank, bytes));
                let answer = serde_json::json!({"ok": true, "stage": room});
                match w.stage.as_ref().and_then(|s| s.room_made()) {
                    Some(made) => {
                        tokio::spawn(async move {
                            made.await;
                            let _ = reply.send(answer);
                        });
                    }
                    None => {
                        let _ = reply.send(answer);
                    }
                }
            }
            ApiRequest::Preflight(outcome) => {
                let report = preflight::reported(
                    &outcome,
                    plan,
                    &self.cfg.node_id,
                    self.cfg.observe.preflight.and_then(|p| p.min_gbps),
                    self.metrics.as_deref(),
                );
                if let Some(report) = report {
                    let _ = link.tx.send(Request::Report {
                        kind: ReportKind::Preflight,
                        json: report.to_string(),
                    });
                }
                let _ = reply.send(serde_json::json!({"ok": true}));
            }
            ApiRequest::Commit {
                rank,
                generation,
                step,
                files,
                cursor,
                save_started_ms,
            } => {
                if let (Some(at), true) = (save_started_ms, generation == ledger.generation()) {
                    ledger.note_save_start(step, at);
                }
                if let Some(batch) = ledger.commit(
                    rank,
                    generation,
                    step,
                    files,
                    cursor.unwrap_or_default(),
                    reply,
                ) {
                    if let Some(m) = &self.metrics {
                        m.committed();
                    }
                    // Staged files: answered now, sent once persisted (`--ckpt-memory`).
                    let batch = match w.stage.as_mut() {
                        Some(stage) => {
                            let batch = stage.complete(batch, ledger);
                            if batch.is_none() {
                                // Staged: status shows it at once.
                                super::stage::report_staging(stage, ledger.generation(), link);
                            }
                            batch
                        }
                        None => Some(batch),
                    };
                    if let Some(batch) = batch {
                        let _ = link.tx.send(Request::Commit {
                            commit: batch,
                            retention: self.cfg.ckpt.retention,
                        });
                    }
                }
            }
        }
        None
    }
}
