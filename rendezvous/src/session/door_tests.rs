//! Newcomers judged at the door of a running generation, through real sessions.

use super::test_support::{config, join as join_of, next};
use super::*;
use crate::{Join, MemoryStore};

fn join(node: &str, script: &str) -> Join {
    let mut j = join_of(node, 1);
    j.fingerprint = [("config.script-sha256".to_string(), script.to_string())].into();
    j.env_check = Some(crate::decisions::envcheck::EnvCheck::Warn);
    j
}

fn error(ev: &Event) -> Option<String> {
    match ev {
        Event::Error(e) => Some(e.clone()),
        _ => None,
    }
}

/// Two newcomers with other scripts arrive together while generation 1 runs: each ends with
/// its own refusal (the second verdict does not hide the first), and the group is not
/// re-formed for either.
#[tokio::test]
async fn two_newcomers_turned_away_together_both_hear_their_refusal() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut seen = Vec::new();
    let mut members = Vec::new();
    for n in ["a", "b"] {
        let (tx, rx) = spawn_session(store.clone(), config("door", n, 2, 4), None);
        tx.send(Request::Join(join(n, "good"), 0)).unwrap();
        members.push((tx, rx));
    }
    for (_, rx) in members.iter_mut() {
        let formed = next(rx, &mut seen, |ev| {
            matches!(ev, Event::Formed(_)).then_some(())
        })
        .await;
        assert!(formed.is_some(), "generation 1 formed: {seen:?}");
    }
    let (c_tx, mut c_rx) = spawn_session(store.clone(), config("door", "c", 2, 4), None);
    let (d_tx, mut d_rx) = spawn_session(store.clone(), config("door", "d", 2, 4), None);
    c_tx.send(Request::Join(join("c", "other-c"), 0)).unwrap();
    d_tx.send(Request::Join(join("d", "other-d"), 0)).unwrap();
    let c = next(&mut c_rx, &mut seen, error).await.expect("c refused");
    let d = next(&mut d_rx, &mut seen, error).await.expect("d refused");
    assert!(c.contains("other-c on c"), "{c}");
    assert!(d.contains("other-d on d"), "{d}");
    assert!(
        crate::decisions::envcheck::is_refusal(&c) && crate::decisions::envcheck::is_refusal(&d)
    );
    // The door refused them instead of closing the generation (the one or the other).
    let keys = crate::store::keys::RunKeys::new("door");
    assert_eq!(store.get(&keys.closed(1)).await.unwrap(), None);
    let (g, _) = crate::store::run_state::RunState::new(store.clone(), "door")
        .current_generation()
        .await
        .unwrap();
    assert_eq!(g, 1);
}
