//! The step beacons: hangs (`--hang-timeout`), stragglers and the node's pace
//! (`--straggler-factor`).

use std::collections::BTreeMap;

use drun_rendezvous::store::reports::ReportKind;

#[allow(unused_imports)]
use super::*;
use crate::agent::hang::Timeout;
use crate::agent::straggler;

const HANG: Duration = Duration::from_secs(5);

fn watching() -> T {
    let mut p = params();
    p.hang_timeout = Some(Timeout::Fixed(HANG));
    T::running_with(1, 2, p)
}

fn pacing(nodes: u32) -> T {
    let mut p = params();
    p.straggler_factor = 1.5;
    T::running_with(1, nodes, p)
}

fn beacon(t: &mut T, rank: u32, step: u64) -> Vec<Effect> {
    t.feed(Input::Beacon { rank, step })
}

/// Local rank 0 steps `n` times, `every` apart (from step `from`); every effect.
fn steps(t: &mut T, from: u64, n: u64, every: Duration) -> Vec<Effect> {
    let mut fx = Vec::new();
    for step in from..from + n {
        t.now += every;
        fx.extend(beacon(t, 0, step));
    }
    fx
}

#[test]
fn a_rank_silent_for_the_hang_timeout_has_its_stacks_dumped_then_fails_the_group() {
    let mut t = watching();
    beacon(&mut t, 0, 3);
    beacon(&mut t, 1, 3);
    t.now += Duration::from_secs(3);
    beacon(&mut t, 0, 40);
    // Rank 1 silent for over half the timeout, in a generation of 2 nodes: the flight
    // recorders are dumped ahead, once.
    assert_eq!(t.feed(Input::HangCheck), vec![Effect::FlightSnapshot]);
    assert!(t.feed(Input::HangCheck).is_empty());
    t.now += HANG - Duration::from_secs(3);
    let line =
        "hang: rank 1 on node n0 made no progress for 5.0 s (last step 3); rank 0 was at step 40";
    assert_eq!(
        t.feed(Input::HangCheck),
        vec![
            Effect::Log(
                Level::Error,
                Some(1),
                format!("{line}; dumping the stacks of the stuck ranks")
            ),
            Effect::DumpStacks {
                ranks: vec![1],
                line: line.into()
            },
        ]
    );
    // Judged once: the dump's answer stops the group; the check says nothing more.
    assert!(matches!(t.phase(), Phase::Running { .. }));
    assert!(t.feed(Input::HangCheck).is_empty());
    assert_eq!(
        t.feed(Input::Hung(line.into())),
        vec![Effect::Stop(Signal::SIGTERM)]
    );
    assert_eq!(
        t.workers_gone(None),
        vec![Effect::Send(Request::Failed {
            generation: 1,
            description: line.into(),
            cause: None,
        })]
    );
}

#[test]
fn a_group_stopped_in_a_silence_before_its_verdict_reports_the_flight_snapshot() {
    // Another node judged the hang first and stopped its ranks: this node's rank fails as the
    // collective it waited in breaks, before this node's verdict.
    let mut t = watching();
    beacon(&mut t, 0, 19);
    beacon(&mut t, 1, 19);
    t.now += HANG / 2;
    assert_eq!(t.feed(Input::HangCheck), vec![Effect::FlightSnapshot]);
    t.now += Duration::from_secs(1);
    assert_eq!(
        t.feed(Input::Workers(Workers {
            failed: true,
            ..Workers::default()
        })),
        vec![Effect::Stop(Signal::SIGTERM), Effect::ReportFlightSnapshot]
    );

    // The silence ended before the failure: the snapshot is of nothing that goes on.
    let mut t = watching();
    beacon(&mut t, 0, 19);
    beacon(&mut t, 1, 19);
    t.now += HANG / 2;
    assert_eq!(t.feed(Input::HangCheck), vec![Effect::FlightSnapshot]);
    t.now += Duration::from_secs(1);
    beacon(&mut t, 0, 20);
    beacon(&mut t, 1, 20);
    assert_eq!(
        t.feed(Input::Workers(Workers {
            failed: true,
            ..Workers::default()
        })),
        vec![Effect::Stop(Signal::SIGTERM)]
    );

    // One node: its own verdict stops its ranks, and its dumps are whole; no snapshot.
    let mut p = params();
    p.hang_timeout = Some(Timeout::Fixed(HANG));
    let mut t = T::running_with(1, 1, p);
    beacon(&mut t, 0, 19);
    t.now += HANG - Duration::from_millis(1);
    assert!(t.feed(Input::HangCheck).is_empty());
}

