//! The source tree keeps its conventions (docs/contributing/development.md): unit tests are a
//! `tests` submodule of the module they test — inline, or a file in that module's folder
//! (`foo.rs` → `foo/tests.rs`) — never a file pulled in from elsewhere with `#[path]`.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn unit_tests_live_in_their_modules_folder_without_path_attributes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for krate in ["rendezvous/src", "launcher/src"] {
        rust_files(&root.join(krate), &mut files);
    }
    assert!(files.len() > 100, "found the crates' sources");
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .any(|l| l.trim_start().starts_with("#[path"))
        })
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "#[path] includes (move the tests to the module's folder, e.g. foo.rs → foo/tests.rs): {offenders:?}"
    );
}

/// Rendezvous library files that may touch the store directly: the backends and the door.
/// Not all of `store/`: its records, keys and reports stay outside (they only encode).
const STORE_LAYER: &[&str] = &[
    "store.rs",
    "store/memory.rs",
    "store/etcd.rs",
    "store/etcd/",
    "store/shared_lease.rs",
    "store/shared_lease/",
    "store/run_state.rs",
    "store/run_state/",
];

/// Library files not behind the door yet, each with why. Shrink it; never grow it.
const NOT_BEHIND_THE_DOOR: &[(&str, &str)] = &[(
    "session/keeper.rs",
    "renews the agent's lease on its own task: a lease, no key of the run",
)];

/// What only the store layer may write: a transaction's parts and the store's key calls
/// (whitespace removed, so a call split over lines is found too).
const RAW_STORE: &[&str] = &[
    "Op::",
    "Txn{",
    "Compare::",
    "store.get(",
    "store.get_prefix(",
    "store.txn(",
    "store.put(",
    "store.watch_prefix(",
    "store.lease_grant(",
    "store.lease_keep_alive(",
    "store.lease_revoke(",
];

/// The raw store calls of one rendezvous source file outside its tests: comment lines and an
/// inline `#[cfg(test)] mod tests { … }` (which closes the file) left out.
fn raw_store_calls(text: &str) -> Vec<&'static str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim() == "mod tests {")
        .unwrap_or(lines.len());
    let code: String = lines[..end]
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    RAW_STORE
        .iter()
        .copied()
        .filter(|p| code.contains(p))
        .collect()
}

#[test]
fn only_the_store_door_reads_and_writes_a_runs_keys() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("rendezvous/src");
    for p in STORE_LAYER {
        assert!(
            src.join(p).exists(),
            "STORE_LAYER names {p}, which is not there any more"
        );
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut offenders = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let name = rel.rsplit('/').next().unwrap();
        let test_file = name == "tests.rs"
            || name.ends_with("_tests.rs")
            || name == "test_support.rs"
            || rel.starts_with("props/");
        let exempt = STORE_LAYER
            .iter()
            .any(|p| rel == *p || (p.ends_with('/') && rel.starts_with(p)))
            || NOT_BEHIND_THE_DOOR.iter().any(|(p, _)| rel == *p);
        if test_file || exempt {
            continue;
        }
        let calls = raw_store_calls(&std::fs::read_to_string(f).unwrap());
        if !calls.is_empty() {
            offenders.push(format!("{rel}: {}", calls.join(" ")));
        }
    }
    assert!(
        offenders.is_empty(),
        "raw store access outside the door (give `store::run_state::RunState` a named method for it): {offenders:#?}"
    );
    for (p, why) in NOT_BEHIND_THE_DOOR {
        let text = std::fs::read_to_string(src.join(p)).unwrap_or_default();
        assert!(
            !raw_store_calls(&text).is_empty(),
            "{p} is behind the door now ({why}): take it off NOT_BEHIND_THE_DOOR"
        );
    }
}
