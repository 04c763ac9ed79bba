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

/// The helper's `drun.PROTOCOL` (defined in `python/drun/_agent.py`, the helper's connection to
/// the agent) is the agent's `ckpt::api::PROTOCOL` (the `hello` check).
#[test]
fn python_helper_speaks_the_agents_protocol() {
    let helper = std::fs::read_to_string(root().join("python/drun/_agent.py")).unwrap();
    let theirs = helper
        .lines()
        .find_map(|l| l.strip_prefix("PROTOCOL = "))
        .expect("python/drun/_agent.py defines PROTOCOL = N");
    assert_eq!(
        theirs.trim().parse::<u32>().unwrap(),
        drun_launcher::ckpt::api::PROTOCOL,
        "bump python/drun's PROTOCOL with the agent's"
    );
}
