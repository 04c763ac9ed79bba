//! The resume point's rule, pure: the newest sealed manifest not marked bad, from the ledger or
//! from a joining node's checkpoint directory.

use std::collections::BTreeMap;

use super::Manifest;

/// The newest manifest not in `bad`, among `stored` (the ledger's) and `hints` (read from
/// checkpoint directories by the joining nodes; only run `run_id`'s count), and whether it is a
/// hint (the formation then imports it into the ledger). A stored manifest wins a tie.
pub fn newest_good(
    run_id: &str,
    stored: Vec<Manifest>,
    bad: &BTreeMap<String, String>,
    hints: &[&Manifest],
) -> (Option<Manifest>, bool) {
    let best_stored = stored
        .into_iter()
        .filter(|m| !bad.contains_key(&m.id()))
        .max_by_key(|m| (m.step, m.generation));
    let best_hint = hints
        .iter()
        .filter(|m| m.run_id == run_id && !bad.contains_key(&m.id()))
        .max_by_key(|m| (m.step, m.generation))
        .map(|m| (*m).clone());
    match (best_stored, best_hint) {
        (Some(s), Some(h)) if (h.step, h.generation) > (s.step, s.generation) => (Some(h), true),
        (Some(s), _) => (Some(s), false),
        (None, Some(h)) => (Some(h), true),
        (None, None) => (None, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(run: &str, step: u64, g: u64) -> Manifest {
        Manifest::bare(run, step, g, 0)
    }

    #[test]
    fn the_newest_good_manifest_wins_a_newer_hint_is_imported() {
        let none = BTreeMap::new();
        assert_eq!(newest_good("r", vec![], &none, &[]), (None, false));
        let stored = vec![m("r", 10, 1), m("r", 20, 1)];
        assert_eq!(
            newest_good("r", stored.clone(), &none, &[&m("r", 20, 1)]),
            (Some(m("r", 20, 1)), false)
        );
        assert_eq!(
            newest_good(
                "r",
                stored.clone(),
                &none,
                &[&m("r", 30, 1), &m("x", 90, 1)]
            ),
            (Some(m("r", 30, 1)), true)
        );
        let bad = BTreeMap::from([(m("r", 20, 1).id(), "torn".to_string())]);
        assert_eq!(
            newest_good("r", stored, &bad, &[&m("r", 20, 1)]),
            (Some(m("r", 10, 1)), false)
        );
    }
}
