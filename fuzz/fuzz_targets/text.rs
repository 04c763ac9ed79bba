//! Fuzz target: hostlist, --rdzv-conf, --rdzv-endpoint and the other flag values (any UTF-8, lossily); see `launcher/src/checks.rs` for what must hold.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    drun_launcher::checks::text(&String::from_utf8_lossy(data));
});
