//! Fuzz target: an agent's gRPC message, decoded and read as a request; see `rendezvous/src/checks.rs` for what must hold.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    drun_rendezvous::checks::agent_message(data);
});
