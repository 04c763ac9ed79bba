//! The promises of the server's decoders, as plain functions of their input: every store value
//! (`gen/current`, plans, joins, manifests, node commits) and the agent's gRPC messages. Each
//! panics when a promise breaks and returns otherwise.
//!
//! Shared by the property tests (`props`, every `cargo test`) and the coverage-guided fuzz
//! targets under `fuzz/` (`cargo +nightly fuzz run TARGET`, built with `--cfg fuzzing`).

use drun_proto::v1 as pb;
use prost::Message;

use crate::ledger::{parse_id, Manifest, NodeCommit};
use crate::server::wire::request_from_wire;
use crate::store::run_state::{decode, decode_generation, decode_plan};
use crate::{Join, Plan, StoreError};

/// Any bytes as a store value: a value or [`StoreError::Corrupt`] naming the key, never a panic.
pub fn store_value(bytes: &[u8]) {
    let corrupt = |e: StoreError| {
        assert!(
            matches!(e, StoreError::Corrupt { ref key, .. } if key == "k"),
            "{e}"
        )
    };
    match decode_generation("k", bytes) {
        Ok(g) => assert_eq!(
            std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()),
            Some(g)
        ),
        Err(e) => corrupt(e),
    }
    let _ = decode_plan("k", &bytes::Bytes::copy_from_slice(bytes)).map_err(corrupt);
    let _ = decode::<Join>("k", bytes).map_err(corrupt);
    let _ = decode::<Manifest>("k", bytes).map_err(corrupt);
    let _ = decode::<NodeCommit>("k", bytes).map_err(corrupt);
    let _ = parse_id(&String::from_utf8_lossy(bytes));
}

/// Any bytes as an agent's gRPC message: decoded or refused, then read as a request.
pub fn agent_message(bytes: &[u8]) {
    if let Ok(m) = pb::AgentMessage::decode(bytes) {
        let _ = request_from_wire(m);
    }
    if let Ok(p) = pb::Plan::decode(bytes) {
        let _ = Plan::from(p);
    }
}
