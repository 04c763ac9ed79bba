//! The node's GPUs are checked before it joins ([`crate::gpu_health`]): the join waits for a
//! probe when the gate asks for one, and is held while a GPU fails (the node stands by and is
//! probed again every `--gpu-health`); in a run of a fixed size a failing GPU ends the agent
//! (exit 6). Probes run on a blocking thread, off the loop.

use drun_rendezvous::Join;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::agent::Agent;
use crate::gpu_health::{gate, judge, probe, Cadence, Checks, Gate, Probe, Rules, Verdict};
use crate::rdzv::Link;
use crate::LaunchError;

/// The checks of this node's GPUs (`None` in [`World`]: off, or no NVIDIA GPU).
pub(super) struct Gpus {
    checks: Checks,
    cadence: Cadence,
    rules: Rules,
    /// `CUDA_VISIBLE_DEVICES` as the workers get it.
    visible: Option<String>,
    /// GPUs the node asked for, one per local rank (`--numa-binding`, `--virtual-local-rank`).
    expected: Option<usize>,
    /// The run's size is fixed: a failing GPU ends the agent instead of standing by.
    fixed: bool,
    probe: Option<JoinHandle<Probe>>,
    /// A join held for a probe or while a GPU fails.
    held: Option<(Join, u64)>,
    /// The probe under way started while this node's workers ran (their own GPU memory is then
    /// no other process's).
    probed_while_training: bool,
    /// The last verdict said, so that a repeated one is not said again.
    said: Option<Verdict>,
}

/// What woke the GPU checks.
pub(super) enum GpuEvent {
    /// A probe ended.
    Probed(Probe),
    /// The next probe is due.
    Due,
}

/// The next GPU event, or never (no checks).
pub(super) async fn next(g: &mut Option<Gpus>) -> GpuEvent {
    let Some(g) = g.as_mut() else {
        return std::future::pending().await;
    };
    if let Some(h) = g.probe.as_mut() {
        let p = h.await.unwrap_or_else(|e| Probe {
            failed: Some(format!("the GPU probe ended abnormally: {e}")),
            ..Probe::default()
        });
        g.probe = None;
        return GpuEvent::Probed(p);
    }
    let standing_by = g.held.is_some();
    match gate::next_probe(&g.checks, standing_by, &g.cadence) {
        Some(at) => {
            tokio::time::sleep_until(at).await;
            GpuEvent::Due
        }
        None => std::future::pending().await,
    }
}

impl Gpus {
    /// A worker of this node failed: its GPUs are suspect until the next probe, which starts
    /// now, while the group stops, so that the re-form's join seldom waits for it.
    pub(super) fn suspect(&mut self, training: bool) {
        if self.checks.suspect {
            return;
        }
        self.checks.suspect = true;
        if let Some(h) = self.probe.take() {
            // Under way since before the failure: its verdict does not clear the suspicion.
            h.abort();
        }
        self.start_probe(training);
    }

    /// Starts a probe unless one is under way (`training`: the node's workers run).
    fn start_probe(&mut self, training: bool) {
        if self.probe.is_none() {
            self.checks.probing = true;
            self.probed_while_training = training;
            self.probe = Some(tokio::task::spawn_blocking(probe::probe));
        }
    }
}

impl Agent {
    /// The checks, with their first probe started; `None` when `--gpu-health off` or the node
    /// has no NVIDIA GPU (said in one line).
    pub(super) fn gpu_checks(&self) -> Option<Gpus> {
        let every = self.cfg.observe.gpu_health?;
        if !probe::has_nvidia() {
            tracing::info!("no NVIDIA GPU on this node: the GPU health check is skipped");
            return None;
        }
        let one_per_rank = self.cfg.workers.numa.is_some() || self.cfg.workers.virtual_local_rank;
        let mut g = Gpus {
            checks: Checks::default(),
            cadence: Cadence {
                training: every,
                standing_by: every,
                fresh_for: every * 3,
            },
            rules: Rules::default(),
            visible: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            expected: one_per_rank.then_some(self.cfg.workers.nproc_per_node as usize),
            fixed: self.cfg.rdzv.min_nodes == self.cfg.rdzv.max_nodes,
            probe: None,
            held: None,
            probed_while_training: false,
            said: None,
        };
        g.start_probe(false);
        Some(g)
    }

    /// Whether the join must wait for the GPUs; if so it is held in `g`. A failing GPU in a run
    /// of a fixed size ends the agent.
    pub(super) fn gpu_holds_join(
        &self,
        cand: &Join,
        after: u64,
        g: &mut Option<Gpus>,
        link: &Link,
    ) -> Result<bool, LaunchError> {
        let Some(g) = g.as_mut() else {
            return Ok(false);
        };
        match gate::join_gate(&g.checks, Instant::now(), &g.cadence) {
            Gate::Go => Ok(false),
            Gate::Probe(why) => {
                tracing::debug!("the join waits: {why}");
                g.start_probe(false);
                g.held = Some((cand.clone(), after));
                Ok(true)
            }
            Gate::StandBy(f) if g.fixed => Err(self.cannot_join(&f)),
            Gate::StandBy(f) => {
                let list: Vec<String> = f.iter().map(ToString::to_string).collect();
                tracing::warn!(
                    "GPU health: {}: this node stands by and joins once they pass (checked again every {})",
                    list.join("; "),
                    drun_rendezvous::human::duration(g.cadence.standing_by)
                );
                if let Some((_, v)) = &g.checks.last {
                    self.report_gpus(v, true, link);
                }
                g.held = Some((cand.clone(), after));
                Ok(true)
            }
        }
    }

