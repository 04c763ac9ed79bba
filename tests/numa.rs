//! `--numa-binding` and `--virtual-local-rank` on a node whose topology is a fixture tree
//! (`DRUN_TOPOLOGY_ROOT`): two NUMA nodes of one CPU each, one GPU on each, the GPUs in the
//! opposite order of the nodes. The binding itself is real: each worker reads the CPUs the
//! kernel lets it and a thread it starts run on.

use std::path::Path;
use std::time::Duration;

use crate::harness::{drun, run, torch_python, DrunCmd};

/// The CPUs this process may use (`Cpus_allowed_list`).
fn allowed() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// Node 0 holds CPU `a`, node 1 CPU `b`; GPU 0000:01:00.0 sits on node 1, 0000:02:00.0 on 0.
fn fixture(root: &Path, a: usize, b: usize) {
    let w = |p: String, text: String| {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    w("sys/devices/system/node/possible".into(), "0-1\n".into());
    for (node, cpu) in [(0, a), (1, b)] {
        w(
            format!("sys/devices/system/node/node{node}/cpulist"),
            format!("{cpu}\n"),
        );
        let base = format!("sys/devices/system/cpu/cpu{cpu}/topology");
        w(format!("{base}/thread_siblings_list"), format!("{cpu}\n"));
        w(format!("{base}/physical_package_id"), format!("{node}\n"));
    }
    for (pci, node) in [("0000:01:00.0", 1), ("0000:02:00.0", 0)] {
        w(
            format!("proc/driver/nvidia/gpus/{pci}/information"),
            format!("GPU UUID: GPU-{node}\n"),
        );
        w(
            format!("sys/bus/pci/devices/{pci}/numa_node"),
            format!("{node}\n"),
        );
    }
}

/// Prints, per rank, the CPUs the worker and a thread it starts may run on, its LOCAL_RANK and
/// CUDA_VISIBLE_DEVICES.
const WORKER: &str = r#"import os, threading
seen = {}
t = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
t.start(); t.join()
print("rank", os.environ["RANK"], "cpus", sorted(os.sched_getaffinity(0)), "thread", seen["thread"],
      "local_rank", os.environ["LOCAL_RANK"], "visible", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
"#;

fn bound_run(warm: &str, extra: &[&str]) -> Option<(String, String, usize, usize)> {
    let cpus = allowed();
    if cpus.len() < 2 {
        eprintln!(
            "skipped: this machine lets the test use {} CPU(s), the fixture needs 2",
            cpus.len()
        );
        return None;
    }
    let (a, b) = (cpus[0], cpus[1]);
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path(), a, b);
    let script = dir.path().join("where.py");
    std::fs::write(&script, WORKER).unwrap();
    let mut c = drun();
    if let Some(python) = torch_python() {
        // Warm interpreters need torch; without it the workers start cold, bound the same way.
        c.python(&python);
    }
    c.env("DRUN_TOPOLOGY_ROOT", dir.path())
        .env_remove("CUDA_VISIBLE_DEVICES")
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "--warm-workers",
            warm,
        ])
        .args(extra)
        .arg(&script);
    let (code, out, err) = run(c, Duration::from_secs(120));
    assert_eq!(code, 0, "{err}");
    Some((out, err, a, b))
}

fn line_of(out: &str, rank: u32) -> String {
    out.lines()
        .find(|l| l.contains(&format!("rank {rank} cpus")))
        .unwrap_or_else(|| panic!("no line of rank {rank}:\n{out}"))
        .to_string()
}

/// Each local rank runs on the CPU of its GPU's NUMA node (local rank 0's GPU is on node 1),
/// and so does every thread it starts; warm and cold workers alike; the start says so.
#[test]
fn each_worker_and_its_threads_run_on_the_cpus_of_its_gpus_numa_node() {
    for warm in ["on", "off"] {
        let Some((out, err, a, b)) = bound_run(warm, &["--numa-binding", "node"]) else {
            return;
        };
        for (rank, cpu) in [(0, b), (1, a)] {
            let line = line_of(&out, rank);
            assert!(
                line.contains(&format!("cpus [{cpu}] thread [{cpu}]")),
                "warm {warm}: rank {rank} should run on CPU {cpu}: {line}"
            );
        }
        assert!(
            err.contains(&format!(
                "--numa-binding node: local rank 0 → CPUs {b} (GPU 0000:01:00.0, NUMA node 1); local rank 1 → CPUs {a} (GPU 0000:02:00.0, NUMA node 0)"
            )),
            "{err}"
        );
    }
}

/// Without the flag nothing is bound: each worker may use every CPU the agent may.
#[test]
fn without_the_flag_workers_keep_every_cpu() {
    let Some((out, _, a, b)) = bound_run("off", &[]) else {
        return;
    };
    assert!(
        line_of(&out, 0).contains(&format!("cpus [{a}, {b}")),
        "{out}"
    );
}

/// `--virtual-local-rank`: every worker's LOCAL_RANK is 0 and it sees only its own GPU.
#[test]
fn a_virtual_local_rank_sees_only_its_own_gpu() {
    let Some((out, _, _, _)) = bound_run("off", &["--virtual-local-rank"]) else {
        return;
    };
    for rank in [0, 1] {
        let line = line_of(&out, rank);
        assert!(
            line.ends_with(&format!("local_rank 0 visible {rank}")),
            "{line}"
        );
    }
}

/// A node without an NVIDIA GPU refuses `--numa-binding` in one line, exit 2, nothing started.
#[test]
fn numa_binding_on_a_node_without_gpus_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.env("DRUN_TOPOLOGY_ROOT", dir.path()).args([
        "--standalone",
        "--numa-binding",
        "socket",
        "--no-python",
        "true",
    ]);
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim(),
        "drun: error: invalid --numa-binding 'socket': this node has no NVIDIA GPU (no /proc/driver/nvidia/gpus): drop --numa-binding on nodes without GPUs",
    );
}
