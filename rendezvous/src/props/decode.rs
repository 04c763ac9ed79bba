//! The store values (`gen/current`, plans, joins, manifests, node commits) and the agent's wire
//! messages under random bytes: decoding never panics, answers a clear error or a value, and
//! every encoder's output decodes back to what it encoded.

use drun_proto::v1 as pb;
use proptest::prelude::*;
use prost::Message;

use super::{corpus, edits, mutate};
use crate::checks;
use crate::decisions::envcheck::EnvCheck;
use crate::ledger::{manifest_id, parse_id, Cursor, Manifest, NodeCommit, Retention, ShardFile};
use crate::server::wire::{request_from_wire, request_to_wire};
use crate::store::run_state::{decode, decode_generation, encode, encode_generation};
use crate::{assign, Candidate, Join, Plan, Request};

const CASES: u32 = 3_000;
const DIR: &str = env!("CARGO_MANIFEST_DIR");

fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,12}", "[a-z0-9.-]{1,12}"]
}

fn candidate() -> impl Strategy<Value = Candidate> {
    (
        text(),
        text(),
        1u32..=8,
        prop::option::of(0u32..16),
        any::<u16>(),
    )
        .prop_map(
            |(node_id, advertise_addr, slots, requested_node_rank, master_port)| Candidate {
                node_id,
                advertise_addr,
                slots,
                requested_node_rank,
                master_port,
                probe_port: 0,
            },
        )
}

fn manifest() -> impl Strategy<Value = Manifest> {
    let file = (any::<u32>(), text(), any::<u64>(), "[0-9a-f]{64}").prop_map(
        |(rank, path, bytes, digest)| ShardFile {
            rank,
            path,
            bytes,
            digest,
        },
    );
    let cursor = (any::<u64>(), any::<u64>(), any::<u64>(), any::<i64>()).prop_map(
        |(epoch, consumed_in_epoch, consumed_total, seed)| Cursor {
            epoch,
            consumed_in_epoch,
            consumed_total,
            seed,
            ..Cursor::default()
        },
    );
    let f = prop::collection::vec(file, 0..4);
    (
        text(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        cursor,
        f,
        any::<u64>(),
        prop::option::of(text()),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
    )
        .prop_map(
            |(
                run_id,
                step,
                generation,
                world_size,
                cursor,
                files,
                sealed_at_ms,
                adopted_from,
                save_ms,
                stall_ms,
            )| Manifest {
                run_id,
                step,
                generation,
                world_size,
                cursor,
                files,
                sealed_at_ms,
                adopted_from,
                save_ms,
                stall_ms,
            },
        )
}

fn join() -> impl Strategy<Value = Join> {
    let check = prop_oneof![
        Just(None),
        Just(Some(EnvCheck::Off)),
        Just(Some(EnvCheck::Strict))
    ];
    let fp = prop::collection::btree_map(text(), text(), 0..3);
    (candidate(), prop::option::of(manifest()), fp, check).prop_map(
        |(candidate, hint, fingerprint, env_check)| Join {
            candidate,
            resume_hint: hint.map(Box::new),
            fingerprint,
            env_check,
            held: Vec::new(),
        },
    )
}

fn plan() -> impl Strategy<Value = Plan> {
    let nodes = prop::collection::vec(candidate(), 1..6);
    (
        text(),
        1u64..,
        nodes,
        any::<u32>(),
        any::<u32>(),
        prop::option::of(manifest()),
        prop::collection::vec(text(), 0..2),
    )
        .prop_map(|(run, g, nodes, f, m, resume, notes)| {
            let mut plan = assign(&run, g, &nodes, f, m).expect("slots ≥ 1");
            plan.resume = resume;
            plan.notes = notes;
            plan
        })
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..256)
}

/// `r` sent by an agent and read by the server: encoded, decoded, read as a request.
fn via_wire(r: &Request) -> Option<Request> {
    let wire = request_to_wire(r).encode_to_vec();
    request_from_wire(pb::AgentMessage::decode(wire.as_slice()).expect("our own encoding"))
}

proptest! {
    #![proptest_config(super::config(CASES))]

    #[test]
    fn store_values_never_panic(bytes in bytes()) {
        checks::store_value(&bytes);
    }

    #[test]
    fn store_values_round_trip(g in 1u64.., step in any::<u64>(), plan in plan(), join in join()) {
        prop_assert_eq!(decode_generation("k", &encode_generation(g)).unwrap(), g);
        prop_assert_eq!(decode::<Plan>("k", &encode(&plan)).unwrap(), plan.clone());
        prop_assert_eq!(decode::<Join>("k", &encode(&join)).unwrap(), join.clone());
        prop_assert_eq!(parse_id(&manifest_id(step, g)), Some((step, g)));
        prop_assert_eq!(Plan::from(pb::Plan::from(&plan)), plan);
        let join = Request::Join(join, g);
        prop_assert_eq!(via_wire(&join), Some(join));
    }

    #[test]
    fn mutated_store_values_never_panic(plan in plan(), join in join(), e in edits()) {
        checks::store_value(&mutate(encode(&plan), &e));
        checks::store_value(&mutate(encode(&join), &e));
    }

    #[test]
    fn agent_messages_never_panic(bytes in bytes(), m in manifest(), e in edits()) {
        checks::agent_message(&bytes);
        let commit = NodeCommit {
            node_id: m.run_id.clone(),
            generation: m.generation,
            step: m.step,
            ranks: vec![0, 1],
            cursor: m.cursor.clone(),
            files: m.files.clone(),
            save_started_ms: m.save_ms,
            staged_ms: m.stall_ms,
        };
        let req = Request::Commit { commit, retention: Retention::default() };
        prop_assert_eq!(via_wire(&req), Some(req.clone()));
        checks::agent_message(&mutate(request_to_wire(&req).encode_to_vec(), &e));
    }
}

#[test]
fn the_store_value_corpus_decodes_or_is_refused() {
    for (name, bytes) in corpus(DIR, "store_value") {
        eprintln!("store_value/{name}");
        checks::store_value(&bytes);
    }
}

#[test]
fn the_agent_message_corpus_decodes_or_is_refused() {
    for (name, bytes) in corpus(DIR, "agent_message") {
        eprintln!("agent_message/{name}");
        checks::agent_message(&bytes);
    }
}
