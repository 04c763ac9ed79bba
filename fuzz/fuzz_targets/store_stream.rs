//! Fuzz target: a TCPStore byte stream as the worker store reads it; see `launcher/src/checks.rs` for what must hold.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    drun_launcher::checks::store_stream(data);
});
