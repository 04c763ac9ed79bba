//! The commit's rules, pure: who may commit a step, when the step seals and into which
//! manifest, whether the seal moves `ckpt/latest`.

use super::{cursor_disagreement, merge_files, LedgerError, Manifest, NodeCommit};
use crate::store::records::parse_id;
use crate::Plan;

/// What the records of a step come to once a node's commit is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// These members of the generation have not reported the step yet.
    Waiting(Vec<String>),
    /// Every member reported it, in agreement: the manifest to seal.
    Ready(Manifest),
}

/// Whether `rec` may be recorded for the running generation `plan`: its generation is `plan`'s,
/// its step after the one `plan` resumed from.
///
/// # Errors
/// [`LedgerError::Stale`] for another generation, [`LedgerError::NotAfterResume`].
pub fn admit(plan: &Plan, rec: &NodeCommit) -> Result<(), LedgerError> {
    let g = plan.generation;
    if rec.generation < g {
        return Err(LedgerError::Stale(format!(
            "generation {} is over; the node runs generation {g}",
            rec.generation
        )));
    }
    if rec.generation > g {
        return Err(LedgerError::Stale(format!(
            "generation {} has not begun; the node runs generation {g}",
            rec.generation
        )));
    }
    if let Some(r) = &plan.resume {
        // A step resumed from the survivors' copies in memory is persisted by the generation
        // that resumed it: its members commit that step once more, to seal it as it was saved.
        let persisting_resumed = plan.resume_memory.is_some() && rec.step == r.step;
        if rec.step <= r.step && !persisting_resumed {
            return Err(LedgerError::NotAfterResume {
                step: rec.step,
                resumed: r.step,
            });
        }
    }
    Ok(())
}

/// The step of `rec` given every node record of it (`records`, `rec`'s included): still
/// waiting for members of `plan`, or the manifest of run `run_id` to seal at `sealed_at_ms`
/// (records of non-members left out).
///
/// # Errors
/// [`LedgerError::Misaligned`] when the members' cursors differ,
/// [`LedgerError::ConflictingFiles`] when two ranks report one file differently.
pub fn completion(
    run_id: &str,
    plan: &Plan,
    rec: &NodeCommit,
    mut records: Vec<NodeCommit>,
    sealed_at_ms: u64,
) -> Result<Completion, LedgerError> {
    let waiting_for: Vec<String> = plan
        .members
        .iter()
        .filter(|m| !records.iter().any(|r| r.node_id == m.node_id))
        .map(|m| m.node_id.clone())
        .collect();
    if !waiting_for.is_empty() {
        return Ok(Completion::Waiting(waiting_for));
    }
    records.retain(|r| plan.member(&r.node_id).is_some());
    if let Some(detail) =
        cursor_disagreement(records.iter().map(|r| (r.ranks.as_slice(), &r.cursor)))
    {
        return Err(LedgerError::Misaligned {
            step: rec.step,
            detail,
        });
    }
    let files = merge_files(records.iter().flat_map(|r| r.files.clone())).map_err(|conflict| {
        LedgerError::ConflictingFiles {
            step: rec.step,
            detail: conflict.to_string(),
        }
    })?;
    if let (Some(r), Some(_)) = (&plan.resume, &plan.resume_memory) {
        if r.step == rec.step {
            return resumed_complete(r, files, sealed_at_ms);
        }
    }
    let (save_ms, stall_ms) = save_costs(&records, sealed_at_ms);
    Ok(Completion::Ready(Manifest {
        run_id: run_id.to_string(),
        step: rec.step,
        generation: plan.generation,
        world_size: plan.world_size,
        cursor: rec.cursor.clone(),
        files,
        sealed_at_ms,
        adopted_from: None,
        save_ms,
        stall_ms,
    }))
}

/// The resumed step `r` (from memory) once every member persisted the files it served: sealed
/// as the generation that saved it saved it, when the files persisted are exactly its files.
fn resumed_complete(
    r: &Manifest,
    mut files: Vec<super::ShardFile>,
    sealed_at_ms: u64,
) -> Result<Completion, LedgerError> {
    let mut want = r.files.clone();
    let key = |f: &super::ShardFile| (f.rank, f.path.clone());
    files.sort_by_key(key);
    want.sort_by_key(key);
    if files != want {
        return Err(LedgerError::ConflictingFiles {
            step: r.step,
            detail: format!(
                "the files persisted ({}) are not the {} file(s) of step {} resumed from memory",
                files.len(),
                want.len(),
                r.step
            ),
        });
    }
    Ok(Completion::Ready(Manifest {
        sealed_at_ms,
        ..r.clone()
    }))
}

