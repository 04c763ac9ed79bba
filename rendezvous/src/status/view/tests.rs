//! Tests of the human view on synthetic statuses.

use super::*;
use crate::decisions::formation::{Formation, LostWork};
use crate::decisions::loss;
use crate::status::{FormationStatus, LatestCheckpoint, NodeFacts, RestartCounts};
use crate::{assign, Candidate};

const NOW: u64 = 1_000_000;

/// `text` with its wrapped lines read as one: every run of whitespace one space.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn status(n: usize) -> RunStatus {
    let cands: Vec<Candidate> = (0..n)
        .map(|i| Candidate {
            node_id: format!("gpu-node-{i:02}.cluster.example"),
            advertise_addr: format!("10.128.{i}.{}", 200 + i),
            slots: 8,
            requested_node_rank: None,
            master_port: 1,
            probe_port: 0,
        })
        .collect();
    let mut plan = assign("job42", 3, &cands, 1, 2).unwrap();
    plan.formed_because = format!("{n} of max {n} nodes joined");
    let present: Vec<String> = cands[1..].iter().map(|c| c.node_id.clone()).collect();
    let mut lost = std::collections::BTreeMap::new();
    lost.insert(
        cands[0].node_id.clone(),
        loss::CONNECTION_CLOSED.to_string(),
    );
    let waiting = vec![("standby-9".to_string(), "10.128.9.209".to_string())];
    let facts = NodeFacts {
        present,
        waiting,
        lost,
        ..Default::default()
    };
    let nodes = crate::status::node_states(Some(&plan), None, &facts);
    RunStatus {
        run: "job42".into(),
        generation: 3,
        plan: Some(plan),
        restarts: RestartCounts {
            failures: 1,
            membership: 2,
        },
        now_ms: NOW,
        formation: Some(FormationStatus {
            record: Formation {
                round_opened_at_ms: NOW - 43_100,
                formed_at_ms: NOW - 41_000,
                lost_work: Some(LostWork {
                    ms: 12_000,
                    resume_step: Some(300),
                }),
                door: None,
            },
            duration_ms: 2_100,
            because: format!("{n} of max {n} nodes joined"),
        }),
        checkpoints: crate::status::Checkpoints {
            latest: Some(LatestCheckpoint {
                step: 400,
                generation: 3,
                world_size: 64,
                bytes: 1_234_567,
                sealed_at_ms: NOW - 5_000,
                ..Default::default()
            }),
            ..Default::default()
        },
        nodes,
        ..Default::default()
    }
}

#[test]
fn eight_nodes_fit_80_columns_and_every_member_is_named_with_its_ranks() {
    let s = status(8);
    let lines = render(&s, 0);
    let text = lines.join("\n");
    for l in &lines {
        assert!(
            l.chars().count() <= WIDTH,
            "{} columns: {l}\n{text}",
            l.chars().count()
        );
    }
    for (i, m) in s.plan.as_ref().unwrap().members.iter().enumerate() {
        let row = lines
            .iter()
            .find(|l| l.starts_with(&m.node_id))
            .unwrap_or_else(|| panic!("no row for {}:\n{text}", m.node_id));
        let ranks = format!("{}-{}", 8 * i, 8 * i + 7);
        assert!(row.contains(&ranks), "{row}");
        let state = if i == 0 { "lost" } else { "running" };
        assert!(row.ends_with(state), "{row}");
    }
    assert!(text.contains("standby-9"), "{text}");
    assert!(
        lines[0].starts_with("run job42: generation 3, running; 8 nodes, world size 64"),
        "{text}"
    );
    assert!(
        text.contains("formed     41 s ago in 2.1 s: 8 of max 8 nodes joined"),
        "{text}"
    );
    assert!(
        text.contains("restarts   1 failure, 2 membership"),
        "{text}"
    );
    assert!(
        text.contains("lost work  12 s at the last re-form (resumed from step 300)"),
        "{text}"
    );
    assert!(
        text.contains("checkpoint step 400 of generation 3, sealed 5 s ago (64 ranks, 1.2 MiB)"),
        "{text}"
    );
    // The lost node's reason, wrapped under the table.
    assert!(
        text.contains("gpu-node-00.cluster.example lost: its agent's connection"),
        "{text}"
    );
}

