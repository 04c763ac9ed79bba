//! The checker on hand-made histories: a clean one passes, each broken invariant is named.

use super::check::check;
use super::history::{
    Corruption, Cursor, Data, Kind, Ledger, Outcome, Record, Resume, Sealed, Verified,
};

const DATA: Data = Data {
    len: 8,
    global_batch: 2,
    epochs: 2,
};

fn perm(epoch: u64) -> Vec<u64> {
    if epoch == 0 {
        vec![3, 1, 2, 0, 7, 5, 6, 4]
    } else {
        vec![0, 4, 1, 5, 2, 6, 3, 7]
    }
}

fn rec(gen: u64, rank: u32, world: u32, node: usize, t: f64, kind: Kind) -> Record {
    Record {
        gen,
        rank,
        world,
        node,
        pid: 1000 + gen as i32 * 10 + rank as i32,
        t,
        text: format!("gen {gen} rank {rank}: {kind:?}"),
        kind,
        line: 0,
    }
}

/// Generation `gen` at `world` ranks (rank r on agent r), resuming from `resume`, running steps
/// `from..=to` the way ElasticSampler splits them, committing every 2nd step; `done` if `to` is
/// the last step.
fn generation(gen: u64, world: u32, resume: Option<Resume>, to: u64, t: f64) -> Vec<Record> {
    let spe = DATA.steps_per_epoch();
    let gb = DATA.global_batch;
    let mut out = Vec::new();
    for r in 0..world {
        out.push(rec(gen, r, world, r as usize, t, Kind::Start { resume }));
    }
    let from = resume.map_or(1, |r| r.step + 1);
    for s in from..=to {
        let (e, j) = ((s - 1) / spe, (s - 1) % spe);
        if j == 0 || s == from {
            out.push(rec(
                gen,
                0,
                world,
                0,
                t,
                Kind::Perm {
                    epoch: e,
                    perm: perm(e),
                },
            ));
        }
        for r in 0..world {
            let idx = (0..gb / world as u64)
                .map(|k| perm(e)[(j * gb + r as u64 + k * world as u64) as usize])
                .collect();
            out.push(rec(
                gen,
                r,
                world,
                r as usize,
                t + s as f64,
                Kind::Step {
                    step: s,
                    epoch: e,
                    idx,
                },
            ));
            if s % 2 == 0 {
                let done = j + 1;
                let cursor = if done == spe {
                    Cursor {
                        epoch: e + 1,
                        samples: 0,
                    }
                } else {
                    Cursor {
                        epoch: e,
                        samples: done * gb,
                    }
                };
                out.push(rec(
                    gen,
                    r,
                    world,
                    r as usize,
                    t + s as f64 + 0.5,
                    Kind::Commit {
                        step: s,
                        cursor,
                        sealed: r == 0,
                    },
                ));
            }
        }
    }
    if to == DATA.total_steps() {
        for r in 0..world {
            out.push(rec(
                gen,
                r,
                world,
                r as usize,
                t + 100.0,
                Kind::Done { step: to },
            ));
        }
    }
    out
}

fn numbered(mut h: Vec<Record>) -> Vec<Record> {
    for (i, r) in h.iter_mut().enumerate() {
        r.line = i + 1;
    }
    h
}

fn ledger_of(h: &[Record]) -> Ledger {
    Ledger {
        sealed: h
            .iter()
            .filter_map(|r| match r.kind {
                Kind::Commit {
                    step, sealed: true, ..
                } => Some(Sealed {
                    step,
                    generation: r.gen,
                }),
                _ => None,
            })
            .collect(),
        ..Ledger::default()
    }
}

fn ok_outcome() -> Outcome {
    Outcome {
        finishers: vec![0],
        leavers: vec![143],
        preempted: vec![5],
        dropped_warnings: 0,
        late: 0,
        leftover: vec![],
        corrupted: vec![],
        verified: vec![],
        elapsed_ms: 10_000,
        bound_ms: 60_000,
    }
}