#[test]
fn a_rank_whose_worker_exited_0_is_not_judged_for_a_hang() {
    let mut t = watching();
    beacon(&mut t, 0, 40);
    beacon(&mut t, 1, 19);
    // Rank 0 finished its steps and exited 0 while rank 1 runs on.
    t.feed(Input::Workers(Workers {
        running: true,
        first_success: Some((t.now, "ranks [0] exited 0".into())),
        finished: vec![0],
        ..Workers::default()
    }));
    t.now += HANG - Duration::from_secs(1);
    beacon(&mut t, 1, 20);
    t.now += Duration::from_secs(1);
    assert!(
        t.feed(Input::HangCheck).is_empty(),
        "a finished rank's silence is no hang"
    );
    t.now += HANG - Duration::from_secs(1);
    let fx = t.feed(Input::HangCheck);
    assert!(
        matches!(&fx[1], Effect::DumpStacks { ranks, line }
            if ranks == &vec![1] && line == "hang: rank 1 on node n0 made no progress for 5.0 s (last step 20)"),
        "{fx:?}"
    );
}

#[test]
fn beacons_are_judged_only_with_a_hang_timeout_and_while_the_workers_run() {
    let mut t = T::running(1, 2);
    beacon(&mut t, 0, 1);
    t.now += Duration::from_secs(3600);
    assert!(t.feed(Input::HangCheck).is_empty(), "no --hang-timeout");

    // Not running yet: nothing to judge, whatever the time.
    let mut t = T::new();
    t.p.hang_timeout = Some(Timeout::Fixed(HANG));
    t.ev(Event::Formed(plan(1, 2, 0)));
    beacon(&mut t, 0, 1);
    t.now += Duration::from_secs(3600);
    assert!(t.feed(Input::HangCheck).is_empty());

    // A new generation's ranks start afresh.
    let mut t = watching();
    beacon(&mut t, 0, 1);
    t.now += HANG / 2;
    t.ev(Event::Reform {
        generation: 1,
        reason: "node n2 joined".into(),
    });
    t.workers_gone(None);
    t.ev(Event::Formed(plan(2, 3, 0)));
    t.feed(Input::Verified(Checked::Use(None)));
    t.feed(Input::Spawned);
    t.now += HANG;
    assert!(t.feed(Input::HangCheck).is_empty());
}

#[test]
fn the_node_pace_is_reported_once_its_ranks_have_a_median_and_the_job_pace_flags_a_lone_rank() {
    let every = Duration::from_millis(300);
    let mut t = pacing(2);
    assert!(t.feed(Input::PaceDue).is_empty(), "no step time yet");
    // Alone, local rank 0 has nothing to lag behind.
    assert!(steps(&mut t, 0, 40, every).is_empty());
    let fx = t.feed(Input::PaceDue);
    let [Effect::Send(Request::Report { kind, json })] = &fx[..] else {
        panic!("{fx:?}")
    };
    assert_eq!(*kind, ReportKind::Pace);
    let json: serde_json::Value = serde_json::from_str(json).expect("json");
    assert_eq!(json["generation"], 1);
    let median = json["ranks"]["0"].as_f64().expect("rank 0's median");
    assert!((median - 0.3).abs() < 1e-9, "{json}");

    // The other node's ranks take 0.1 s per step: rank 0 is a straggler, said once.
    assert!(t
        .ev(Event::Pace(BTreeMap::from([(2, 0.1), (3, 0.1)])))
        .is_empty());
    let fx = steps(&mut t, 40, 60, every);
    assert_eq!(fx.len(), 1, "{fx:?}");
    let Effect::Straggler { event, stragglers } = &fx[0] else {
        panic!("{fx:?}")
    };
    assert!(
        matches!(event, straggler::Event::Started { rank: 0, median, .. } if (median - 0.1).abs() < 1e-9),
        "{event:?}"
    );
    assert_eq!(stragglers.len(), 1);
    assert_eq!(stragglers[0].0, 0);
}

#[test]
fn the_pace_waits_for_a_running_multi_node_group_with_straggler_detection() {
    let every = Duration::from_millis(300);
    // One node: nobody to compare with.
    let mut t = pacing(1);
    steps(&mut t, 0, 40, every);
    assert!(t.feed(Input::PaceDue).is_empty());
    // No --straggler-factor.
    let mut t = T::running(1, 2);
    steps(&mut t, 0, 40, every);
    assert!(t.feed(Input::PaceDue).is_empty());
    // Stopping: neither reported nor taken.
    let mut t = pacing(2);
    steps(&mut t, 0, 40, every);
    t.feed(Input::Workers(failed()));
    assert!(matches!(t.phase(), Phase::Stopping(_)));
    assert!(t.feed(Input::PaceDue).is_empty());
    assert!(t.ev(Event::Pace(BTreeMap::from([(2, 0.1)]))).is_empty());
    assert!(beacon(&mut t, 0, 41).is_empty());
}
