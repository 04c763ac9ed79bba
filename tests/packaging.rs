//! Packaging: one version for the wheel, the three binaries and the `drun` Python helper.
//!
//! The wheel itself (maturin, `pyproject.toml`) is built, installed into a fresh venv without a
//! Rust toolchain and used to train by `.ci/wheel`; this checks what that script relies on.

use std::process::Command;

use crate::harness::root;

/// The helper's `__version__` literal in `python/drun/_version.py`.
fn helper_version_literal() -> String {
    let text = std::fs::read_to_string(root().join("python/drun/_version.py")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("__version__ = "))
        .expect("python/drun/_version.py assigns __version__");
    line.trim_start_matches("__version__ = ")
        .trim_matches('"')
        .to_string()
}

#[test]
fn the_helper_and_the_binaries_have_the_workspace_version() {
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        helper_version_literal(),
        version,
        "python/drun/_version.py must say the [workspace.package] version of Cargo.toml"
    );

    // The module as Python imports it from a checkout.
    let o = Command::new("python3")
        .args(["-c", "import drun; print(drun.__version__)"])
        .env("PYTHONPATH", root().join("python"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), version);

    for (name, bin) in [
        ("drun", env!("CARGO_BIN_EXE_drun")),
        ("drun-rendezvous", env!("CARGO_BIN_EXE_drun-rendezvous")),
        ("drun-ckpt", env!("CARGO_BIN_EXE_drun-ckpt")),
    ] {
        let o = Command::new(bin).arg("--version").output().unwrap();
        assert!(o.status.success(), "{name} --version");
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            format!("{name} {version}")
        );
    }
}

#[test]
fn the_wheel_takes_its_version_from_cargo_and_packages_the_binaries_and_the_helper() {
    let text = std::fs::read_to_string(root().join("pyproject.toml")).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for expected in [
        "build-backend = \"maturin\"",
        "dynamic = [\"version\"]",
        "bindings = \"bin\"",
        "python-source = \"python\"",
        "python-packages = [\"drun\"]",
    ] {
        assert!(
            lines.contains(&expected),
            "pyproject.toml lacks `{expected}`"
        );
    }
    assert!(
        !lines.iter().any(|l| l.starts_with("version =")),
        "pyproject.toml must not pin a version of its own (maturin takes Cargo's)"
    );
    assert!(
        root().join("python/drun/__init__.py").is_file(),
        "python-source = \"python\" holds the drun package"
    );
}