/// Generation 1 at world size 2 runs to step 5 (sealed step 4), generation 2 at world size 1
/// resumes from step 4 (epoch 0 ends at step 4: cursor epoch 1, sample 0) and finishes.
fn faulty_but_correct() -> Vec<Record> {
    let mut h = generation(1, 2, None, 5, 0.0);
    let r = Resume {
        step: 4,
        generation: 1,
        epoch: 1,
        samples: 0,
    };
    h.extend(generation(2, 1, Some(r), 8, 20.0));
    numbered(h)
}

fn letters(h: &[Record], ledger: &Ledger, out: &Outcome) -> Vec<char> {
    check(h, ledger, out, DATA)
        .iter()
        .map(|v| v.invariant)
        .collect()
}

#[test]
fn chaos_checker_accepts_a_correct_history_with_a_reform() {
    let h = faulty_but_correct();
    let found = check(&h, &ledger_of(&h), &ok_outcome(), DATA);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn chaos_checker_catches_a_skipped_batch_with_an_excerpt() {
    let mut h = faulty_but_correct();
    // Generation 2 consumed batch 1 of epoch 1 at step 5 where batch 0 belonged.
    for r in h.iter_mut().filter(|r| r.gen == 2) {
        if let Kind::Step { step: 5, idx, .. } = &mut r.kind {
            *idx = vec![1, 5];
        }
    }
    let found = check(&h, &ledger_of(&h), &ok_outcome(), DATA);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].invariant, 'a');
    assert!(
        found[0].what.contains("kept step 5") && found[0].what.contains("missing [0, 4]"),
        "{}",
        found[0]
    );
    assert!(found[0].excerpt[0].starts_with("line "), "{}", found[0]);
}

#[test]
fn chaos_checker_catches_a_missing_rank_and_an_unfinished_run() {
    let h = faulty_but_correct();
    let no_rank1: Vec<Record> = h
        .iter()
        .filter(|r| !(r.gen == 1 && r.rank == 1 && matches!(r.kind, Kind::Step { step: 3, .. })))
        .cloned()
        .collect();
    assert_eq!(letters(&no_rank1, &ledger_of(&h), &ok_outcome()), vec!['a']);
    let unfinished: Vec<Record> = h
        .iter()
        .filter(|r| !matches!(r.kind, Kind::Done { .. }))
        .cloned()
        .collect();
    let out = Outcome {
        finishers: vec![1],
        ..ok_outcome()
    };
    assert_eq!(letters(&unfinished, &ledger_of(&h), &out), vec!['a', 'g']);
}

#[test]
fn chaos_checker_catches_ranks_resuming_from_different_points() {
    let mut h = faulty_but_correct();
    h.push(rec(
        2,
        1,
        1,
        1,
        20.0,
        Kind::Start {
            resume: Some(Resume {
                step: 2,
                generation: 1,
                epoch: 0,
                samples: 4,
            }),
        },
    ));
    let h = numbered(h);
    assert!(letters(&h, &ledger_of(&h), &ok_outcome()).contains(&'b'));
}

#[test]
fn chaos_checker_catches_a_resume_from_an_unsealed_step_or_a_wrong_cursor() {
    let h = faulty_but_correct();
    let mut ledger = ledger_of(&h);
    ledger.sealed.retain(|s| s.step != 4);
    let found = check(&h, &ledger, &ok_outcome(), DATA);
    assert!(
        found
            .iter()
            .any(|v| v.invariant == 'b' && v.what.contains("does not list as sealed")),
        "{found:?}"
    );
    let mut wrong = h.clone();
    for r in wrong.iter_mut() {
        if let Kind::Start { resume: Some(res) } = &mut r.kind {
            res.samples = 2;
        }
    }
    let found = check(&wrong, &ledger_of(&h), &ok_outcome(), DATA);
    assert!(
        found
            .iter()
            .any(|v| v.invariant == 'b' && v.what.contains("not at the cursor")),
        "{found:?}"
    );
}

