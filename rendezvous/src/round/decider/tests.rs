//! The decider's pure parts.

use super::*;

fn cand(id: &str) -> Candidate {
    Candidate {
        node_id: id.into(),
        advertise_addr: "127.0.0.1".into(),
        slots: 1,
        requested_node_rank: None,
        master_port: 29500,
        probe_port: 0,
    }
}

#[test]
fn newcomers_batched_beside_the_running_generation_are_not_settled_for_again() {
    let plan = assign("job", 1, &[cand("a"), cand("b")], 0, 0).unwrap();
    let mut batched = HashSet::new();
    // c and d wait while generation 1 runs (its last call gathers them): nothing to settle.
    let waiting = [cand("c"), cand("d")];
    assert_eq!(
        fresh_newcomers(Some(&plan), &waiting, true, &mut batched),
        0
    );
    // Generation 1 closed to admit them; the members are back: no fresh arrival, form at once.
    let all = [cand("a"), cand("b"), cand("c"), cand("d")];
    assert_eq!(fresh_newcomers(Some(&plan), &all, false, &mut batched), 0);
    // One more node arrives during the re-form: it is worth the settle window.
    let more = [cand("a"), cand("b"), cand("c"), cand("d"), cand("e")];
    assert_eq!(fresh_newcomers(Some(&plan), &more, false, &mut batched), 1);
}

#[test]
fn newcomers_of_a_re_form_not_seen_beside_a_running_generation_are_fresh() {
    // After a loss (the generation closed before anyone waited beside it), a newcomer that
    // arrives during the re-form is settled for; the members never are; a first formation has
    // no newcomers.
    let plan = assign("job", 1, &[cand("a"), cand("b"), cand("c")], 0, 0).unwrap();
    let mut batched = HashSet::new();
    let waiting = [cand("a"), cand("b"), cand("x")];
    assert_eq!(
        fresh_newcomers(Some(&plan), &waiting, false, &mut batched),
        1
    );
    assert_eq!(fresh_newcomers(None, &waiting, false, &mut batched), 0);
}
