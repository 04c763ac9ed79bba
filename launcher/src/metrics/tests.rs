//! The agent's metrics as a scrape shows them, driven with synthetic instants.

use std::time::Duration;

use drun_rendezvous::{assign, Candidate, Plan};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::*;

fn plan(g: u64, nodes: usize, failures: u32, membership: u32) -> Plan {
    let c: Vec<Candidate> = (0..nodes)
        .map(|i| Candidate {
            node_id: format!("n{i}"),
            advertise_addr: format!("127.0.0.{}", i + 1),
            slots: 1,
            requested_node_rank: None,
            master_port: 1,
            probe_port: 0,
        })
        .collect();
    assign("r", g, &c, failures, membership).unwrap()
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_node_loss_shows_as_generation_reform_cause_phases_and_step_times() {
    let m = AgentMetrics::new();
    m.joining();
    assert_eq!(value(&m.render(), "drun_waiting"), Some(1.0));
    let t0 = Instant::now();
    let s = |x: f64| t0 + Duration::from_secs_f64(x);
    m.formed(&plan(1, 3, 0, 0), s(0.0));
    m.spawned(None, 0, vec![(0, i32::MAX)], s(1.0));
    for step in 1..=4 {
        m.progress(0, step, Some(32), s(1.0 + 0.5 * step as f64));
    }
    m.sealed("000002-1");
    m.worker_exit(ExitKind::Code(1));
    m.worker_exit(ExitKind::Signal(Signal::SIGKILL));
    let mut clock = RestartClock::detected(s(4.0));
    m.stopping(s(4.0));
    clock.stopped = Some(s(4.5));
    m.reform(
        1,
        "node n2 (127.0.0.3, rank 2) lost: its agent's connection closed",
    );
    clock.formed = Some(s(6.0));
    m.formed(&plan(2, 2, 0, 1), s(6.0));
    m.spawned(Some(&clock), 2, vec![], s(6.1));
    m.progress(0, 3, None, s(7.0));

    let text = m.render();
    let v = |series: &str| value(&text, series).unwrap_or_else(|| panic!("{series}:\n{text}"));
    assert_eq!(v("drun_generation"), 2.0);
    assert_eq!(v("drun_members"), 2.0);
    assert_eq!(v("drun_waiting"), 0.0);
    assert_eq!(v("drun_reforms_total{cause=\"node_lost\"}"), 1.0);
    assert_eq!(v("drun_restarts_total{cause=\"membership\"}"), 1.0);
    assert_eq!(v("drun_restarts_total{cause=\"failure\"}"), 0.0);
    for phase in ["stop", "form", "spawn", "first_progress"] {
        assert_eq!(
            v(&format!(
                "drun_restart_phase_seconds_count{{phase=\"{phase}\"}}"
            )),
            1.0
        );
    }
    assert!((v("drun_restart_phase_seconds_sum{phase=\"form\"}") - 1.5).abs() < 1e-9);
    assert!((v("drun_restart_phase_seconds_sum{phase=\"first_progress\"}") - 0.9).abs() < 1e-6);
    assert_eq!(v("drun_restart_seconds_count"), 1.0);
    // Ranks are cleared at formation: rank 0's step time comes back with its next beacons.
    assert_eq!(value(&text, "drun_rank_step_seconds{rank=\"0\"}"), None);
    assert_eq!(v("drun_rank_steps_total{rank=\"0\"}"), 3.0);
    assert_eq!(v("drun_worker_exits_total{code=\"1\",signal=\"\"}"), 1.0);
    assert_eq!(
        v("drun_worker_exits_total{code=\"\",signal=\"SIGKILL\"}"),
        1.0
    );
    assert_eq!(v("drun_ckpt_seals_total"), 1.0);
    // Step 2 was reached at 2 s, 1 s after the spawn; steps 3 and 4 (2 s until the stop) were lost.
    assert!((v("drun_committed_step_seconds_total") - 1.0).abs() < 1e-6);
    assert!((v("drun_lost_work_seconds_total") - 2.0).abs() < 1e-6);
    assert_eq!(v("drun_lost_work_steps_total"), 2.0);
    assert!(v("drun_goodput_ratio") <= 1.0);
    assert!(
        text.contains("# TYPE drun_restart_phase_seconds histogram"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn step_time_and_samples_per_second_come_from_successive_beacons() {
    let m = AgentMetrics::new();
    let t0 = Instant::now();
    m.formed(&plan(1, 1, 0, 0), t0);
    m.spawned(None, 0, vec![(0, std::process::id() as i32)], t0);
    m.progress(0, 1, Some(64), t0 + Duration::from_secs(1));
    m.progress(0, 3, Some(64), t0 + Duration::from_secs(2));
    let text = m.render();
    assert_eq!(
        value(&text, "drun_rank_step_seconds{rank=\"0\"}"),
        Some(0.5)
    );
    assert_eq!(
        value(&text, "drun_rank_samples_per_second{rank=\"0\"}"),
        Some(128.0)
    );
    assert!(value(&text, "drun_worker_resident_memory_bytes{rank=\"0\"}").unwrap() > 0.0);
    assert!(value(&text, "drun_worker_cpu_seconds_total{rank=\"0\"}").is_some());
    assert_eq!(
        value(&text, "drun_reforms_total{cause=\"node_lost\"}"),
        None
    );
}

#[test]
fn a_straggler_shows_as_1_until_it_clears_and_a_new_generation_forgets_it() {
    use crate::agent::straggler::Event;
    let m = AgentMetrics::new();
    let t0 = Instant::now();
    m.formed(&plan(1, 1, 0, 0), t0);
    let series = "drun_rank_straggler{rank=\"3\"}";
    m.straggler(Event::Started {
        rank: 3,
        step_time: 0.3,
        median: 0.1,
    });
    assert_eq!(value(&m.render(), series), Some(1.0));
    m.straggler(Event::Cleared {
        rank: 3,
        step_time: 0.1,
    });
    assert_eq!(value(&m.render(), series), Some(0.0));
    m.formed(&plan(2, 1, 0, 0), t0);
    assert_eq!(value(&m.render(), series), None);
}

#[test]
fn a_worker_failure_without_a_reason_counts_from_the_budget() {
    let m = AgentMetrics::new();
    let t0 = Instant::now();
    m.formed(&plan(1, 2, 0, 0), t0);
    m.formed(&plan(2, 2, 1, 0), t0);
    let text = m.render();
    assert_eq!(
        value(&text, "drun_reforms_total{cause=\"worker_failure\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "drun_restarts_total{cause=\"failure\"}"),
        Some(1.0)
    );
}

#[test]
fn the_checkpoint_interval_decided_in_this_process_is_exposed() {
    use drun_rendezvous::decisions::ckpt_interval::{decide, IntervalMode, Observed};
    let i = decide(
        IntervalMode::Auto,
        &Observed {
            save_costs_s: vec![0.5],
            persist_costs_s: vec![2.0],
            failures: 2,
            exposure_s: 40.0,
            restart_s: 1.0,
        },
        3600.0,
    )
    .unwrap();
    drun_rendezvous::server::metrics::global().interval("metrics-interval-test", &i);
    let text = AgentMetrics::new().render();
    let series = |name: &str| value(&text, &format!("{name}{{run=\"metrics-interval-test\"}}"));
    assert_eq!(
        series("drun_ckpt_interval_seconds"),
        Some(i.interval_s),
        "{text}"
    );
    assert_eq!(series("drun_ckpt_save_cost_seconds"), Some(0.5));
    assert_eq!(series("drun_ckpt_persist_seconds"), Some(2.0));
    assert_eq!(series("drun_mtbf_seconds"), Some(20.0));
    assert_eq!(
        series("drun_ckpt_expected_loss_seconds"),
        Some(i.expected_loss_s)
    );
}

#[test]
fn replicas_sent_count_up_and_replicas_held_are_a_gauge() {
    let m = AgentMetrics::new();
    m.replicas(1, 4096);
    m.replicas(0, 4096);
    m.replicas(1, 1024);
    let text = m.render();
    assert_eq!(value(&text, "drun_ckpt_replicated_total"), Some(2.0));
    assert_eq!(value(&text, "drun_ckpt_replica_bytes"), Some(1024.0));
}
