//! Unit tests of the watch's decoding: store events into the generation core's inputs.

use super::*;
use crate::session::protocol::RunEnd;
use crate::store::KeyValue;

fn put(key: String, value: &str) -> WatchEvent {
    WatchEvent::Put(KeyValue {
        key,
        value: value.as_bytes().to_vec().into(),
        create_revision: 1,
        mod_revision: 1,
        lease: None,
    })
}

#[test]
fn watch_events_are_classified_by_key() {
    let k = RunKeys::new("run");
    let c = |ev| classify(&k, 3, ev).expect("decodes");
    assert_eq!(c(put(k.closed(3), "why")), Input::Closed("why".into()));
    assert_eq!(
        c(put(k.preempt(3), "{}")),
        Input::SaveRequest(b"{}".to_vec())
    );
    assert_eq!(
        c(put(k.scale_up_save(3), "{}")),
        Input::SaveRequest(b"{}".to_vec())
    );
    assert_eq!(c(put(k.ckpt_latest(), "id")), Input::Sealed("id".into()));
    assert_eq!(
        c(put(k.waiting("d"), "{}")),
        Input::Waiting("d".into(), None)
    );
    assert_eq!(c(put(k.member(3, "b"), "{}")), Input::MemberUp("b".into()));
    assert_eq!(
        c(put(k.member(2, "b"), "{}")),
        Input::Other,
        "another generation"
    );
    assert_eq!(c(WatchEvent::Delete(k.waiting("d"), 2)), Input::WaitingGone);
    assert_eq!(
        c(WatchEvent::Delete(k.member(3, "b"), 2)),
        Input::MemberGone("b".into())
    );
    assert_eq!(c(put(k.plan(3), "{}")), Input::Other);
}

#[test]
fn a_corrupt_run_end_is_an_error() {
    let k = RunKeys::new("run");
    assert!(matches!(
        classify(&k, 3, put(k.finished(), "not json")),
        Err(StoreError::Corrupt { .. })
    ));
    let end = r#"{"success":true,"reason":"ok","at_ms":1}"#;
    assert!(matches!(
        classify(&k, 3, put(k.finished(), end)),
        Ok(Input::Finished(RunEnd { success: true, .. }))
    ));
}

#[test]
fn an_interval_save_due_key_is_a_save_request() {
    let k = RunKeys::new("run");
    assert_eq!(
        classify(&k, 3, put(k.save_due(3, "L2"), "{}")).expect("decodes"),
        Input::SaveRequest(b"{}".to_vec())
    );
}
