//! The record of one formation (key `formation/<g>`): when the round opened and when the plan
//! was written, and the work the re-form threw away.
//!
//! Written by the decider in the same transaction as the plan of generation `g`, read by
//! `status` ([`crate::status`]) and, for its [`Door`], by node rank 0's session while the
//! generation runs. A store written by an older drun has no such key: `status` then shows `-`
//! for what it would have said, and every newcomer re-forms the group to be judged.

use crate::ledger::Manifest;
pub use crate::store::records::{Formation, LostWork};

/// The work lost by re-forming (pure): the previous generation ran from `prev_formed_at_ms`
/// until `closed_at_ms` (both milliseconds since the Unix epoch); what it did before the
/// training went on from `resume` is kept: its seal, or — a step staged in memory, sealed once
/// persisted behind the training — the end of the training's stall ([`Manifest::stall_ms`]
/// after the save began, `save_ms` before the seal). Counting from the seal of a staged step
/// would keep the work of the whole persistence, which the re-form throws away too (a user saw
/// "lost work 62 ms" for 3 steps repeated).
///
/// ```
/// use drun_rendezvous::decisions::formation::lost_work;
/// // Formed at t=10 s, closed at t=70 s, no checkpoint: all 60 s are lost.
/// assert_eq!(lost_work(10_000, 70_000, None).ms, 60_000);
/// ```
pub fn lost_work(prev_formed_at_ms: u64, closed_at_ms: u64, resume: Option<&Manifest>) -> LostWork {
    let went_on = |m: &Manifest| match (m.save_ms, m.stall_ms) {
        (Some(save), Some(stall)) => m.sealed_at_ms.saturating_sub(save.saturating_sub(stall)),
        _ => m.sealed_at_ms,
    };
    let kept_until = resume.map_or(prev_formed_at_ms, |m| went_on(m).max(prev_formed_at_ms));
    LostWork {
        ms: closed_at_ms.saturating_sub(kept_until),
        resume_step: resume.map(|m| m.step),
    }
}

/// [`lost_work`] of a resume from the survivors' copies in memory, a step not sealed yet (its
/// manifest is stamped when the decider chose it): kept is the work until its ranks went on
/// after staging it, `went_on_at_ms`.
pub fn lost_work_after(
    prev_formed_at_ms: u64,
    closed_at_ms: u64,
    went_on_at_ms: u64,
    resume: Option<&Manifest>,
) -> LostWork {
    LostWork {
        ms: closed_at_ms.saturating_sub(went_on_at_ms.max(prev_formed_at_ms)),
        resume_step: resume.map(|m| m.step),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(step: u64, sealed_at_ms: u64) -> Manifest {
        Manifest {
            run_id: "r".into(),
            step,
            generation: 1,
            world_size: 2,
            cursor: Default::default(),
            files: vec![],
            sealed_at_ms,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        }
    }

    #[test]
    fn work_after_the_resume_checkpoint_is_lost() {
        let m = manifest(300, 50_000);
        let lost = lost_work(10_000, 70_000, Some(&m));
        assert_eq!(lost.ms, 20_000);
        assert_eq!(lost.resume_step, Some(300));
    }

    #[test]
    fn a_step_staged_in_memory_keeps_the_work_until_the_stall_ended_not_until_its_seal() {
        // Saved at t=40 s, the ranks went on at t=40.2 s, persisted and sealed at t=60 s.
        let mut m = manifest(300, 60_000);
        m.save_ms = Some(20_000);
        m.stall_ms = Some(200);
        assert_eq!(lost_work(10_000, 70_000, Some(&m)).ms, 29_800);
        // A save straight to disk: the training waited for the seal.
        m.stall_ms = None;
        assert_eq!(lost_work(10_000, 70_000, Some(&m)).ms, 10_000);
    }

    #[test]
    fn a_resume_from_memory_keeps_the_work_until_its_ranks_went_on() {
        // Chosen (and stamped) at t=69 s; its ranks went on after staging it at t=55 s.
        let m = manifest(300, 69_000);
        let lost = lost_work_after(10_000, 70_000, 55_000, Some(&m));
        assert_eq!((lost.ms, lost.resume_step), (15_000, Some(300)));
        assert_eq!(
            lost_work(10_000, 70_000, Some(&m)).ms,
            1_000,
            "what the stamp said"
        );
        assert_eq!(lost_work_after(10_000, 70_000, 5_000, Some(&m)).ms, 60_000);
    }

    #[test]
    fn a_checkpoint_older_than_the_generation_keeps_none_of_it() {
        let m = manifest(100, 5_000);
        assert_eq!(lost_work(10_000, 70_000, Some(&m)).ms, 60_000);
    }

    #[test]
    fn clocks_that_went_backwards_lose_nothing_rather_than_wrap() {
        assert_eq!(lost_work(70_000, 10_000, None).ms, 0);
        let f = Formation {
            round_opened_at_ms: 9,
            formed_at_ms: 5,
            lost_work: None,
            door: None,
        };
        assert_eq!(f.duration_ms(), 0);
    }

    #[test]
    fn an_old_record_without_lost_work_decodes() {
        let f: Formation =
            serde_json::from_str(r#"{"round_opened_at_ms":1,"formed_at_ms":3}"#).unwrap();
        assert_eq!(f.duration_ms(), 2);
        assert_eq!(f.lost_work, None);
    }
}
