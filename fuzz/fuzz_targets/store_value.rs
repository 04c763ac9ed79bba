//! Fuzz target: a value read back from the store (generation, plan, join, manifest, node commit); see `rendezvous/src/checks.rs` for what must hold.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    drun_rendezvous::checks::store_value(data);
});
