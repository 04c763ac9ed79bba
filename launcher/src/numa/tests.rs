use std::path::Path;

use super::cpus::cpus_for;
use super::topology::{format_list, parse_list, read_topology, visible, Cpus, Gpu, Topology};
use super::*;

fn set(text: &str) -> Cpus {
    parse_list(text).unwrap()
}

/// Two sockets with two NUMA nodes each, 8 cores per node with hyper-threads (cpu c and
/// c + 32 share a core), one last-level cache per 4 cores; GPUs on nodes `gpu_nodes`.
fn dgx_like(gpu_nodes: &[usize]) -> Topology {
    let mut t = Topology {
        gpus: gpu_nodes
            .iter()
            .enumerate()
            .map(|(i, &node)| Gpu {
                pci: format!("0000:{:02x}:00.0", i + 1),
                node,
            })
            .collect(),
        ..Topology::default()
    };
    for node in 0..4usize {
        let first = node * 8;
        let mut cpus = Cpus::new();
        for c in first..first + 8 {
            for cpu in [c, c + 32] {
                cpus.insert(cpu);
                t.siblings.insert(cpu, [c, c + 32].into());
                t.socket.insert(cpu, node / 2);
                let ccx = first + (c - first) / 4 * 4;
                t.llc
                    .insert(cpu, (ccx..ccx + 4).chain(ccx + 32..ccx + 36).collect());
            }
        }
        t.node_cpus.insert(node, cpus);
    }
    t
}

fn all() -> Cpus {
    (0..64).collect()
}

