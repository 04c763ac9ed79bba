//! Property tests: the store-value and wire decoders under random and mutated bytes, and the
//! decision core under random event sequences (`core_model`).
//!
//! Each decoder target is one `check_*` function run three ways: on proptest's random inputs,
//! on valid encodings with random byte edits, and on the committed corpus of nasty inputs
//! under `rendezvous/corpus/<target>/`. Proptest keeps the inputs of any failure under
//! `proptest-regressions/` (commit them: they are replayed first on every run).

mod core_model;
mod decode;
mod model;

use proptest::prelude::*;

/// Proptest's settings for a target of `cases` random cases, times `DRUN_PROPS_SCALE` (a
/// positive integer, default 1): CI runs the bounded pass, a longer fuzz pass is
/// `DRUN_PROPS_SCALE=100 cargo test -p drun-launcher -p drun-rendezvous --lib props::`.
pub fn config(cases: u32) -> ProptestConfig {
    let scale = std::env::var("DRUN_PROPS_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(1);
    ProptestConfig::with_cases(cases.saturating_mul(scale))
}

/// Random byte edits of a valid encoding: (position, what to do, byte).
pub type Edits = Vec<(usize, u8, u8)>;

/// Applies `edits` to `bytes`: overwrite, insert, delete or truncate at a position (taken
/// modulo the length), the way a fuzzer mutates a seed.
pub fn mutate(mut bytes: Vec<u8>, edits: &Edits) -> Vec<u8> {
    for &(at, op, b) in edits {
        let at = if bytes.is_empty() {
            0
        } else {
            at % bytes.len()
        };
        match op % 4 {
            0 if !bytes.is_empty() => bytes[at] = b,
            1 => bytes.insert(at, b),
            2 if !bytes.is_empty() => {
                bytes.remove(at);
            }
            3 => bytes.truncate(at),
            _ => {}
        }
    }
    bytes
}

/// Up to 8 byte edits.
pub fn edits() -> impl Strategy<Value = Edits> {
    prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8)
}

/// Every file of corpus `target` of the crate at `dir` (`CARGO_MANIFEST_DIR`), by name.
///
/// # Panics
/// The corpus directory is missing or empty (a target without a corpus is a mistake).
pub fn corpus(dir: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let path = std::path::Path::new(dir).join("corpus").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", path.display()))
        .map(|e| {
            let e = e.expect("corpus entry");
            let bytes = std::fs::read(e.path()).expect("corpus file");
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    assert!(!out.is_empty(), "corpus {} is empty", path.display());
    out.sort();
    out
}
