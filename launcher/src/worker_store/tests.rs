//! Unit tests of the worker store's codec (bytes recorded from torch 2.15's client) and state
//! machine (no sockets).

use super::codec::{decode, DecodeError, Query, Reply, WaitReply, MAX_KEY_LEN};
use super::state::{parse_counter, State, StoreError};

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

fn k(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn enc(r: &Reply) -> Vec<u8> {
    let mut v = Vec::new();
    r.encode(&mut v);
    v
}

#[test]
fn decodes_the_handshake_torch_sends_in_one_segment() {
    // Validate with the magic number, then Ping with the client's pid as nonce.
    let b = hex("00 ce f7 85 3c 0d 09 1f 00 00");
    let (q, n) = decode(&b).unwrap().unwrap();
    assert_eq!(q, Query::Validate { magic: 0x3C85_F7CE });
    let (q2, n2) = decode(&b[n..]).unwrap().unwrap();
    assert_eq!(q2, Query::Ping { nonce: 0x1f09 });
    assert_eq!(n + n2, b.len());
    assert_eq!(enc(&Reply::U32(0x1f09)), hex("09 1f 00 00"));
}

#[test]
fn decodes_every_query_as_recorded_from_torch() {
    let cases = [
        ("01 02 00 00 00 00 00 00 00 2f 6b 02 00 00 00 00 00 00 00 76 31",
         Query::Set { key: k("/k"), value: k("v1") }),
        ("02 02 00 00 00 00 00 00 00 2f 6b 02 00 00 00 00 00 00 00 76 31 02 00 00 00 00 00 00 00 76 32",
         Query::CompareSet { key: k("/k"), expected: k("v1"), desired: k("v2") }),
        ("03 02 00 00 00 00 00 00 00 2f 6b", Query::Get { key: k("/k") }),
        ("04 02 00 00 00 00 00 00 00 2f 6e 05 00 00 00 00 00 00 00",
         Query::Add { key: k("/n"), delta: 5 }),
        ("05 02 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 6b 03 00 00 00 00 00 00 00 2f 7a 7a",
         Query::Check { keys: vec![k("/k"), k("/zz")] }),
        ("06 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 6b", Query::Wait { keys: vec![k("/k")] }),
        ("07", Query::NumKeys),
        ("08 02 00 00 00 00 00 00 00 2f 6e", Query::DeleteKey { key: k("/n") }),
        ("09 02 00 00 00 00 00 00 00 2f 6b 01 00 00 00 00 00 00 00 78",
         Query::Append { key: k("/k"), value: k("x") }),
        ("0a 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 6b", Query::MultiGet { keys: vec![k("/k")] }),
        ("0b 02 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 61 01 00 00 00 00 00 00 00 31 02 00 00 00 00 00 00 00 2f 62 01 00 00 00 00 00 00 00 32",
         Query::MultiSet { pairs: vec![(k("/a"), k("1")), (k("/b"), k("2"))] }),
        ("0c", Query::CancelWait),
        ("0e 02 00 00 00 00 00 00 00 2f 71 02 00 00 00 00 00 00 00 71 71",
         Query::QueuePush { key: k("/q"), value: k("qq") }),
        ("0f 02 00 00 00 00 00 00 00 2f 71", Query::QueuePop { key: k("/q") }),
        ("10 02 00 00 00 00 00 00 00 2f 71", Query::QueueLen { key: k("/q") }),
        ("11", Query::ListKeys),
        ("12 04 00 00 00 00 00 00 00 2f 62 61 72 01 00 00 00 00 00 00 00",
         Query::Barrier { key: k("/bar"), world_size: 1 }),
    ];
    for (bytes, want) in cases {
        let b = hex(bytes);
        assert_eq!(
            decode(&b).unwrap(),
            Some((want.clone(), b.len())),
            "{bytes}"
        );
        // Every strict prefix is incomplete, never an error.
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut]).unwrap(), None, "{want:?} cut at {cut}");
        }
    }
}

#[test]
fn rejects_unknown_commands_and_oversized_lengths() {
    assert_eq!(decode(&[19]), Err(DecodeError::UnknownCommand(19)));
    let mut b = vec![3];
    b.extend_from_slice(&(MAX_KEY_LEN + 1).to_le_bytes());
    assert!(matches!(
        decode(&b),
        Err(DecodeError::TooLong { what: "key", .. })
    ));
    let mut b = vec![6];
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(decode(&b), Err(DecodeError::TooManyKeys(_))));
}

#[test]
fn encodes_replies_as_torch_reads_them() {
    assert_eq!(
        enc(&Reply::Bytes(k("v1"))),
        hex("02 00 00 00 00 00 00 00 76 31")
    );
    assert_eq!(enc(&Reply::I64(5)), hex("05 00 00 00 00 00 00 00"));
    assert_eq!(enc(&Reply::Check(true)), [0]);
    assert_eq!(enc(&Reply::Check(false)), [1]);
    assert_eq!(enc(&Reply::Wait(WaitReply::StopWaiting)), [0]);
    assert_eq!(enc(&Reply::Wait(WaitReply::Canceled)), [1]);
    assert_eq!(
        enc(&Reply::Popped {
            len: 1,
            value: Some(k("qq"))
        }),
        hex("01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 71 71")
    );
    assert_eq!(
        enc(&Reply::Popped {
            len: 0,
            value: None
        }),
        hex("00 00 00 00 00 00 00 00")
    );
    assert_eq!(
        enc(&Reply::Keys(vec![k("/b")])),
        hex("01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 62")
    );
    assert_eq!(
        enc(&Reply::Values(vec![k("a"), vec![]])),
        hex("01 00 00 00 00 00 00 00 61 00 00 00 00 00 00 00 00")
    );
}

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
