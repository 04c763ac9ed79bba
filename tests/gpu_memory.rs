//! No process of a run keeps GPU memory after a stop: a SIGKILL of the agent, a re-form after
//! another node's loss, a restart after a hang. The workers (`gpu_holder.py`) and their children
//! (one in the worker's process group, one in a session of its own) register as GPU memory
//! holders with the fixture `nvidia-smi` (`harness::fake_smi`), which lists every registered
//! process still alive, as the driver does for a process with a CUDA context. The test asks it
//! what a real `nvidia-smi --query-compute-apps` would be asked after the stop
//! (`benches/gpu/proof.sh` asks the real one on a GPU machine).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::cluster::RdzvServer;
use crate::harness::fake_smi::{FakeSmi, HEALTHY};
use crate::harness::{drun, node_cmd, wait_for, worker, Agent};

/// The pids of the workers that wrote `OUT/ready_<RANK>_<PID>` so far.
fn ready(out: &Path) -> BTreeSet<i32> {
    std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("ready_")?.split('_').nth(1)?.parse().ok()
        })
        .collect()
}

/// The processes registered as holders so far (workers and their children).
fn registered(smi: &FakeSmi) -> BTreeSet<i32> {
    std::fs::read_dir(smi.holders())
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect()
}

/// `drun` arguments for `gpu_holder.py` on a node whose `nvidia-smi` is `smi`.
fn holder_args(c: &mut std::process::Command, smi: &FakeSmi, out: &Path, mode: &str) {
    c.env("PATH", smi.path())
        .env_remove("CUDA_VISIBLE_DEVICES")
        .arg(worker("gpu_holder.py"))
        .arg(smi.holders())
        .arg(out)
        .arg(mode);
}

/// Waits until none of `pids` is listed as holding GPU memory (at most `within`).
fn released(smi: &FakeSmi, pids: &BTreeSet<i32>, within: Duration, after: &str) {
    wait_for(
        &format!("no process of the stopped workers to hold GPU memory {after}"),
        within,
        || smi.compute_apps().iter().all(|p| !pids.contains(p)),
    );
}

/// SIGKILL of the agent: its workers and their children go with it, and with them their GPU
/// memory.
#[test]
fn a_sigkilled_agent_leaves_no_process_holding_gpu_memory() {
    let smi = FakeSmi::new(HEALTHY);
    let out = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"]);
    holder_args(&mut c, &smi, out.path(), "sleep");
    let agent = Agent::start(c);
    wait_for("both workers to start", Duration::from_secs(60), || {
        ready(out.path()).len() == 2 && registered(&smi).len() == 6
    });
    let held = registered(&smi);
    assert_eq!(
        smi.compute_apps().into_iter().collect::<BTreeSet<_>>(),
        held,
        "the fixture lists every holder while they run"
    );
    agent.signal(Signal::SIGKILL);
    released(
        &smi,
        &held,
        Duration::from_secs(10),
        "after SIGKILL of the agent",
    );
}

/// A re-form after another node's loss: by the time the survivor's new workers have started,
/// nothing of its old generation holds GPU memory any more.
#[test]
fn a_reform_starts_the_new_workers_with_the_old_ones_gpu_memory_freed() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = server.quick_rdzv();
    let smis = [FakeSmi::new(HEALTHY), FakeSmi::new(HEALTHY)];
    let outs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let start = |i: usize| {
        let mut c = node_cmd(i, "gpu-memory-reform", "1:2", &rdzv);
        holder_args(&mut c, &smis[i], outs[i].path(), "sleep");
        Agent::start(c)
    };
    let survivor = start(0);
    let lost = start(1);
    wait_for("both nodes to train", Duration::from_secs(60), || {
        (0..2).all(|i| ready(outs[i].path()).len() == 2)
    });
    let first = ready(outs[0].path());
    wait_for(
        "the survivor's holders to register",
        Duration::from_secs(10),
        || registered(&smis[0]).len() == 6,
    );
    let held = registered(&smis[0]);
    lost.signal(Signal::SIGKILL);
    wait_for(
        "the survivor's new generation to start",
        Duration::from_secs(60),
        || ready(outs[0].path()).difference(&first).count() == 2,
    );
    let listed: BTreeSet<i32> = smis[0].compute_apps().into_iter().collect();
    let left: Vec<&i32> = listed.intersection(&held).collect();
    assert!(
        left.is_empty(),
        "processes of the old generation still hold GPU memory when the new one has started: {left:?}"
    );
    released(
        &smis[1],
        &registered(&smis[1]),
        Duration::from_secs(10),
        "on the lost node",
    );
    drop(survivor);
}

/// A restart after a hang (`--hang-timeout`): the stuck rank and every other process of the
/// first attempt are gone, GPU memory with them, when the second attempt has started.
#[test]
fn a_hang_restart_starts_the_new_workers_with_the_old_ones_gpu_memory_freed() {
    let smi = FakeSmi::new(HEALTHY);
    let out = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .args(["--hang-timeout", "2", "--max-restarts", "1"])
        .args(["--shutdown-timeout", "3"]);
    holder_args(&mut c, &smi, out.path(), "hang");
    let agent = Agent::start(c);
    wait_for(
        "the first attempt to start",
        Duration::from_secs(60),
        || ready(out.path()).len() == 2 && registered(&smi).len() == 6,
    );
    let first = ready(out.path());
    let held = registered(&smi);
    wait_for(
        "the restart after the hang to start new workers",
        Duration::from_secs(60),
        || ready(out.path()).difference(&first).count() == 2,
    );
    let listed: BTreeSet<i32> = smi.compute_apps().into_iter().collect();
    let left: Vec<&i32> = listed.intersection(&held).collect();
    assert!(
        left.is_empty(),
        "processes of the hung attempt still hold GPU memory when the restart has started: {left:?}"
    );
    let (code, _, err) = agent.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("hang: rank 1"), "{err}");
}
