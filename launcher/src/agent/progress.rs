//! The transitions the running workers' step beacons drive, pure like [`super::step()`]: a
//! beacon is noted ([`Progress`]) and may change a rank's straggler verdict; the hang check
//! judges the beacons against `--hang-timeout`; the job's pace joins the straggler median; the
//! node's own pace is reported when due. Outside [`Phase::Running`] nothing happens.

use std::collections::BTreeMap;

use drun_rendezvous::session::Request;
use drun_rendezvous::store::reports::{ReportKind, PACE_MAX_NODES};

use super::hang::Beacons;
use super::moves::Cx;
use super::state::{Effect, Level, Phase, Progress};

/// Local rank `rank` announced `step`: the hang's beacons take it (with `--hang-timeout`), and
/// its step time may change its straggler verdict (said, counted and reported once).
pub(super) fn beacon(mut phase: Phase, rank: u32, step: u64, cx: &mut Cx<'_>) -> Phase {
    if let Phase::Running { progress, .. } = &mut phase {
        if let Some((clock, detector)) = progress.stragglers.as_mut() {
            let event = clock
                .beacon(rank, step, cx.now)
                .and_then(|st| detector.observe(rank, st.seconds, cx.now));
            if let Some(event) = event {
                cx.fx.push(Effect::Straggler {
                    event,
                    stragglers: detector.stragglers(),
                });
            }
        }
        if cx.p.hang_timeout.is_some() {
            progress.beacons.beacon(rank, step, cx.now);
        }
    }
    phase
}

/// The hang check: local ranks silent for `--hang-timeout` are a hang, said with its line and
/// their stacks dumped (answered by [`super::state::Input::Hung`], which stops the group).
/// Judged once per generation: the beacons start afresh with the next spawn. In a generation of
/// several nodes the ranks' flight recorders are dumped ahead, at half the timeout: another
/// node's verdict may stop the collective they wait in before this node's.
pub(super) fn hang_check(mut phase: Phase, cx: &mut Cx<'_>) -> Phase {
    let Some(timeout) = cx.p.hang_timeout else {
        return phase;
    };
    if let Phase::Running { plan, progress, .. } = &mut phase {
        if let Some(hang) = progress.beacons.judge(cx.now, timeout) {
            progress.beacons = Beacons::default();
            let line = hang.line(&cx.p.node_id);
            cx.log(
                Level::Error,
                Some(plan.generation),
                format!("{line}; dumping the stacks of the stuck ranks"),
            );
            cx.fx.push(Effect::DumpStacks {
                ranks: hang.ranks(),
                line,
            });
        } else if plan.node_count() > 1 && progress.beacons.snapshot_due(cx.now, timeout) {
            progress.beacons.snapshot_taken(cx.now);
            cx.fx.push(Effect::FlightSnapshot);
        }
    }
    phase
}

/// The job's pace (rank → median seconds per step, every node's report): the other nodes'
/// ranks join the median this node's ranks are compared with.
pub(super) fn job_pace(mut phase: Phase, pace: BTreeMap<u32, f64>) -> Phase {
    if let Phase::Running {
        progress: Progress {
            stragglers: Some((_, detector)),
            ..
        },
        ..
    } = &mut phase
    {
        detector.set_job_pace(pace);
    }
    phase
}

/// Time to report this node's pace (its ranks' median seconds per step): sent in a run of 2 to
/// [`PACE_MAX_NODES`] nodes once some rank has enough steps; the answer is the job's pace.
pub(super) fn pace_due(phase: Phase, cx: &mut Cx<'_>) -> Phase {
    if let Phase::Running {
        plan,
        progress: Progress {
            stragglers: Some((_, detector)),
            ..
        },
        ..
    } = &phase
    {
        let nodes = plan.node_count() as u32;
        let ranks = detector.medians();
        if (2..=PACE_MAX_NODES).contains(&nodes) && !ranks.is_empty() {
            let json = serde_json::json!({"generation": plan.generation, "ranks": ranks});
            cx.fx.push(Effect::Send(Request::Report {
                kind: ReportKind::Pace,
                json: json.to_string(),
            }));
        }
    }
    phase
}