#[test]
fn node_binds_to_every_cpu_of_the_gpus_numa_node() {
    let t = dgx_like(&[0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(
        cpus_for(NumaMode::Node, 3, &t, &all()).unwrap(),
        set("8-15,40-47")
    );
    assert_eq!(
        cpus_for(NumaMode::Node, 0, &t, &all()).unwrap(),
        set("0-7,32-39")
    );
}

#[test]
fn socket_binds_to_every_numa_node_of_the_gpus_socket() {
    let t = dgx_like(&[0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(
        cpus_for(NumaMode::Socket, 3, &t, &all()).unwrap(),
        set("0-15,32-47")
    );
    assert_eq!(
        cpus_for(NumaMode::Socket, 5, &t, &all()).unwrap(),
        set("16-31,48-63")
    );
}

#[test]
fn exclusive_divides_the_nodes_physical_cores_among_its_gpus_with_their_hyperthreads() {
    let t = dgx_like(&[0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(
        cpus_for(NumaMode::Exclusive, 2, &t, &all()).unwrap(),
        set("8-11,40-43")
    );
    assert_eq!(
        cpus_for(NumaMode::Exclusive, 3, &t, &all()).unwrap(),
        set("12-15,44-47")
    );
    // Three GPUs on one node of 8 cores: 3, 3 and 2 cores, the first ones one more.
    let t = dgx_like(&[1, 1, 1]);
    let got: Vec<String> = (0..3)
        .map(|d| format_list(&cpus_for(NumaMode::Exclusive, d, &t, &all()).unwrap()))
        .collect();
    assert_eq!(got, ["8-10,40-42", "11-13,43-45", "14-15,46-47"]);
}

#[test]
fn core_complex_gives_each_gpu_its_own_last_level_cache_and_wraps_around() {
    let t = dgx_like(&[1, 1, 1]);
    let got: Vec<String> = (0..3)
        .map(|d| format_list(&cpus_for(NumaMode::CoreComplex, d, &t, &all()).unwrap()))
        .collect();
    assert_eq!(got, ["8-11,40-43", "12-15,44-47", "8-11,40-43"]);
}

#[test]
fn only_cpus_the_agent_may_use_are_handed_out() {
    let t = dgx_like(&[0, 0]);
    // A cpuset (a cgroup's, Slurm's) without the hyper-threads and without core 0.
    let allowed = set("1-31");
    assert_eq!(
        cpus_for(NumaMode::Node, 0, &t, &allowed).unwrap(),
        set("1-7")
    );
    assert_eq!(
        cpus_for(NumaMode::Exclusive, 0, &t, &allowed).unwrap(),
        set("1-4")
    );
    assert_eq!(
        cpus_for(NumaMode::Exclusive, 1, &t, &allowed).unwrap(),
        set("5-7")
    );
    // The largest cache domain first: cores 4-7 are whole, 1-3 are not.
    assert_eq!(
        cpus_for(NumaMode::CoreComplex, 0, &t, &allowed).unwrap(),
        set("4-7")
    );
    assert_eq!(
        cpus_for(NumaMode::Node, 0, &t, &set("8-15")).unwrap_err(),
        NumaError::NoCpu { node: 0 }
    );
}

#[test]
fn a_rank_without_a_gpu_and_too_few_cores_are_refused_by_name() {
    let t = dgx_like(&[0, 0]);
    assert_eq!(
        cpus_for(NumaMode::Node, 2, &t, &all()).unwrap_err(),
        NumaError::NoDevice {
            device: 2,
            count: 2
        }
    );
    let t = dgx_like(&[0; 9]);
    let err = cpus_for(NumaMode::Exclusive, 0, &t, &all()).unwrap_err();
    assert_eq!(
        err,
        NumaError::TooFewCores {
            node: 0,
            cores: 8,
            devices: 9
        }
    );
    assert!(err.to_string().contains("use --numa-binding node"), "{err}");
}

#[test]
fn cpu_lists_parse_and_print_as_sysfs_writes_them() {
    assert_eq!(set("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11].into());
    assert_eq!(format_list(&set("0-3,8,10-11")), "0-3,8,10-11");
    assert_eq!(set(""), Cpus::new());
    assert!(parse_list("3-1").is_err());
    assert!(parse_list("x").is_err());
}

#[test]
fn cuda_visible_devices_picks_and_orders_the_gpus_as_cuda_does() {
    let gpus = vec![
        (
            "0000:01:00.0".to_string(),
            Some("GPU-aaaa-1111".to_string()),
        ),
        (
            "0000:02:00.0".to_string(),
            Some("GPU-bbbb-2222".to_string()),
        ),
        ("0000:03:00.0".to_string(), None),
    ];
    assert_eq!(visible(&gpus, None).unwrap().len(), 3);
    assert_eq!(
        visible(&gpus, Some("2,0")).unwrap(),
        ["0000:03:00.0", "0000:01:00.0"]
    );
    assert_eq!(visible(&gpus, Some("GPU-bbbb")).unwrap(), ["0000:02:00.0"]);
    // CUDA stops at the first index it has no device for.
    assert_eq!(visible(&gpus, Some("1,7,0")).unwrap(), ["0000:02:00.0"]);
    assert!(visible(&gpus, Some("GPU-")).is_err(), "an ambiguous prefix");
}

/// Writes a node's topology files under `root`: NUMA nodes (cpu list, socket) with one CPU per
/// core and one cache domain per node, and GPUs (PCI address, NUMA node).
pub(crate) fn write_fixture(root: &Path, nodes: &[(&str, usize)], gpus: &[(&str, i64)]) {
    let w = |p: String, text: String| {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let possible = format_list(&(0..nodes.len()).collect());
    w(
        "sys/devices/system/node/possible".into(),
        format!("{possible}\n"),
    );
    for (n, (cpulist, socket)) in nodes.iter().enumerate() {
        w(
            format!("sys/devices/system/node/node{n}/cpulist"),
            format!("{cpulist}\n"),
        );
        for cpu in set(cpulist) {
            let base = format!("sys/devices/system/cpu/cpu{cpu}");
            w(
                format!("{base}/topology/thread_siblings_list"),
                format!("{cpu}\n"),
            );
            w(
                format!("{base}/topology/physical_package_id"),
                format!("{socket}\n"),
            );
            w(format!("{base}/cache/index0/type"), "Instruction\n".into());
            w(format!("{base}/cache/index0/level"), "1\n".into());
            w(
                format!("{base}/cache/index0/shared_cpu_list"),
                format!("{cpu}\n"),
            );
            w(format!("{base}/cache/index3/type"), "Unified\n".into());
            w(format!("{base}/cache/index3/level"), "3\n".into());
            w(
                format!("{base}/cache/index3/shared_cpu_list"),
                format!("{cpulist}\n"),
            );
        }
    }
    for (pci, node) in gpus {
        w(
            format!("proc/driver/nvidia/gpus/{pci}/information"),
            format!("Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-{pci}\n"),
        );
        w(
            format!("sys/bus/pci/devices/{pci}/numa_node"),
            format!("{node}\n"),
        );
    }
}

#[test]
fn the_topology_is_read_from_sysfs_and_the_drivers_proc_entries() {
    let dir = tempfile::tempdir().unwrap();
    write_fixture(
        dir.path(),
        &[("0-3", 0), ("4-7", 1)],
        &[("0000:b1:00.0", 1), ("0000:3b:00.0", -1)],
    );
    let t = read_topology(dir.path(), None).unwrap();
    // PCI order; a single-node machine's -1 reads as node 0.
    assert_eq!(
        t.gpus,
        [
            Gpu {
                pci: "0000:3b:00.0".into(),
                node: 0
            },
            Gpu {
                pci: "0000:b1:00.0".into(),
                node: 1
            }
        ]
    );
    assert_eq!(t.node_cpus[&1], set("4-7"));
    assert_eq!(t.socket[&5], 1);
    assert_eq!(t.llc[&5], set("4-7"), "the highest data or unified level");
    let b = resolve(NumaMode::Node, 2, dir.path(), Some("1,0"), &all()).unwrap();
    assert_eq!(b.cpus, [set("4-7"), set("0-3")]);
    assert_eq!(
        b.describe(),
        "--numa-binding node: local rank 0 → CPUs 4-7 (GPU 0000:b1:00.0, NUMA node 1); local rank 1 → CPUs 0-3 (GPU 0000:3b:00.0, NUMA node 0)"
    );
    let none = tempfile::tempdir().unwrap();
    assert_eq!(
        resolve(NumaMode::Node, 1, none.path(), None, &all()).unwrap_err(),
        NumaError::NoGpu
    );
}
