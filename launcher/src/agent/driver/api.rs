//! The agent's answers to its workers: the worker API requests (resume point, should-save, step
//! beacons, checkpoint commits) and what the step beacons feed — metrics, the straggler
//! detector and the hang verdict.

use drun_rendezvous::reports::ReportKind;
use drun_rendezvous::session::Request;
use drun_rendezvous::Plan;
use tokio::time::Instant;

use super::World;
use crate::agent::state::{Input, Machine};
use crate::agent::Agent;
use crate::agent::{hang, preflight};
use crate::ckpt::api::{refused, ApiRequest};
use crate::ckpt::node::resume_answer;
use crate::group::WorkerGroup;
use crate::rdzv::Link;

impl Agent {
    /// A hang of local ranks (`--hang-timeout`): their stacks dumped, the input that fails
    /// the group with the hang's line.
    pub(super) async fn hung(&self, w: &mut World) -> Option<Input> {
        let timeout = self.cfg.hang_timeout?;
        let hang = w.beacons.judge(Instant::now(), timeout)?;
        // Judged once per generation: the beacons start afresh with the next spawn.
        w.beacons = hang::Beacons::default();
        let line = hang.line(&self.cfg.node_id);
        tracing::error!(run = %self.cfg.run_id, "{line}; dumping the stacks of the stuck ranks");
        let stuck = hang.ranks();
        let pids: Vec<(u32, i32)> = w
            .group
            .as_ref()
            .map(WorkerGroup::running)
            .unwrap_or_default()
            .into_iter()
            .filter(|(rank, _)| stuck.contains(rank))
            .collect();
        crate::os::stacks::dump(&pids, hang::DUMP_SIGNAL).await;
        Some(Input::Hung(line))
    }

    /// Sends this node's pace (its ranks' median seconds per step) in a run of 2 to
    /// [`drun_rendezvous::reports::PACE_MAX_NODES`] nodes; the answer, the job's pace, feeds
    /// the straggler detector.
    pub(super) fn send_pace(&self, m: &Machine, w: &World, link: &Link) {
        let (Some((_, detector)), Some(plan)) = (w.steps.as_ref(), m.plan()) else {
            return;
        };
        let nodes = plan.node_count() as u32;
        let ranks = detector.medians();
        if !(2..=drun_rendezvous::reports::PACE_MAX_NODES).contains(&nodes) || ranks.is_empty() {
            return;
        }
        let json = serde_json::json!({"generation": plan.generation, "ranks": ranks});
        let _ = link.tx.send(Request::Report {
            kind: ReportKind::Pace,
            json: json.to_string(),
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

    /// Answers one worker API request (see [`crate::ckpt::api`]).
    pub(super) fn serve(
        &mut self,
        should_save: bool,
        plan: Option<&Plan>,
        w: &mut World,
        link: &Link,
    ) {
        let Some((req, reply)) = w.call.take() else {
            return;
        };
        let (Some(ledger), Some(plan)) = (w.ledger.as_mut(), plan) else {
            let _ = reply.send(refused("no worker group is running"));
            return;
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
                if answer["ok"] == true {
                    let now = Instant::now();
                    if let Some(m) = &self.metrics {
                        m.progress(rank, step, samples, now);
                    }
                    if let Some((clock, detector)) = w.steps.as_mut() {
                        let event = clock
                            .beacon(rank, step, now)
                            .and_then(|st| detector.observe(rank, st.seconds, now));
                        if let Some(ev) = event {
                            let node = plan.member(&self.cfg.node_id).map_or(0, |m| m.node_rank);
                            let line = ev.line(node, &self.hostname, self.cfg.straggler_factor);
                            tracing::warn!(run = %self.cfg.run_id, gen = plan.generation, "{line}");
                            if let Some(m) = &self.metrics {
                                m.straggler(ev);
                            }
                            let list: Vec<_> = detector
                                .stragglers()
                                .into_iter()
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
                    }
                }
                if self.cfg.hang_timeout.is_some() && answer["ok"] == true {
                    w.beacons.beacon(rank, step, Instant::now());
                    // The worker registers faulthandler for this signal (its stack dump).
                    answer["hang_dump_signal"] = serde_json::json!(hang::DUMP_SIGNAL as i32);
                }
                let _ = reply.send(answer);
            }
            ApiRequest::Preflight(outcome) => {
                let report = preflight::reported(
                    &outcome,
                    plan,
                    &self.cfg.node_id,
                    self.cfg.preflight.and_then(|p| p.min_gbps),
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
                    let _ = link.tx.send(Request::Commit {
                        commit: batch,
                        retention: self.cfg.ckpt.retention,
                    });
                }
            }
        }
    }
}
