//! The flight recorder's verdict on real gloo dumps (`fixtures/`, written by `drun._flight` in
//! 2- and 3-rank jobs under torch 2.15) and on synthetic ones.

use std::collections::BTreeMap;

use serde_json::json;

use super::{compact, judge, Outcome, Verdict};

/// Rank i's outcome is fixture `names[i]`.
fn outcomes(names: &[&str]) -> BTreeMap<u32, Outcome> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u32, fixture(n)))
        .collect()
}

fn fixture(name: &str) -> Outcome {
    let text = match name {
        "skip-rank0" => include_str!("fixtures/skip-rank0.json"),
        "skip-rank1" => include_str!("fixtures/skip-rank1.json"),
        "desync-rank0" => include_str!("fixtures/desync-rank0.json"),
        "desync-rank1" => include_str!("fixtures/desync-rank1.json"),
        "desync-rank2" => include_str!("fixtures/desync-rank2.json"),
        _ => unreachable!("no fixture {name}"),
    };
    Outcome::Written(text.to_string())
}

/// One synthetic collective: (group name, description, group id, sequence number, op, sizes,
/// finished).
type E<'a> = (&'a str, &'a str, u64, u64, &'a str, &'a [i64], bool);

/// A worker's file with one gloo dump of `entries`.
fn dump(entries: &[E<'_>]) -> Outcome {
    let entries: Vec<_> = entries
        .iter()
        .map(|&(name, desc, id, seq, op, sizes, done)| {
            json!({
                "collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": false, "pg_id": id,
                "process_group": [name, desc], "profiling_name": format!("gloo:{op}"),
                "input_sizes": [sizes], "input_dtypes": ["Float"], "retired": done,
                "state": "scheduled", "timeout_ms": 1_800_000,
            })
        })
        .collect();
    let gloo = json!({"entries": entries, "pg_config": {}, "pg_status": {}, "version": "2.10"});
    Outcome::Written(json!({"backends": {"gloo": gloo}}).to_string())
}

fn lines(outcomes: Vec<(u32, Outcome)>) -> Vec<String> {
    judge(&outcomes.into_iter().collect::<BTreeMap<_, _>>()).lines()
}

/// The integration test's story: rank 1 stopped calling all_reduce after #3, rank 0 entered #4;
/// both finished their one all_reduce on a second group ("pair"), which is not named.
#[test]
fn real_gloo_dumps_name_the_rank_that_never_entered_the_collective() {
    let report = judge(&BTreeMap::from([
        (0, fixture("skip-rank0")),
        (1, fixture("skip-rank1")),
    ]));
    assert_eq!(report.judged, vec![0, 1]);
    assert_eq!(report.groups.len(), 1, "{report:?}");
    assert_eq!(
        report.groups[0].verdict,
        Verdict::Waiting {
            at: "all_reduce #4 (float[4])".into(),
            waiting: vec![0],
            done: vec![],
            behind: vec![(1, Some("all_reduce #3".into()))],
        }
    );
    assert_eq!(
        report.lines(),
        vec!["flight recorder: default_pg: rank 0 waits in all_reduce #4 (float[4]); rank 1 never entered it (its last: all_reduce #3)"]
    );
}

/// Three real ranks at collective #4: ranks 0 and 2 in all_reduce, rank 1 in broadcast.
#[test]
fn real_gloo_dumps_of_a_desync_name_who_entered_what() {
    let got = lines(vec![
        (0, fixture("desync-rank0")),
        (1, fixture("desync-rank1")),
        (2, fixture("desync-rank2")),
    ]);
    assert_eq!(
        got,
        vec!["flight recorder: default_pg: desync at collective #4: ranks 0, 2 entered all_reduce (float[4]); rank 1 entered broadcast (float[8])"]
    );
}

#[test]
fn ranks_at_the_same_finished_collective_have_no_culprit() {
    let at = |seq, done| dump(&[("0", "default_pg", 0, seq, "all_reduce", &[4], done)]);
    let report = judge(&BTreeMap::from([(0, at(7, true)), (1, at(7, true))]));
    assert!(report.groups.is_empty(), "{report:?}");
    assert_eq!(
        report.lines(),
        vec!["flight recorder: ranks 0, 1 in step: no collective is waited in"]
    );
    // All in the same unfinished collective: the one they wait for is elsewhere.
    assert_eq!(
        lines(vec![(0, at(7, false)), (1, at(7, false))]),
        vec!["flight recorder: default_pg: ranks 0, 1 wait in all_reduce #7 (float[4]); every rank with a dump is in it: the rank they wait for is on another node or sent no dump"]
    );
}

/// Four ranks, two groups each: the default group is in step, tensor-parallel group "tp" (ranks
/// 2, 3) has rank 3 behind by two; group "dp" (no description) has rank 0 behind.
#[test]
fn several_process_groups_are_judged_each_in_id_order() {
    let d = |tp: u64, dp: u64, tp_done: bool, dp_done: bool, rank: u32| {
        let mut e: Vec<E<'_>> = vec![("0", "default_pg", 0, 3, "barrier", &[], true)];
        if rank >= 2 {
            e.push(("1", "tp", 1, tp, "all_gather", &[2, 8], tp_done));
        }
        if rank.is_multiple_of(2) {
            e.push(("2", "undefined", 2, dp, "all_reduce", &[16], dp_done));
        }
        dump(&e)
    };
    let got = lines(vec![
        (0, d(0, 5, true, true, 0)),
        (1, d(0, 0, true, true, 1)),
        (2, d(12, 6, false, false, 2)),
        (3, d(10, 0, true, true, 3)),
    ]);
    assert_eq!(
        got,
        vec![
            "flight recorder: tp: rank 2 waits in all_gather #12 (float[2, 8]); rank 3 never entered it (its last: all_gather #10)",
            "flight recorder: group 2: rank 2 waits in all_reduce #6 (float[16]); rank 0 never entered it (its last: all_reduce #5)",
        ]
    );
}

/// Only a rank's last collective on a group counts; a member that recorded nothing on the
/// default group (stuck before its first collective) is named too; ranks behind at the same
/// collective are said together.
#[test]
fn ranks_behind_are_grouped_by_their_last_collective() {
    let ar = |seq, done| ("0", "default_pg", 0, seq, "all_reduce", &[4][..], done);
    let got = lines(vec![
        (0, dump(&[ar(1, true), ar(2, false)])),
        (1, dump(&[ar(1, true)])),
        (2, dump(&[ar(1, true)])),
        (3, dump(&[])),
        (4, dump(&[ar(1, true), ar(2, false)])),
    ]);
    assert_eq!(
        got,
        vec!["flight recorder: default_pg: ranks 0, 4 wait in all_reduce #2 (float[4]); ranks 1, 2 never entered it (their last: all_reduce #1); rank 3 never entered it (no collective on this group yet)"]
    );
}

#[test]
fn ranks_without_a_dump_are_said_in_one_line_per_reason() {
    let at = |seq, done| dump(&[("0", "default_pg", 0, seq, "all_reduce", &[4], done)]);
    let got = lines(vec![
        (0, at(4, false)),
        (1, at(3, true)),
        (2, Outcome::NotListening),
        (3, Outcome::NotListening),
        (4, Outcome::NoAnswer),
        (
            5,
            Outcome::Written(
                json!({"error": "torch.distributed is not initialized in this process"})
                    .to_string(),
            ),
        ),
        (6, Outcome::Written("{not json".into())),
    ]);
    assert_eq!(got.len(), 5, "{got:#?}");
    assert!(got[0].starts_with("flight recorder: default_pg: rank 0 waits in all_reduce #4"));
    assert!(got.contains(&"flight recorder: no dump from ranks 2, 3: not listening (only workers that call drun.progress listen)".to_string()), "{got:#?}");
    assert!(
        got.contains(&"flight recorder: no dump from rank 4: no dump written in time".to_string()),
        "{got:#?}"
    );
    assert!(got.contains(&"flight recorder: no dump from rank 5: torch.distributed is not initialized in this process".to_string()), "{got:#?}");
    assert!(
        got.iter()
            .any(|l| l.starts_with("flight recorder: no dump from rank 6: an unreadable dump: ")),
        "{got:#?}"
    );
}

#[test]
fn point_to_point_entries_and_empty_inputs_are_handled() {
    let p2p = json!({
        "collective_seq_id": 9, "is_p2p": true, "pg_id": 0, "process_group": ["0", "default_pg"],
        "profiling_name": "nccl:send 0->1", "input_sizes": [[4]], "input_dtypes": ["Float"],
        "retired": false, "state": "started",
    });
    let barrier = |seq: u64, state: &str| {
        json!({
            "collective_seq_id": seq, "is_p2p": false, "pg_id": 0,
            "process_group": ["0", "default_pg"], "profiling_name": "nccl:barrier",
            "retired": false, "state": state,
        })
    };
    let file = |entries: Vec<serde_json::Value>| {
        Outcome::Written(json!({"backends": {"nccl": {"entries": entries}}}).to_string())
    };
    let got = lines(vec![
        (
            0,
            file(vec![barrier(2, "completed"), barrier(3, "started"), p2p]),
        ),
        (1, file(vec![barrier(2, "completed")])),
    ]);
    assert_eq!(
        got,
        vec!["flight recorder: default_pg: rank 0 waits in barrier #3; rank 1 never entered it (its last: barrier #2)"]
    );
}

/// Dumps without a single collective: the recorder was off (TORCH_FR_BUFFER_SIZE=0), which is
/// said rather than taken for ranks in step; one empty dump among others is a rank that never
/// called a collective (above).
#[test]
fn dumps_without_any_collective_say_the_recorder_is_off() {
    let got = lines(vec![(0, dump(&[])), (1, dump(&[]))]);
    assert_eq!(
        got,
        vec!["flight recorder: no dump from ranks 0, 1: the flight recorder holds no collective (off: TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is 0; or none was called yet)"]
    );
}

#[test]
fn compact_dumps_judge_as_the_whole_ones_do() {
    // The skip fixtures: rank 1 never entered all_reduce #20. Cut down, as two nodes report
    // them, the verdict is the same.
    let whole = judge(&outcomes(&["skip-rank0", "skip-rank1"]));
    let compacted: BTreeMap<u32, Outcome> = outcomes(&["skip-rank0", "skip-rank1"])
        .iter()
        .map(|(r, o)| (*r, Outcome::Written(compact(o).unwrap().to_string())))
        .collect();
    let cut = judge(&compacted);
    assert_eq!(cut.lines(), whole.lines());
    let size: usize = compacted
        .values()
        .map(|o| match o {
            Outcome::Written(t) => t.len(),
            _ => 0,
        })
        .sum();
    assert!(size < 4096, "{size} bytes");
    assert_eq!(compact(&Outcome::NoAnswer), None);
    assert_eq!(compact(&Outcome::Written("{nope".into())), None);
}
