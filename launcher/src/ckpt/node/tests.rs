//! Tests of the node's checkpoint reports: batching local ranks' commits of a step, refusals.

use super::*;
use drun_rendezvous::{assign, Candidate};

fn plan(slots: u32) -> Plan {
    let c = Candidate {
        node_id: "a".into(),
        advertise_addr: "127.0.0.1".into(),
        slots,
        requested_node_rank: None,
        master_port: 1,
        probe_port: 0,
    };
    assign("run", 3, &[c], 0, 0).unwrap()
}

fn file(dir: &Path, rank: u32) -> FileReport {
    let p = dir.join(format!("r{rank}"));
    std::fs::write(&p, b"abc").unwrap();
    FileReport {
        path: p.display().to_string(),
        bytes: 3,
        sha256: "0".repeat(64),
        staged: false,
    }
}

fn cursor(n: u64) -> Cursor {
    Cursor {
        consumed_in_epoch: n,
        ..Cursor::default()
    }
}

#[test]
fn batches_when_every_local_rank_reported() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(2), "a", None);
    let (t0, _r0) = oneshot::channel();
    assert!(l
        .commit(0, 3, 5, vec![file(d.path(), 0)], cursor(8), t0)
        .is_none());
    let (t1, mut r1) = oneshot::channel();
    let batch = l
        .commit(1, 3, 5, vec![file(d.path(), 1)], cursor(8), t1)
        .expect("complete");
    assert_eq!(batch.ranks, [0, 1]);
    assert_eq!(batch.files.len(), 2);
    l.answered(
        5,
        &Ok(CommitOutcome::Recorded {
            waiting_for: vec!["b".into()],
        }),
        None,
    );
    assert_eq!(r1.try_recv().unwrap()["waiting_for"][0], "b");
}

#[test]
fn a_rank_without_files_takes_part() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(2), "a", Some(d.path()));
    let (t0, mut r0) = oneshot::channel();
    assert!(l.commit(0, 3, 5, vec![], Cursor::default(), t0).is_none());
    assert!(r0.try_recv().is_err(), "not refused: waits for rank 1");
    let (t1, _r1) = oneshot::channel();
    let batch = l
        .commit(1, 3, 5, vec![file(d.path(), 1)], Cursor::default(), t1)
        .expect("complete");
    assert_eq!(batch.ranks, [0, 1]);
    assert_eq!(batch.files.len(), 1);
    assert_eq!(batch.files[0].rank, 1);
}

#[test]
fn refuses_stale_misaligned_and_foreign_commits() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(2), "a", None);
    let (t, mut r) = oneshot::channel();
    assert!(l.commit(0, 2, 5, vec![], cursor(8), t).is_none());
    assert!(r.try_recv().unwrap()["error"]
        .as_str()
        .unwrap()
        .starts_with("stale commit: generation 2 is over"));
    let (t, mut r) = oneshot::channel();
    assert!(l.commit(0, 999, 5, vec![], cursor(8), t).is_none());
    let e = r.try_recv().unwrap()["error"].as_str().unwrap().to_string();
    assert!(e.contains("generation 999, which has not begun"), "{e}");
    let (t, mut r) = oneshot::channel();
    assert!(l.commit(7, 3, 5, vec![], cursor(8), t).is_none());
    assert!(r.try_recv().unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("rank 7 does not run on node a"));
    let mut short = file(d.path(), 0);
    short.bytes = 99;
    let (t, mut r) = oneshot::channel();
    assert!(l.commit(0, 3, 5, vec![short], cursor(8), t).is_none());
    assert!(r.try_recv().unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("has 3 bytes, the commit says 99"));
    let (t, mut r) = oneshot::channel();
    let dir_as_file = FileReport {
        path: d.path().display().to_string(),
        bytes: 0,
        sha256: "0".repeat(64),
        staged: false,
    };
    assert!(l.commit(0, 3, 5, vec![dir_as_file], cursor(8), t).is_none());
    assert!(r.try_recv().unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("is not a regular file"));
    let mut inside = NodeLedger::new(&plan(2), "a", Some(Path::new("/nonexistent-ckpt")));
    let (t, mut r) = oneshot::channel();
    assert!(inside
        .commit(0, 3, 5, vec![file(d.path(), 0)], cursor(8), t)
        .is_none());
    assert!(r.try_recv().unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("is outside --ckpt-dir /nonexistent-ckpt"));
    let (t0, mut r0) = oneshot::channel();
    let (t1, _r1) = oneshot::channel();
    assert!(l
        .commit(0, 3, 6, vec![file(d.path(), 0)], cursor(8), t0)
        .is_none());
    assert!(l
        .commit(1, 3, 6, vec![file(d.path(), 1)], cursor(9), t1)
        .is_none());
    let e = r0.try_recv().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        e.starts_with("step 6 not sealed: misaligned data: rank 0 report cursor"),
        "{e}"
    );
    assert!(e.contains("rank 1 report cursor"), "{e}");
}

#[test]
fn steps_go_forward_and_a_missing_rank_is_named() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(2), "a", Some(d.path()));
    for r in 0..2 {
        let (t, _) = oneshot::channel();
        l.commit(r, 3, 4, vec![file(d.path(), r)], cursor(32), t);
    }
    let (t, mut r) = oneshot::channel();
    assert!(l
        .commit(0, 3, 2, vec![file(d.path(), 0)], cursor(16), t)
        .is_none());
    assert!(r.try_recv().unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("step 2 is not after step 4"));
    let (t, _r) = oneshot::channel();
    assert!(l
        .commit(0, 3, 6, vec![file(d.path(), 0)], cursor(48), t)
        .is_none());
    assert!(l.stalled(Duration::from_secs(3600)).is_empty());
    let lines = l.stalled(Duration::ZERO);
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].contains("for rank(s) 1 of this node"),
        "{}",
        lines[0]
    );
    assert!(l.stalled(Duration::ZERO).is_empty(), "said once");
}