#[test]
fn what_the_store_does_not_know_is_a_dash() {
    let mut s = status(3);
    s.formation = None;
    s.checkpoints.latest = None;
    let text = render(&s, NOW).join("\n");
    assert!(text.contains("formed     -\n"), "{text}");
    assert!(text.contains("lost work  -\n"), "{text}");
    assert!(text.contains("checkpoint -\n"), "{text}");
    // A first formation has no lost work either.
    let mut s = status(3);
    s.formation.as_mut().unwrap().record.lost_work = None;
    assert!(render(&s, NOW).join("\n").contains("lost work  -\n"));
}

#[test]
fn a_forming_or_ended_run_says_so() {
    let mut s = RunStatus {
        run: "r".into(),
        progress: Some("waiting for 1 more node (1/2), join timeout in 580 s".into()),
        ..Default::default()
    };
    // The countdown was true when the line was published, not when status reads it.
    let first = &render(&s, NOW)[0];
    assert!(
        first.contains("forming: waiting for 1 more node (1/2)"),
        "{first}"
    );
    assert!(!first.contains("580 s"), "{first}");
    s.finished = Some(succeeded());
    assert!(render(&s, NOW)[0].contains("succeeded: all workers succeeded"));
}

#[test]
fn a_failed_round_says_why_and_a_newcomer_turned_away_leaves_the_run_running() {
    let failed = |nodes: &[&str]| {
        Some(serde_json::json!({
            "message": "run r: env-check refused to form the group: ...",
            "nodes": nodes,
            "at_ms": NOW,
        }))
    };
    let mut s = RunStatus {
        run: "r".into(),
        round_failed: failed(&["a", "b"]),
        ..Default::default()
    };
    let head = &render(&s, NOW)[0];
    assert!(
        head.contains("round failed: run r: env-check refused"),
        "{head}"
    );
    let mut running = status(2);
    running.closed = None;
    running.round_failed = failed(&["newcomer-7"]);
    let head = render(&running, NOW).join("\n");
    assert!(
        head.contains("running; turned away newcomer-7: run r: env-check"),
        "{head}"
    );
    // A member named in the verdict: the round itself failed.
    let member = running.plan.as_ref().unwrap().members[0].node_id.clone();
    s = RunStatus {
        round_failed: failed(&[member.as_str()]),
        ..running
    };
    assert!(render(&s, NOW)[0].contains("round failed:"));
}

#[test]
fn long_words_and_cells_are_cut_not_overflowing() {
    assert_eq!(cut("abcdef", 4), "abc…");
    assert_eq!(cut("abc", 4), "abc");
    let mut out = Vec::new();
    wrap(&mut out, "label", &"x".repeat(200));
    assert!(out.iter().all(|l| l.chars().count() <= WIDTH), "{out:?}");
    assert_eq!(bytes(512), "512 B");
    assert_eq!(bytes(1_234_567), "1.2 MiB");
}

#[test]
fn the_checkpoint_interval_is_shown_with_its_inputs() {
    let mut s = status(2);
    assert!(!render(&s, NOW).join("\n").contains("interval"));
    s.ckpt_interval = crate::decisions::ckpt_interval::decide(
        crate::decisions::ckpt_interval::IntervalMode::Auto,
        &crate::decisions::ckpt_interval::Observed {
            save_costs_s: vec![0.5],
            persist_costs_s: vec![2.5],
            failures: 3,
            exposure_s: 60.0,
            restart_s: 1.0,
        },
        3600.0,
    );
    s.failures = vec![Default::default(); 3];
    let text = render(&s, NOW).join("\n");
    assert!(
        text.contains("interval   every 4.5 s (C = 0.50 s stall, 2.50 s to disk, M = 20 s"),
        "{text}"
    );
}