/// A step's save costs from its node `records`, sealed at `sealed_at_ms`: (the first rank's save
/// start → the seal, the training's stall). The stall is the first save start → the last node's
/// staged answer when every node answered its ranks from memory (`--ckpt-memory`), else `None`
/// (some ranks waited for the seal: the stall is the whole save). Both `None` when no rank
/// reported its save start.
pub fn save_costs(records: &[NodeCommit], sealed_at_ms: u64) -> (Option<u64>, Option<u64>) {
    let Some(start) = records.iter().filter_map(|r| r.save_started_ms).min() else {
        return (None, None);
    };
    let save_ms = sealed_at_ms.saturating_sub(start);
    let staged: Option<Vec<u64>> = records.iter().map(|r| r.staged_ms).collect();
    let stall_ms = staged
        .and_then(|s| s.into_iter().max())
        .map(|last| last.saturating_sub(start).min(save_ms));
    (Some(save_ms), stall_ms)
}

/// Whether sealing `manifest` moves `ckpt/latest` (now `latest`, `None`: missing): only forward
/// in (step, generation); a value that is no manifest id is replaced.
pub fn moves_latest(latest: Option<&str>, manifest: &Manifest) -> bool {
    latest.is_none_or(|l| parse_id(l).is_none_or(|l| l < (manifest.step, manifest.generation)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{manifest_id, Cursor, ShardFile};
    use crate::{assign, Candidate};

    fn cand(id: &str) -> Candidate {
        Candidate::local(id, 1)
    }

    fn rec(node: &str, g: u64, step: u64, consumed: u64) -> NodeCommit {
        NodeCommit {
            node_id: node.into(),
            generation: g,
            step,
            ranks: vec![if node == "a" { 0 } else { 1 }],
            files: vec![ShardFile {
                rank: if node == "a" { 0 } else { 1 },
                path: format!("/c/{step}/{node}"),
                bytes: 1,
                digest: "0".repeat(64),
            }],
            cursor: Cursor {
                consumed_in_epoch: consumed,
                ..Cursor::default()
            },
            save_started_ms: Some(100),
            staged_ms: None,
        }
    }

    #[test]
    fn a_step_resumed_from_memory_is_sealed_by_the_generation_that_resumed_it_as_saved() {
        let mut plan = assign("r", 3, &[cand("a"), cand("b")], 0, 0).unwrap();
        // Step 6 of generation 2, world size 3, resumed from memory: a serves ranks 0 and 2
        // (2 was the lost node's, from its replica), b serves rank 1.
        let file = |rank: u32| ShardFile {
            rank,
            path: format!("/c/6/rank{rank}"),
            bytes: 1,
            digest: format!("{rank:064}"),
        };
        let resumed = Manifest {
            world_size: 3,
            files: (0..3).map(file).collect(),
            ..Manifest::bare("r", 6, 2, 5)
        };
        plan.resume = Some(resumed.clone());
        let part = |node: &str, ranks: &[u32]| NodeCommit {
            ranks: vec![],
            files: ranks.iter().map(|r| file(*r)).collect(),
            cursor: Cursor::default(),
            save_started_ms: None,
            ..rec(node, 3, 6, 0)
        };
        assert!(
            matches!(
                admit(&plan, &part("a", &[0, 2])),
                Err(LedgerError::NotAfterResume { .. })
            ),
            "a sealed resume point is not committed again"
        );
        plan.resume_memory = Some(Default::default());
        assert!(admit(&plan, &part("a", &[0, 2])).is_ok());
        assert!(matches!(
            admit(&plan, &rec("a", 3, 4, 0)),
            Err(LedgerError::NotAfterResume { .. })
        ));
        assert_eq!(
            completion("r", &plan, &part("a", &[0, 2]), vec![part("a", &[0, 2])], 9).unwrap(),
            Completion::Waiting(vec!["b".into()])
        );
        let both = vec![part("a", &[0, 2]), part("b", &[1])];
        let Completion::Ready(m) = completion("r", &plan, &part("b", &[1]), both, 9).unwrap()
        else {
            panic!("complete")
        };
        assert_eq!(
            m,
            Manifest {
                sealed_at_ms: 9,
                ..resumed
            },
            "sealed as generation 2 saved it, at world size 3"
        );
        // A part that is not the resumed step's files is refused.
        let wrong = vec![part("a", &[0]), part("b", &[1])];
        assert!(matches!(
            completion("r", &plan, &part("b", &[1]), wrong, 9),
            Err(LedgerError::ConflictingFiles { .. })
        ));
    }

    #[test]
    fn only_the_running_generation_commits_after_its_resume_point() {
        let mut plan = assign("r", 2, &[cand("a"), cand("b")], 0, 0).unwrap();
        assert!(admit(&plan, &rec("a", 2, 5, 0)).is_ok());
        assert!(matches!(
            admit(&plan, &rec("a", 1, 5, 0)),
            Err(LedgerError::Stale(_))
        ));
        assert!(matches!(
            admit(&plan, &rec("a", 3, 5, 0)),
            Err(LedgerError::Stale(_))
        ));
        let Completion::Ready(m) = completion(
            "r",
            &plan,
            &rec("a", 2, 5, 0),
            vec![rec("a", 2, 5, 0), rec("b", 2, 5, 0)],
            0,
        )
        .unwrap() else {
            panic!("complete")
        };
        plan.resume = Some(m);
        assert!(matches!(
            admit(&plan, &rec("a", 2, 5, 0)),
            Err(LedgerError::NotAfterResume {
                step: 5,
                resumed: 5
            })
        ));
    }

    #[test]
    fn a_step_seals_when_every_member_reported_the_same_cursor() {
        let plan = assign("r", 1, &[cand("a"), cand("b")], 0, 0).unwrap();
        let a = rec("a", 1, 3, 8);
        assert_eq!(
            completion("r", &plan, &a, vec![a.clone()], 500).unwrap(),
            Completion::Waiting(vec!["b".into()])
        );
        let Completion::Ready(m) =
            completion("r", &plan, &a, vec![a.clone(), rec("b", 1, 3, 8)], 500).unwrap()
        else {
            panic!("complete")
        };
        assert_eq!(
            (m.id(), m.files.len(), m.save_ms),
            (manifest_id(3, 1), 2, Some(400))
        );
        assert!(matches!(
            completion("r", &plan, &a, vec![a.clone(), rec("b", 1, 3, 9)], 500),
            Err(LedgerError::Misaligned { step: 3, .. })
        ));
    }

    #[test]
    fn the_stall_is_the_last_staged_answer_when_every_node_staged() {
        let staged = |node: &str, start: u64, at: Option<u64>| NodeCommit {
            save_started_ms: Some(start),
            staged_ms: at,
            ..rec(node, 1, 3, 0)
        };
        assert_eq!(
            save_costs(
                &[staged("a", 100, Some(130)), staged("b", 110, Some(160))],
                2_000
            ),
            (Some(1_900), Some(60)),
            "save start 100, last node answered at 160, sealed at 2000"
        );
        assert_eq!(
            save_costs(
                &[staged("a", 100, Some(130)), staged("b", 110, None)],
                2_000
            ),
            (Some(1_900), None),
            "node b's ranks waited for the disk (a direct save): the stall is the save"
        );
        let unknown = NodeCommit {
            save_started_ms: None,
            ..staged("a", 0, Some(5))
        };
        assert_eq!(save_costs(&[unknown], 2_000), (None, None));
        let plan = assign("r", 1, &[cand("a"), cand("b")], 0, 0).unwrap();
        let (a, b) = (staged("a", 100, Some(130)), staged("b", 110, Some(160)));
        let Completion::Ready(m) = completion("r", &plan, &a, vec![a.clone(), b], 2_000).unwrap()
        else {
            panic!("complete")
        };
        assert_eq!((m.save_ms, m.stall_ms), (Some(1_900), Some(60)));
    }

    #[test]
    fn latest_moves_only_forward() {
        let plan = assign("r", 2, &[cand("a")], 0, 0).unwrap();
        let a = rec("a", 2, 10, 0);
        let Completion::Ready(m) = completion("r", &plan, &a, vec![a.clone()], 0).unwrap() else {
            panic!("complete")
        };
        assert!(moves_latest(None, &m));
        assert!(moves_latest(Some("garbage"), &m));
        assert!(moves_latest(Some(&manifest_id(9, 3)), &m));
        assert!(moves_latest(Some(&manifest_id(10, 1)), &m));
        assert!(!moves_latest(Some(&manifest_id(10, 2)), &m));
        assert!(!moves_latest(Some(&manifest_id(11, 1)), &m));
    }
}