    /// Tells `status` which GPUs fail (none: all pass), whether the node stands by for them.
    fn report_gpus(&self, v: &Verdict, standing_by: bool, link: &Link) {
        let failing: Vec<String> = match v {
            Verdict::Unhealthy(f) => f.iter().map(ToString::to_string).collect(),
            _ => Vec::new(),
        };
        let json = serde_json::json!({
            "host": self.hostname,
            "failing": failing,
            "standing_by": standing_by && !failing.is_empty(),
        });
        let _ = link.tx.send(drun_rendezvous::session::Request::Report {
            kind: drun_rendezvous::store::reports::ReportKind::Gpu,
            json: json.to_string(),
        });
    }

    /// The error that ends the agent of a run of a fixed size when GPUs fail.
    fn cannot_join(&self, f: &[crate::gpu_health::Finding]) -> LaunchError {
        let list: Vec<String> = f.iter().map(ToString::to_string).collect();
        let n = self.cfg.rdzv.max_nodes;
        let fix = if n > 1 {
            "replace the GPU or the node, or give an elastic range (--nnodes MIN:MAX)"
        } else {
            "replace the GPU, or run the job where the GPUs pass (CUDA_VISIBLE_DEVICES can leave this one out)"
        };
        LaunchError::GpuUnhealthy(format!(
            "GPU health: {}; the run's size is fixed ({n} node{}), so it cannot form without node {}: {fix}",
            list.join("; "),
            if n == 1 { "" } else { "s" },
            self.cfg.node_id
        ))
    }

    /// A probe ended, or the next one is due: judge, say what changed, and give back the held
    /// join once it may go. A failing GPU in a run of a fixed size ends the agent.
    pub(super) fn on_gpus(
        &self,
        ev: GpuEvent,
        g: &mut Option<Gpus>,
        training: bool,
        link: &Link,
    ) -> Result<Option<(Join, u64)>, LaunchError> {
        let Some(g) = g.as_mut() else {
            return Ok(None);
        };
        let p = match ev {
            GpuEvent::Due => {
                g.start_probe(training);
                return Ok(None);
            }
            GpuEvent::Probed(mut p) => {
                p.workers_running = g.probed_while_training;
                p
            }
        };
        let verdict = judge::judge(&p, g.visible.as_deref(), g.expected, &g.rules);
        g.checks = Checks {
            last: Some((Instant::now(), verdict.clone())),
            probing: false,
            suspect: false,
        };
        if let Some(m) = &self.metrics {
            m.gpu_unhealthy(match &verdict {
                Verdict::Unhealthy(f) => f.len(),
                _ => 0,
            });
        }
        let standing_by = g.held.is_some();
        if g.said.as_ref() != Some(&verdict) {
            say(
                &verdict,
                g.said.as_ref(),
                standing_by,
                g.fixed,
                g.cadence.standing_by,
            );
            self.report_gpus(&verdict, standing_by, link);
            g.said = Some(verdict.clone());
        }
        if let (Verdict::Unhealthy(f), true) = (&verdict, g.fixed && standing_by) {
            return Err(self.cannot_join(f));
        }
        if gate::join_gate(&g.checks, Instant::now(), &g.cadence) == Gate::Go {
            return Ok(g.held.take());
        }
        Ok(None)
    }
}

/// One line for a verdict that differs from the last one said.
fn say(
    v: &Verdict,
    before: Option<&Verdict>,
    standing_by: bool,
    fixed: bool,
    again: std::time::Duration,
) {
    match v {
        Verdict::Healthy { gpus } => match before {
            Some(Verdict::Unhealthy(_)) => {
                tracing::info!("GPU health: all {gpus} GPU(s) pass now")
            }
            _ => tracing::info!("GPU health: {gpus} GPU(s) pass"),
        },
        Verdict::Unknown(why) => {
            tracing::warn!("GPU health not checked: {why}; the node is not held back for it")
        }
        Verdict::Unhealthy(f) => {
            let list: Vec<String> = f.iter().map(ToString::to_string).collect();
            if fixed && standing_by {
                return; // said by the error that ends the agent
            }
            let what = if standing_by {
                format!(
                    "this node stands by and joins once they pass (checked again every {})",
                    drun_rendezvous::human::duration(again)
                )
            } else {
                "this node trains on in this generation and will not join the next until they pass"
                    .to_string()
            };
            tracing::warn!("GPU health: {}: {what}", list.join("; "));
        }
    }
}
