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
