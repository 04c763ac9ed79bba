//! Fuzz target: a worker-API request line; see `launcher/src/checks.rs` for what must hold.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    drun_launcher::checks::api_line(data);
});
