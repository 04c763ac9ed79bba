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

fn staged_file(dir: &Path, rank: u32) -> FileReport {
    FileReport {
        staged: true,
        sha256: String::new(),
        ..file(dir, rank)
    }
}

/// Rank `rank`'s commit of `step` (generation 3) of its file staged in `dir`: the node's batch
/// when it completed the step, and where the rank's answer comes.
fn staged_commit(
    l: &mut NodeLedger,
    dir: &Path,
    rank: u32,
    step: u64,
) -> (Option<NodeCommit>, oneshot::Receiver<serde_json::Value>) {
    let (t, r) = oneshot::channel();
    let batch = l.commit(rank, 3, step, vec![staged_file(dir, rank)], cursor(step), t);
    (batch, r)
}

/// `--ckpt-memory`: a step answered staged and then refused by the ledger (misaligned across
/// nodes, a stale agent) is told to every local rank as the answer to its commit of the next
/// step — a rank already waiting on that step at once — and only that step.
#[test]
fn a_refusal_after_a_staged_answer_reaches_every_local_rank_on_its_next_commit() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(2), "a", Some(d.path())).with_stage(Some(d.path()));
    let commit = |l: &mut NodeLedger, rank: u32, step: u64| staged_commit(l, d.path(), rank, step);
    let (_, mut r0) = commit(&mut l, 0, 4);
    let (batch, mut r1) = commit(&mut l, 1, 4);
    assert!(batch.is_some());
    assert_eq!(l.take_staged(4).len(), 2);
    l.answer_staged(4, true);
    for r in [&mut r0, &mut r1] {
        let a = r.try_recv().unwrap();
        assert_eq!((&a["staged"], &a["spares"]), (&json!(true), &json!(true)));
    }
    // Rank 0 already waits on step 6 when the refusal of step 4 arrives: it hears it now.
    let (none, mut w0) = commit(&mut l, 0, 6);
    assert!(none.is_none());
    let refusal = Err(drun_rendezvous::CommitRefused::NotPersisted(
        "step 4 not sealed: misaligned data".into(),
    ));
    l.on_committed(3, 4, &refusal, None);
    let a = w0.try_recv().expect("answered at once");
    assert_eq!(a["ok"], false);
    let e = a["error"].as_str().unwrap();
    assert!(
        e.contains("checkpoint step 4 was refused after this node answered it staged in memory")
            && e.contains("misaligned data")
            && e.contains("step 6"),
        "{e}"
    );
    // Rank 1 hears it on its commit of step 6; then the refusal is spent.
    let (none, mut w1) = commit(&mut l, 1, 6);
    assert!(none.is_none());
    assert_eq!(w1.try_recv().unwrap()["ok"], false);
    let (_, mut s0) = commit(&mut l, 0, 8);
    let (batch, _) = commit(&mut l, 1, 8);
    assert!(batch.is_some(), "step 8 is committed as usual");
    assert!(
        s0.try_recv().is_err(),
        "rank 0 waits for the answer to step 8"
    );
    // An answer to a staged step that is not a refusal changes nothing for the ranks.
    l.answer_staged(8, true);
    l.on_committed(
        3,
        8,
        &Ok(CommitOutcome::Recorded {
            waiting_for: vec![],
        }),
        None,
    );
    let (_, mut n0) = commit(&mut l, 0, 10);
    assert!(n0.try_recv().is_err(), "not refused");
}

/// On the direct path a refusal answers the commit itself, and nothing is left for later.
#[test]
fn a_refusal_of_a_commit_waiting_for_its_answer_is_not_told_again() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(1), "a", None);
    let (t, mut r) = oneshot::channel();
    assert!(l
        .commit(0, 3, 4, vec![file(d.path(), 0)], cursor(4), t)
        .is_some());
    let refusal = Err(drun_rendezvous::CommitRefused::NotPersisted("no".into()));
    l.on_committed(3, 4, &refusal, None);
    assert_eq!(r.try_recv().unwrap()["ok"], false);
    let (t, mut r) = oneshot::channel();
    assert!(l
        .commit(0, 3, 6, vec![file(d.path(), 0)], cursor(6), t)
        .is_some());
    assert!(r.try_recv().is_err(), "step 6 waits for its own answer");
}

/// `--ckpt-memory`: a staged save that did not fit the budget is answered once on disk, and
/// that answer tells the ranks to prepare no spare for their next save; the next step's does not.
#[test]
fn a_save_that_did_not_fit_the_budget_is_answered_without_spares() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(1), "a", Some(d.path())).with_stage(Some(d.path()));
    let recorded = Ok(CommitOutcome::Recorded {
        waiting_for: vec![],
    });
    let (batch, mut r) = staged_commit(&mut l, d.path(), 0, 4);
    assert!(batch.is_some());
    l.no_spares(4);
    l.on_committed(3, 4, &recorded, None);
    assert_eq!(r.try_recv().unwrap()["spares"], false);
    let (batch, mut r) = staged_commit(&mut l, d.path(), 0, 6);
    assert!(batch.is_some());
    l.on_committed(3, 6, &recorded, None);
    let a = r.try_recv().unwrap();
    assert_eq!(
        (&a["ok"], &a["spares"]),
        (&json!(true), &serde_json::Value::Null)
    );
}

/// `--ckpt-memory`: a staged step the agent could not write to `--ckpt-dir` (a full disk) is
/// told to the training like a refusal by the ledger: on the ranks' commits of the next step.
#[test]
fn a_staged_step_that_could_not_be_persisted_refuses_the_next_commit() {
    let d = tempfile::tempdir().unwrap();
    let mut l = NodeLedger::new(&plan(2), "a", Some(d.path())).with_stage(Some(d.path()));
    let commit = |l: &mut NodeLedger, rank: u32, step: u64| staged_commit(l, d.path(), rank, step);
    let (_, mut r0) = commit(&mut l, 0, 4);
    let (_, mut r1) = commit(&mut l, 1, 4);
    assert_eq!(l.take_staged(4).len(), 2);
    l.answer_staged(4, false);
    for r in [&mut r0, &mut r1] {
        let a = r.try_recv().unwrap();
        assert_eq!(
            (&a["staged"], &a["spares"]),
            (&json!(true), &json!(false)),
            "no room for the next save's spares"
        );
    }
    l.not_persisted(4, "rank0.pt: No space left on device (os error 28)");
    for rank in [0, 1] {
        let (none, mut w) = commit(&mut l, rank, 6);
        assert!(none.is_none());
        let a = w.try_recv().expect("answered at once");
        assert_eq!(a["ok"], false);
        let e = a["error"].as_str().unwrap();
        assert!(
            e.contains("checkpoint step 4 was refused after this node answered it staged")
                && e.contains("No space left on device"),
            "{e}"
        );
    }
}
