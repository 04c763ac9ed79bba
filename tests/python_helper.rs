//! The Python helper's own unit tests (`python/tests`), run with the torch venv so the sampler is
//! compared with the real `DistributedSampler`.

use std::process::Command;

use crate::harness::{root, torch_python};

#[test]
fn python_helper_unit_tests_pass() {
    let Some(python) = torch_python() else { return };
    let o = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(root().join("python/tests"))
        .env("DRUN_REQUIRE_TORCH", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("test_same_indices_per_rank_and_epoch") && !err.contains("skipped"),
        "the DistributedSampler comparison ran:\n{err}"
    );
}
