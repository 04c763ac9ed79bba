//! Unit tests of the worker store's codec, on bytes recorded from torch 2.15's client.

use super::codec::{decode, DecodeError, Query, Reply, WaitReply, MAX_KEY_LEN};

pub(super) fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

pub(super) fn k(s: &str) -> Vec<u8> {
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
