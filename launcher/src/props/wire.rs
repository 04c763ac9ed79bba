//! The worker API's request lines and the worker store's TCPStore queries under random bytes:
//! never a panic, one answer per request line, a clear refusal or a query that decodes back to
//! what was encoded.

use proptest::prelude::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{corpus, edits, mutate};
use crate::checks;
use crate::ckpt::api::{ApiRequest, ApiServer};
use crate::worker_store::codec::{decode, Query};

const CASES: u32 = 4_000;
/// Socket sessions are slower than parsing: fewer of them.
const SOCKET_CASES: u32 = 200;

/// Valid requests of every op, as a worker helper writes them.
fn request() -> impl Strategy<Value = Value> {
    let rank = any::<u32>();
    let file = ("/[a-z/]{1,12}", any::<u64>(), "[0-9a-f]{64}")
        .prop_map(|(p, b, h)| json!({"path": p, "bytes": b, "sha256": h}));
    prop_oneof![
        (
            rank,
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(file, 0..3)
        )
            .prop_map(|(r, g, s, f)| json!({
                "op": "commit", "rank": r, "generation": g, "step": s, "files": f,
                "cursor": {"epoch": 0, "consumed_in_epoch": s},
            })),
        Just(json!({"op": "resume"})),
        (rank, any::<u64>())
            .prop_map(|(r, s)| json!({"op": "progress", "rank": r, "step": s, "samples": 8})),
        rank.prop_map(|r| json!({"op": "should_save", "rank": r})),
        rank.prop_map(|r| json!({"op": "preflight", "rank": r, "skipped": "no GPU"})),
        any::<u32>().prop_map(|p| json!({"op": "hello", "protocol": p})),
    ]
}

/// A TCPStore query as torch's client writes it (the test's own encoder).
fn encode(q: &Query) -> Vec<u8> {
    fn bytes(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s);
    }
    let mut o = Vec::new();
    match q {
        Query::Validate { magic } => {
            o.push(0);
            o.extend_from_slice(&magic.to_le_bytes());
        }
        Query::Set { key, value } => {
            o.push(1);
            bytes(&mut o, key);
            bytes(&mut o, value);
        }
        Query::Get { key } => {
            o.push(3);
            bytes(&mut o, key);
        }
        Query::Add { key, delta: n } | Query::Barrier { key, world_size: n } => {
            o.push(if matches!(q, Query::Add { .. }) {
                4
            } else {
                18
            });
            bytes(&mut o, key);
            o.extend_from_slice(&n.to_le_bytes());
        }
        Query::Check { keys } | Query::Wait { keys } | Query::MultiGet { keys } => {
            o.push(match q {
                Query::Check { .. } => 5,
                Query::Wait { .. } => 6,
                _ => 10,
            });
            o.extend_from_slice(&(keys.len() as u64).to_le_bytes());
            keys.iter().for_each(|k| bytes(&mut o, k));
        }
        Query::NumKeys => o.push(7),
        Query::Ping { nonce } => {
            o.push(13);
            o.extend_from_slice(&nonce.to_le_bytes());
        }
        other => unreachable!("not generated: {other:?}"),
    }
    o
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..128)
}

fn query() -> impl Strategy<Value = Query> {
    let key = || prop::collection::vec(any::<u8>(), 0..16);
    let keys = prop::collection::vec(key(), 0..4);
    prop_oneof![
        any::<u32>().prop_map(|magic| Query::Validate { magic }),
        (key(), key()).prop_map(|(key, value)| Query::Set { key, value }),
        key().prop_map(|key| Query::Get { key }),
        (key(), any::<i64>()).prop_map(|(key, delta)| Query::Add { key, delta }),
        keys.clone().prop_map(|keys| Query::Check { keys }),
        keys.clone().prop_map(|keys| Query::Wait { keys }),
        keys.prop_map(|keys| Query::MultiGet { keys }),
        Just(Query::NumKeys),
        any::<u32>().prop_map(|nonce| Query::Ping { nonce }),
        (key(), any::<i64>()).prop_map(|(key, world_size)| Query::Barrier { key, world_size }),
    ]
}

/// Writes `lines` to a fresh worker API socket whose agent answers every call, and returns the
/// answers read back.
async fn converse(lines: &[Vec<u8>]) -> Vec<Value> {
    let (server, mut calls) = ApiServer::start().expect("socket");
    tokio::spawn(async move {
        while let Some((_, reply)) = calls.recv().await {
            let _ = reply.send(json!({"ok": true}));
        }
    });
    let s = tokio::net::UnixStream::connect(server.path())
        .await
        .expect("connect");
    let (r, mut w) = s.into_split();
    let mut out: Vec<u8> = lines.join(&b'\n');
    out.push(b'\n');
    let writer = tokio::spawn(async move { w.write_all(&out).await.map(|_| w) });
    let mut answers = Vec::new();
    let mut r = BufReader::new(r).lines();
    for _ in lines {
        let line = r
            .next_line()
            .await
            .expect("read")
            .expect("an answer per line");
        answers.push(serde_json::from_str(&line).expect("answers are JSON"));
    }
    let _ = writer.await;
    answers
}

proptest! {
    #![proptest_config(super::config(CASES))]

    #[test]
    fn api_lines_never_panic(bytes in bytes(), req in request(), e in edits()) {
        checks::api_line(&bytes);
        let line = serde_json::to_vec(&req).unwrap();
        prop_assert!(serde_json::from_slice::<ApiRequest>(&line).is_ok(), "{req}");
        checks::api_line(&mutate(line, &e));
    }

    #[test]
    fn store_queries_round_trip(
        qs in prop::collection::vec(query(), 1..4),
        bytes in bytes(),
        e in edits(),
    ) {
        checks::store_stream(&bytes);
        let wire: Vec<u8> = qs.iter().flat_map(encode).collect();
        let first = encode(&qs[0]);
        for cut in 0..first.len() {
            prop_assert_eq!(decode(&first[..cut]), Ok(None), "a part of a query waits for more");
        }
        let mut rest = wire.as_slice();
        for q in &qs {
            let (got, used) = decode(rest).unwrap().unwrap();
            prop_assert_eq!(&got, q);
            rest = &rest[used..];
        }
        prop_assert!(rest.is_empty());
        checks::store_stream(&mutate(wire, &e));
    }
}

proptest! {
    #![proptest_config(super::config(SOCKET_CASES))]

    #[test]
    fn the_api_socket_answers_every_line_once(
        lines in prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                (request(), edits()).prop_map(|(r, e)| mutate(serde_json::to_vec(&r).unwrap(), &e)),
            ],
            1..8,
        ),
    ) {
        let lines: Vec<Vec<u8>> = lines
            .into_iter()
            .map(|l| l.into_iter().filter(|&b| b != b'\n').collect())
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let answers = rt.block_on(converse(&lines));
        for a in answers {
            prop_assert!(a["ok"].is_boolean(), "{a}");
            prop_assert!(a["ok"] == true || a["error"].is_string(), "{a}");
        }
    }
}

#[test]
fn the_wire_corpora_decode_or_are_refused() {
    for (name, bytes) in corpus("api_line") {
        eprintln!("api_line/{name}");
        checks::api_line(&bytes);
        let lines: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(converse(&lines)).len(), lines.len());
    }
    for (name, bytes) in corpus("store_query") {
        eprintln!("store_query/{name}");
        checks::store_stream(&bytes);
    }
}