#[test]
fn checkpoints_in_memory_are_shown_per_node_with_the_disk_lag() {
    let mut s = status(2);
    let report = serde_json::json!({
        "generation": 3, "at_ms": NOW - 2_000, "budget": 64u64 << 20, "held": 3u64 << 20,
        "lag_ms": 1_500,
        "steps": [
            {"step": 12, "generation": 3, "state": "persisted", "bytes": 1u64 << 20},
            {"step": 16, "generation": 3, "state": "persisting", "bytes": 1u64 << 20},
            {"step": 20, "generation": 3, "state": "staged", "bytes": 1u64 << 20},
        ],
    });
    let staging = s.reports.entry("staging".into()).or_default();
    staging.insert("gpu-node-01".into(), report);
    staging.insert(
        "idle".into(),
        serde_json::json!({"generation": 3, "at_ms": NOW, "budget": 1, "held": 0, "lag_ms": 0, "steps": []}),
    );
    let text = render(&s, NOW).join("\n");
    let line = text
        .lines()
        .find(|l| l.starts_with("memory"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("gpu-node-01: step 12 persisted, step 16 persisting, step 20 staged;"),
        "{text}"
    );
    let words = flat(&text);
    assert!(
        words.contains("3 MiB of 64 MiB in memory, the disk 3.5 s behind"),
        "lag grown by the report's age, sizes in the units the agent budgets in: {text}"
    );
    assert!(
        !text.contains("idle:"),
        "a node holding nothing is not shown: {text}"
    );
}

/// A long run keeps many small steps within its budget: the line names the newest few and
/// counts the rest; once the run finished, its agents' copies are gone with them.
#[test]
fn a_long_list_of_steps_in_memory_is_cut_and_a_finished_run_shows_none() {
    let mut s = status(2);
    let steps: Vec<serde_json::Value> = (1..=99u64)
        .map(|i| serde_json::json!({"step": i * 10, "generation": 1, "state": if i == 99 { "staged" } else { "persisted" }, "bytes": 1u64 << 10}))
        .collect();
    let report = serde_json::json!({
        "generation": 3, "at_ms": NOW, "budget": 64u64 << 20, "held": 99u64 << 10,
        "lag_ms": 0, "steps": steps,
    });
    s.reports
        .entry("staging".into())
        .or_default()
        .insert("gpu-node-01".into(), report);
    let text = render(&s, NOW).join("\n");
    let words = flat(&text);
    assert!(
        words.contains(
            "gpu-node-01: 95 older step(s) persisted, step 960 persisted, step 970 persisted, step 980 persisted, step 990 staged;"
        ),
        "{text}"
    );
    assert!(text.lines().count() < 30, "{text}");
    // A disk far behind: the older steps are counted by state, not called persisted.
    let mut behind = s.clone();
    let report = behind
        .reports
        .get_mut("staging")
        .unwrap()
        .get_mut("gpu-node-01")
        .unwrap();
    report["steps"][3]["state"] = "persisting".into();
    report["steps"][4]["state"] = "staged".into();
    let text = render(&behind, NOW).join("\n");
    let words = flat(&text);
    assert!(
        words.contains(
            "gpu-node-01: 95 older step(s) (93 persisted, 1 persisting, 1 staged), step 960"
        ),
        "{text}"
    );
    s.finished = Some(succeeded());
    let text = render(&s, NOW).join("\n");
    assert!(!text.contains("gpu-node-01:"), "{text}");
}

#[test]
fn replicas_are_shown_per_step_and_per_holder() {
    let mut s = status(2);
    let report = serde_json::json!({
        "generation": 3, "at_ms": NOW, "budget": 64u64 << 20, "held": 2u64 << 20, "lag_ms": 0,
        "steps": [
            {"step": 16, "generation": 3, "state": "persisted", "bytes": 1u64 << 20, "replica": "replicated"},
            {"step": 20, "generation": 3, "state": "staged", "bytes": 1u64 << 20, "replica": "replicating"},
        ],
        "replicas": [{"step": 20, "generation": 3, "from": "gpu-node-02", "bytes": 1u64 << 20}],
    });
    s.reports
        .entry("staging".into())
        .or_default()
        .insert("gpu-node-01".into(), report);
    // The line wraps: read it as one.
    let text = flat(&render(&s, NOW).join(" "));
    assert!(
        text.contains("gpu-node-01: step 16 persisted (replicated), step 20 staged (replicating);"),
        "{text}"
    );
    assert!(
        text.contains("; holds replicas of step 20 of gpu-node-02"),
        "{text}"
    );
    // The same step saved by two generations (one resumed, then saved again): each is named.
    let report = s
        .reports
        .get_mut("staging")
        .unwrap()
        .get_mut("gpu-node-01")
        .unwrap();
    report["replicas"] = serde_json::json!([
        {"step": 20, "generation": 2, "from": "gpu-node-02", "bytes": 1u64 << 20},
        {"step": 20, "generation": 3, "from": "gpu-node-02", "bytes": 1u64 << 20},
    ]);
    let text = flat(&render(&s, NOW).join(" "));
    assert!(
        text.contains("holds replicas of step 20 (generation 2) of gpu-node-02, step 20 (generation 3) of gpu-node-02"),
        "{text}"
    );
}

#[test]
fn pairs_of_nodes_whose_probes_go_unanswered_are_shown_once_each() {
    let mut s = status(3);
    let report = |rank: u32, silent: &[u32], generation: u64| serde_json::json!({"generation": generation, "node_rank": rank, "silent": silent});
    let peers = s.reports.entry("peers".into()).or_default();
    peers.insert("a".into(), report(1, &[2], 3));
    peers.insert("b".into(), report(2, &[1], 3));
    peers.insert("c".into(), report(0, &[], 3));
    peers.insert("old".into(), report(0, &[1], 2));
    let text = render(&s, NOW).join("\n");
    assert!(text.contains("partition  node 1 ↔ node 2\n"), "{text}");
    assert!(
        !text.contains("node 0 ↔"),
        "another generation's report: {text}"
    );
}

#[test]
fn an_outage_the_generation_was_kept_through_is_shown_with_its_length() {
    let mut s = status(3);
    let outages = s.reports.entry("outage".into()).or_default();
    let report = |secs: f64| serde_json::json!({"generation": 3, "seconds": secs, "ended_at_ms": NOW - 40_000});
    outages.insert("a".into(), report(31.2));
    outages.insert("b".into(), report(30.9));
    let text = render(&s, NOW).join("\n");
    assert!(
        text.contains(
            "outage     control plane away up to 31.2 s, back 40 s ago; generation 3 kept\n"
        ),
        "{text}"
    );
}

#[test]
fn failing_gpus_are_shown_per_node_and_passing_ones_are_not() {
    let mut s = status(3);
    let gpu = s.reports.entry("gpu".into()).or_default();
    gpu.insert(
        "b".into(),
        serde_json::json!({"host": "h-b", "failing": ["GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s) since the driver loaded"], "standing_by": true}),
    );
    gpu.insert(
        "a".into(),
        serde_json::json!({"host": "h-a", "failing": [], "standing_by": false}),
    );
    let text = render(&s, NOW).join("\n");
    let words = flat(&text);
    assert!(
        words.contains("gpu node b (host h-b) stands by: GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s) since the driver loaded"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("gpu        node b")),
        "{text}"
    );
    assert!(!text.contains("node a (host h-a)"), "{text}");
}

#[test]
fn the_flight_recorder_is_judged_over_every_nodes_dumps() {
    use crate::decisions::flight::{compact, Outcome};
    let dump = |text: &str| compact(&Outcome::Written(text.to_string())).unwrap();
    let mut s = status(3);
    let flight = s.reports.entry("flight".into()).or_default();
    // Rank 1, on another node than rank 0, never entered all_reduce #4: neither node alone can
    // tell (rank 0's node sees only a rank waiting), both together can.
    flight.insert(
        "a".into(),
        serde_json::json!({"generation": 3, "dumps": {"0": dump(include_str!("../../decisions/flight/fixtures/skip-rank0.json"))}}),
    );
    let alone = render(&s, NOW).join("\n");
    assert!(flat(&alone).contains("flight dumps from 1 of"), "{alone}");
    assert!(!flat(&alone).contains("never entered"), "{alone}");
    s.reports.get_mut("flight").unwrap().insert(
        "b".into(),
        serde_json::json!({"generation": 3, "dumps": {"1": dump(include_str!("../../decisions/flight/fixtures/skip-rank1.json"))}}),
    );
    let both = flat(&render(&s, NOW).join("\n"));
    assert!(
        both.contains("flight default_pg: rank 0 waits in all_reduce #4 (float[4]); rank 1 never entered it (its last: all_reduce #3)"),
        "{both}"
    );
}

/// The end of a run whose workers all succeeded, at `NOW`.
fn succeeded() -> crate::RunEnd {
    crate::RunEnd {
        success: true,
        reason: "all workers succeeded".into(),
        at_ms: NOW,
        root_cause: None,
        retryable: false,
        unfit: false,
    }
}
