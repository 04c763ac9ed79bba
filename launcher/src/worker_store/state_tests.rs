//! Unit tests of the worker store's state machine: no sockets, no clocks.

use super::codec::{Query, Reply, WaitReply};
use super::codec_tests::k;
use super::state::{parse_counter, State, StoreError};

const STOP: Reply = Reply::Wait(WaitReply::StopWaiting);

fn set(s: &mut State, c: u64, key: &str, v: &str) -> Vec<(u64, Reply)> {
    s.apply(
        c,
        Query::Set {
            key: k(key),
            value: k(v),
        },
    )
    .unwrap()
}

#[test]
fn set_get_delete_num_keys_and_list() {
    let mut s = State::new();
    assert!(set(&mut s, 1, "a", "x").is_empty(), "set has no reply");
    set(&mut s, 1, "b", "y");
    assert_eq!(
        s.apply(1, Query::Get { key: k("a") }).unwrap(),
        [(1, Reply::Bytes(k("x")))]
    );
    assert_eq!(
        s.apply(1, Query::Get { key: k("zz") }).unwrap(),
        [(1, Reply::Bytes(vec![]))]
    );
    assert_eq!(s.apply(1, Query::NumKeys).unwrap(), [(1, Reply::I64(2))]);
    let Reply::Keys(mut keys) = s.apply(1, Query::ListKeys).unwrap().remove(0).1 else {
        panic!()
    };
    keys.sort();
    assert_eq!(keys, [k("a"), k("b")]);
    assert_eq!(
        s.apply(1, Query::DeleteKey { key: k("a") }).unwrap(),
        [(1, Reply::I64(1))]
    );
    assert_eq!(
        s.apply(1, Query::DeleteKey { key: k("a") }).unwrap(),
        [(1, Reply::I64(0))]
    );
    assert_eq!(s.len(), 1);
}

#[test]
fn add_counts_in_decimal_and_refuses_non_numbers() {
    let mut s = State::new();
    assert_eq!(
        s.apply(
            1,
            Query::Add {
                key: k("n"),
                delta: 5
            }
        )
        .unwrap(),
        [(1, Reply::I64(5))]
    );
    assert_eq!(
        s.apply(
            2,
            Query::Add {
                key: k("n"),
                delta: -7
            }
        )
        .unwrap(),
        [(2, Reply::I64(-2))]
    );
    assert_eq!(
        s.apply(1, Query::Get { key: k("n") }).unwrap(),
        [(1, Reply::Bytes(k("-2")))]
    );
    set(&mut s, 1, "t", "text");
    assert!(matches!(
        s.apply(
            1,
            Query::Add {
                key: k("t"),
                delta: 1
            }
        ),
        Err(StoreError::NotANumber { .. })
    ));
    set(&mut s, 1, "m", &i64::MAX.to_string());
    assert!(matches!(
        s.apply(
            1,
            Query::Add {
                key: k("m"),
                delta: 1
            }
        ),
        Err(StoreError::Overflow { .. })
    ));
    assert_eq!(parse_counter(b"  12abc"), Some(12), "strtoll semantics");
    assert_eq!(parse_counter(b"+3"), Some(3));
    assert_eq!(parse_counter(b"-"), None);
}

#[test]
fn compare_set_swaps_only_on_match_and_creates_on_empty_expected() {
    let mut s = State::new();
    let cas = |s: &mut State, e: &str, d: &str| {
        s.apply(
            1,
            Query::CompareSet {
                key: k("c"),
                expected: k(e),
                desired: k(d),
            },
        )
        .unwrap()
    };
    assert_eq!(
        cas(&mut s, "old", "new"),
        [(1, Reply::Bytes(k("old")))],
        "absent: torch echoes expected"
    );
    assert_eq!(s.len(), 0);
    assert_eq!(cas(&mut s, "", "v1"), [(1, Reply::Bytes(k("v1")))]);
    assert_eq!(cas(&mut s, "nope", "v2"), [(1, Reply::Bytes(k("v1")))]);
    assert_eq!(cas(&mut s, "v1", "v2"), [(1, Reply::Bytes(k("v2")))]);
}