#[test]
fn chaos_checker_catches_seals_moving_backwards_or_lost() {
    let h = faulty_but_correct();
    let mut ledger = ledger_of(&h);
    ledger.sealed.swap(0, 1);
    assert_eq!(letters(&h, &ledger, &ok_outcome()), vec!['c']);
    // Generation 2 resumed from step 2 though step 4 was sealed before it started: the replayed
    // steps are consistent, but a sealed checkpoint was skipped.
    let mut h2 = generation(1, 2, None, 5, 0.0);
    h2.extend(generation(
        2,
        1,
        Some(Resume {
            step: 2,
            generation: 1,
            epoch: 0,
            samples: 4,
        }),
        8,
        20.0,
    ));
    let h2 = numbered(h2);
    let found = check(&h2, &ledger_of(&h2), &ok_outcome(), DATA);
    assert!(found.iter().all(|v| v.invariant == 'c'), "{found:?}");
    assert!(
        found
            .iter()
            .any(|v| v.what.contains("step 4 was sealed before it started")),
        "{found:?}"
    );
}

#[test]
fn chaos_checker_catches_an_older_world_sealing_after_a_newer_one() {
    let h = faulty_but_correct();
    let mut ledger = ledger_of(&h);
    ledger.sealed.push(Sealed {
        step: 9,
        generation: 1,
    });
    assert_eq!(letters(&h, &ledger, &ok_outcome()), vec!['d']);
}

#[test]
fn chaos_checker_accepts_a_fallback_from_a_corrupted_checkpoint_and_catches_its_use() {
    // Step 4 of generation 1 was corrupted and marked bad: generation 2 resumes from step 2 and
    // seals step 4 again.
    let mut h = generation(1, 2, None, 5, 0.0);
    let back = Resume {
        step: 2,
        generation: 1,
        epoch: 0,
        samples: 4,
    };
    h.extend(generation(2, 1, Some(back), 8, 20.0));
    let h = numbered(h);
    let mut ledger = ledger_of(&h);
    ledger
        .bad
        .insert(format!("{:020}-{:020}", 4, 1), "size".into());
    let out = Outcome {
        corrupted: vec![Corruption {
            step: 4,
            generation: 1,
            t: 15.0,
        }],
        ..ok_outcome()
    };
    let found = check(&h, &ledger, &out, DATA);
    assert!(found.is_empty(), "{found:?}");
    // Resuming from the corrupted one is caught even when drun did not mark it bad.
    let h = faulty_but_correct();
    let found = check(&h, &ledger_of(&h), &out, DATA);
    assert!(
        found
            .iter()
            .any(|v| v.invariant == 'c' && v.what.contains("whose shard was corrupted")),
        "{found:?}"
    );
    // A generation whose agents verified and took it before the shard was corrupted (at 15.0)
    // could not see the corruption; one that verified it after, or has no record of verifying
    // it, is caught.
    let took = |t: f64| Verified {
        gen: 2,
        step: 4,
        saved_by: 1,
        t,
    };
    for (verified, ok) in [
        (vec![took(14.0), took(14.5)], true),
        (vec![took(14.0), took(15.5)], false),
        (vec![took(16.0)], false),
        (vec![], false),
    ] {
        let out = Outcome {
            verified: verified.clone(),
            ..out.clone()
        };
        let found = check(&h, &ledger_of(&h), &out, DATA);
        assert_eq!(found.is_empty(), ok, "{verified:?}: {found:?}");
    }
}

#[test]
fn chaos_checker_catches_one_generation_number_naming_two_worlds() {
    let mut h = faulty_but_correct();
    let mut again = rec(2, 0, 1, 0, 30.0, Kind::Start { resume: None });
    again.pid = 4242;
    h.push(again);
    let h = numbered(h);
    let found = check(&h, &ledger_of(&h), &ok_outcome(), DATA);
    assert!(
        found
            .iter()
            .any(|v| v.invariant == 'e' && v.what.contains("generation 2 started twice")),
        "{found:?}"
    );
}

#[test]
fn chaos_checker_catches_generations_going_backwards() {
    let mut h = faulty_but_correct();
    h.push(rec(1, 0, 2, 0, 50.0, Kind::Start { resume: None }));
    let h = numbered(h);
    assert!(letters(&h, &ledger_of(&h), &ok_outcome()).contains(&'e'));
}

