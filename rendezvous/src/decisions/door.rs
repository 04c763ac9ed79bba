//! The door of a running group: a newcomer whose environment the next re-form would refuse is
//! turned away while the group runs, instead of re-forming it first.
//!
//! At formation the decider records what the admitted members agreed on ([`Door`], in the
//! formation record). When a node asks to join the running generation, node rank 0's session
//! compares the newcomer with it ([`refusal`]). The comparison stands for the whole group and
//! is never stricter than the re-form's own check: keys the members differ on are left out,
//! and the setting is the group's strictest or the newcomer's. So a refusal here is exactly a
//! refusal the re-form would have made (and turned the newcomer away after throwing away the
//! group's work since its last checkpoint); anything else still re-forms and is judged there.

use std::collections::BTreeSet;

use super::envcheck::{effective, verdict, Fingerprint, Report, Verdict};
use crate::store::records::Door;

/// The door of a group formed from `members`; `None` when no member sent a fingerprint (older
/// agents: nothing to compare with).
pub fn door(members: &[Report<'_>]) -> Option<Door> {
    let sent: Vec<&Report<'_>> = members
        .iter()
        .filter(|m| !m.fingerprint.is_empty())
        .collect();
    let first = sent.first()?;
    let mut d = Door {
        env_check: effective(members),
        ..Door::default()
    };
    let keys: BTreeSet<&String> = sent.iter().flat_map(|m| m.fingerprint.keys()).collect();
    for key in keys {
        let v = first.fingerprint.get(key);
        if v.is_some() && sent.iter().all(|m| m.fingerprint.get(key) == v) {
            d.agreed.insert(key.clone(), v.cloned().unwrap_or_default());
        } else {
            d.disputed.insert(key.clone());
        }
    }
    Some(d)
}

/// The refusal of `newcomer` at the door of generation `g` (its message contains
/// [`super::REFUSAL_MARK`]), or `None`: let the re-form decide. A newcomer that sent no
/// fingerprint has no say and is not refused here.
pub fn refusal(door: &Door, g: u64, newcomer: &Report<'_>) -> Option<String> {
    if newcomer.fingerprint.is_empty() {
        return None;
    }
    let compared: Fingerprint = newcomer
        .fingerprint
        .iter()
        .filter(|(k, _)| !door.disputed.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let group = format!("the nodes of generation {g}");
    let pair = [
        Report {
            node_id: &group,
            fingerprint: &door.agreed,
            env_check: Some(door.env_check),
        },
        Report {
            node_id: newcomer.node_id,
            fingerprint: &compared,
            env_check: newcomer.env_check,
        },
    ];
    match verdict(&pair) {
        Verdict::Refuse(why) => Some(why),
        Verdict::Consistent | Verdict::Warn(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::EnvCheck;

    fn fp(pairs: &[(&str, &str)]) -> Fingerprint {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn report<'a>(id: &'a str, f: &'a Fingerprint, c: EnvCheck) -> Report<'a> {
        Report {
            node_id: id,
            fingerprint: f,
            env_check: Some(c),
        }
    }

    const SCRIPT: &str = "config.script-sha256";

    #[test]
    fn a_newcomer_with_another_script_is_refused_even_when_everyone_says_off() {
        let a = fp(&[(SCRIPT, "aaa"), ("torch", "2.4.0")]);
        let d = door(&[
            report("a", &a, EnvCheck::Off),
            report("b", &a, EnvCheck::Off),
        ])
        .unwrap();
        let c = fp(&[(SCRIPT, "ccc"), ("torch", "2.4.0")]);
        let why = refusal(&d, 3, &report("c", &c, EnvCheck::Off)).expect("refused");
        assert!(crate::decisions::envcheck::is_refusal(&why), "{why}");
        assert!(
            why.contains("config.script-sha256 (aaa on the nodes of generation 3; ccc on c)"),
            "{why}"
        );
    }

    #[test]
    fn under_warn_a_different_torch_is_let_in_and_under_strict_it_is_refused() {
        let a = fp(&[(SCRIPT, "s"), ("torch", "2.4.0")]);
        let c = fp(&[(SCRIPT, "s"), ("torch", "2.3.1")]);
        let warn = door(&[report("a", &a, EnvCheck::Warn)]).unwrap();
        assert_eq!(refusal(&warn, 1, &report("c", &c, EnvCheck::Warn)), None);
        // The newcomer's own strict counts, as it would at the re-form.
        assert!(refusal(&warn, 1, &report("c", &c, EnvCheck::Strict)).is_some());
        let strict = door(&[report("a", &a, EnvCheck::Strict)]).unwrap();
        let why = refusal(&strict, 1, &report("c", &c, EnvCheck::Warn)).expect("refused");
        assert!(why.contains("torch (2.3.1 on c; 2.4.0 on"), "{why}");
        assert_eq!(refusal(&strict, 1, &report("c", &a, EnvCheck::Warn)), None);
    }

    #[test]
    fn keys_the_members_differ_on_are_left_to_the_re_form() {
        let a = fp(&[(SCRIPT, "s"), ("torch", "2.4.0"), ("gpu", "A100")]);
        let b = fp(&[(SCRIPT, "s"), ("torch", "2.3.1")]);
        let d = door(&[
            report("a", &a, EnvCheck::Warn),
            report("b", &b, EnvCheck::Warn),
        ])
        .unwrap();
        assert_eq!(d.agreed, fp(&[(SCRIPT, "s")]));
        assert_eq!(
            d.disputed,
            ["gpu", "torch"].iter().map(|s| s.to_string()).collect()
        );
        // A strict newcomer matching neither on torch: the group itself differs there, so only
        // the re-form can say; here it is let through.
        let c = fp(&[(SCRIPT, "s"), ("torch", "2.2.0")]);
        assert_eq!(refusal(&d, 1, &report("c", &c, EnvCheck::Strict)), None);
        // A key none of the members has is a real difference.
        let e = fp(&[(SCRIPT, "s"), ("nccl", "2.21")]);
        assert!(refusal(&d, 1, &report("e", &e, EnvCheck::Strict)).is_some());
    }

    #[test]
    fn without_fingerprints_there_is_no_door_and_no_say() {
        let none = Fingerprint::new();
        assert_eq!(door(&[report("a", &none, EnvCheck::Strict)]), None);
        let a = fp(&[(SCRIPT, "s")]);
        let d = door(&[report("a", &a, EnvCheck::Strict)]).unwrap();
        assert_eq!(
            refusal(&d, 1, &report("old", &none, EnvCheck::Strict)),
            None
        );
    }
}