#[test]
fn wait_replies_at_once_or_when_the_last_key_arrives_from_any_writer() {
    let mut s = State::new();
    set(&mut s, 1, "a", "1");
    assert_eq!(
        s.apply(2, Query::Wait { keys: vec![k("a")] }).unwrap(),
        [(2, STOP)]
    );
    assert!(s
        .apply(
            2,
            Query::Wait {
                keys: vec![k("a"), k("b"), k("c")]
            }
        )
        .unwrap()
        .is_empty());
    assert_eq!(s.waiters(), 1);
    assert!(set(&mut s, 1, "b", "1").is_empty(), "c still missing");
    assert!(set(&mut s, 1, "b", "2").is_empty(), "b counted once");
    // Any write creating the key wakes: here add; append and multi_set do too.
    assert_eq!(
        s.apply(
            3,
            Query::Add {
                key: k("c"),
                delta: 1
            }
        )
        .unwrap(),
        [(2, STOP), (3, Reply::I64(1))]
    );
    assert_eq!(s.waiters(), 0);
    s.apply(4, Query::Wait { keys: vec![k("d")] }).unwrap();
    s.apply(5, Query::Wait { keys: vec![k("e")] }).unwrap();
    assert_eq!(
        s.apply(
            1,
            Query::Append {
                key: k("d"),
                value: k("x")
            }
        )
        .unwrap(),
        [(4, STOP)]
    );
    let ms = Query::MultiSet {
        pairs: vec![(k("e"), k("1")), (k("f"), k("2"))],
    };
    assert_eq!(s.apply(1, ms).unwrap(), [(5, STOP)]);
    assert_eq!(
        s.apply(1, Query::Get { key: k("d") }).unwrap(),
        [(1, Reply::Bytes(k("x")))]
    );
}

#[test]
fn cancel_and_disconnect_forget_the_wait() {
    let mut s = State::new();
    s.apply(2, Query::Wait { keys: vec![k("a")] }).unwrap();
    assert_eq!(
        s.apply(2, Query::CancelWait).unwrap(),
        [(2, Reply::Wait(WaitReply::Canceled))]
    );
    assert!(
        set(&mut s, 1, "a", "1").is_empty(),
        "a cancelled waiter is not woken"
    );
    s.apply(3, Query::Wait { keys: vec![k("b")] }).unwrap();
    s.disconnect(3);
    assert_eq!(s.waiters(), 0);
    assert!(set(&mut s, 1, "b", "1").is_empty());
}

#[test]
fn check_and_multi_get() {
    let mut s = State::new();
    set(&mut s, 1, "a", "1");
    assert_eq!(
        s.apply(1, Query::Check { keys: vec![k("a")] }).unwrap(),
        [(1, Reply::Check(true))]
    );
    assert_eq!(
        s.apply(
            1,
            Query::Check {
                keys: vec![k("a"), k("b")]
            }
        )
        .unwrap(),
        [(1, Reply::Check(false))]
    );
    let mg = Query::MultiGet {
        keys: vec![k("a"), k("b")],
    };
    assert_eq!(
        s.apply(1, mg).unwrap(),
        [(1, Reply::Values(vec![k("1"), vec![]]))]
    );
}

#[test]
fn queues_push_pop_len_and_wake_one_waiter() {
    let mut s = State::new();
    assert_eq!(
        s.apply(1, Query::QueueLen { key: k("q") }).unwrap(),
        [(1, Reply::I64(0))]
    );
    s.apply(2, Query::Wait { keys: vec![k("q")] }).unwrap();
    s.apply(3, Query::Wait { keys: vec![k("q")] }).unwrap();
    assert_eq!(
        s.apply(
            1,
            Query::QueuePush {
                key: k("q"),
                value: k("x")
            }
        )
        .unwrap(),
        [(2, STOP)]
    );
    assert_eq!(
        s.apply(
            1,
            Query::QueuePush {
                key: k("q"),
                value: k("y")
            }
        )
        .unwrap(),
        [(3, STOP)]
    );
    assert_eq!(
        s.apply(1, Query::QueueLen { key: k("q") }).unwrap(),
        [(1, Reply::I64(2))]
    );
    assert_eq!(
        s.apply(1, Query::Check { keys: vec![k("q")] }).unwrap(),
        [(1, Reply::Check(true))]
    );
    assert_eq!(
        s.apply(2, Query::QueuePop { key: k("q") }).unwrap(),
        [(
            2,
            Reply::Popped {
                len: 2,
                value: Some(k("x"))
            }
        )]
    );
    s.apply(3, Query::QueuePop { key: k("q") }).unwrap();
    assert_eq!(
        s.apply(3, Query::QueuePop { key: k("q") }).unwrap(),
        [(
            3,
            Reply::Popped {
                len: 0,
                value: None
            }
        )]
    );
    assert_eq!(s.len(), 0, "queues are not keys");
}

#[test]
fn barrier_releases_everyone_when_world_size_arrive() {
    let mut s = State::new();
    let bar = |_client: u64| Query::Barrier {
        key: k("bar"),
        world_size: 3,
    };
    assert!(s.apply(1, bar(1)).unwrap().is_empty());
    assert!(s.apply(2, bar(2)).unwrap().is_empty());
    assert_eq!(
        s.apply(3, bar(3)).unwrap(),
        [(1, STOP), (2, STOP), (3, STOP)]
    );
    assert_eq!(
        s.apply(1, Query::Get { key: k("bar") }).unwrap(),
        [(1, Reply::Bytes(k("3")))]
    );
    assert_eq!(s.waiters(), 0);
}

#[test]
fn validate_and_ping_belong_to_the_connection() {
    let mut s = State::new();
    assert!(s.apply(1, Query::Validate { magic: 0 }).is_err());
    assert!(s.apply(1, Query::Ping { nonce: 0 }).is_err());
}