#[test]
fn chaos_checker_catches_leftovers_bad_exits_and_overruns() {
    let h = faulty_but_correct();
    let l = ledger_of(&h);
    let out = Outcome {
        leftover: vec![4242],
        ..ok_outcome()
    };
    assert_eq!(letters(&h, &l, &out), vec!['f']);
    let out = Outcome {
        leavers: vec![1],
        ..ok_outcome()
    };
    assert_eq!(letters(&h, &l, &out), vec!['g']);
    let out = Outcome {
        preempted: vec![5, 0],
        ..ok_outcome()
    };
    assert_eq!(letters(&h, &l, &out), vec!['g']);
    let out = Outcome {
        dropped_warnings: 1,
        ..ok_outcome()
    };
    assert_eq!(letters(&h, &l, &out), vec!['g']);
    let out = Outcome {
        elapsed_ms: 70_000,
        ..ok_outcome()
    };
    assert_eq!(letters(&h, &l, &out), vec!['g']);
}

#[test]
fn chaos_history_parses_worker_lines_and_names_a_torn_one() {
    let who = r#""gen": 1, "rank": 0, "world": 2, "node": 0, "pid": 7"#;
    let text = [
        format!(r#"{{"kind": "start", "resume": null, {who}, "t": 1.5}}"#),
        format!(r#"{{"kind": "step", "step": 1, "epoch": 0, "idx": [3], {who}, "t": 2.0}}"#),
        format!(
            r#"{{"kind": "commit", "step": 2, "cursor": {{"epoch": 0, "samples": 4}}, "sealed": true, {who}, "t": 2.5}}"#
        ),
    ]
    .join("\n")
        + "\n";
    let text = text.as_str();
    let h = super::history::parse(text).unwrap();
    assert_eq!(h.len(), 3);
    assert_eq!(
        h[1].kind,
        Kind::Step {
            step: 1,
            epoch: 0,
            idx: vec![3]
        }
    );
    assert_eq!(h[2].line, 3);
    let err = super::history::parse(&text[..text.len() - 20]).unwrap_err();
    assert!(err.starts_with("history line 3:"), "{err}");
}

/// A writer SIGKILLed in its `write` leaves its line's head up to a page boundary, and the next
/// line follows on the same line: that line is read, the head dropped; the same head anywhere
/// else is an error.
#[test]
fn a_line_torn_at_a_page_boundary_by_a_killed_writer_loses_only_its_head() {
    let who = r#""gen": 3, "rank": 0, "world": 3, "node": 0, "pid": 9"#;
    let whole =
        format!(r#"{{"kind": "step", "step": 1, "epoch": 0, "idx": [3], {who}, "t": 2.0}}"#);
    let head = r#"{"resume": {"step"#;
    // Filler lines up to the byte where the head must end on a page boundary.
    let filler = |len: usize| {
        format!(
            r#"{{"kind": "done", "step": 0, {who}, "t": {}}}"#,
            "1".repeat(len)
        )
    };
    let mut text = String::new();
    while 4096 - text.len() - head.len() > 200 {
        text += &filler(100);
        text += "\n";
    }
    let pad = 4096 - head.len() - text.len() - filler(0).len() - 1;
    text += &filler(pad);
    text += "\n";
    assert_eq!(text.len() + head.len(), 4096);
    let torn = format!("{text}{head}{whole}\n");
    let h = super::history::parse(&torn).unwrap();
    let last = h.last().unwrap();
    assert_eq!(
        last.kind,
        Kind::Step {
            step: 1,
            epoch: 0,
            idx: vec![3]
        }
    );
    assert_eq!(last.line, text.lines().count() + 1);

    // One byte off the boundary: no writer was cut there.
    let off = format!("{text} {head}{whole}\n");
    let err = super::history::parse(&off).unwrap_err();
    assert!(
        err.starts_with(&format!("history line {}:", text.lines().count() + 1)),
        "{err}"
    );
}
