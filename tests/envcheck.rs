//! The environment check at formation (`--env-check`, `--fingerprint-cmd`): three agents on real
//! etcd, one with another `--fingerprint-cmd` output and one whose worker interpreter reports
//! another torch version (a fake `torch` dist-info and `torch/version.py` on its PYTHONPATH).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::cluster::{Etcd, RdzvServer};
use crate::harness::{worker, Agent};

/// A directory holding a fake torch `version` installation: package metadata and
/// `torch/version.py` (never imported by the probe; importing it would fail loudly).
fn fake_torch(root: &Path, version: &str) -> PathBuf {
    let dir = root.join(format!("torch-{version}"));
    let info = dir.join(format!("torch-{version}.dist-info"));
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(
        info.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("torch")).unwrap();
    std::fs::write(
        dir.join("torch/__init__.py"),
        "raise RuntimeError('the fingerprint probe must not import torch')\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("torch/version.py"),
        format!("__version__ = '{version}'\ncuda: str = '12.4'\ngit_version = 'abc'\nhip = None\n"),
    )
    .unwrap();
    dir
}

/// The three agents of job `run` on rendezvous `rdzv`: node 1 has another image digest, node 2
/// another torch; `extra` flags go to node `extra_node` only.
fn three(rdzv: &[&str], run: &str, tmp: &Path, extra: &[&str], extra_node: usize) -> Vec<Agent> {
    let torch_a = fake_torch(tmp, "2.4.0");
    let torch_b = fake_torch(tmp, "2.3.1");
    (0..3)
        .map(|i| {
            let mut c = crate::harness::node_cmd(i, run, "3", rdzv);
            let image = if i == 1 { "sha256:bbbb" } else { "sha256:aaaa" };
            c.args(["--fingerprint-cmd", &format!("echo {image}")])
                .env("XDG_CACHE_HOME", tmp.join("cache"))
                .env("PYTHONPATH", if i == 2 { &torch_b } else { &torch_a })
                .args(["--rdzv-conf", "join_timeout=60"]);
            if i == 0 {
                c.env("CUDA_VISIBLE_DEVICES", "0,1");
            }
            if i == extra_node {
                c.args(extra);
            }
            c.arg(worker("envdump.py")).arg(tmp.join("out"));
            Agent::start(c)
        })
        .collect()
}

fn node_id(a: &Agent, i: usize) -> String {
    format!("127.0.0.{}_{}", i + 1, a.pid())
}

#[test]
fn warn_forms_and_every_agent_prints_the_differing_keys_once() {
    let etcd = Etcd::start();
    let tmp = tempfile::tempdir().unwrap();
    let agents = three(&on_etcd(&etcd), "envwarn", tmp.path(), &[], 0);
    let ids: Vec<String> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| node_id(a, i))
        .collect();
    let mut tables = Vec::new();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "agent {i}: {err}");
        if err.contains("rank table of generation 1") {
            tables.push(err.clone());
        }
        assert_eq!(
            err.matches("environments differ in").count(),
            1,
            "one table per generation on agent {i}: {err}"
        );
        assert!(err.contains("differ in 2 key(s)"), "agent {i}: {err}");
        let row = |key: &str, value: &str| {
            err.lines()
                .find(|l| l.contains(value) && (key.is_empty() || l.contains(key)))
                .unwrap_or_else(|| panic!("no row {key} {value} on agent {i}: {err}"))
                .to_string()
        };
        assert!(row("fingerprint-cmd", "sha256:aaaa").contains(&format!("{}, {}", ids[0], ids[2])));
        assert!(row("", "sha256:bbbb").ends_with(&ids[1]));
        assert!(row("torch", "2.3.1").ends_with(&ids[2]));
        assert!(row("", "2.4.0").contains(&format!("{}, {}", ids[0], ids[1])));
    }
    assert_eq!(tables.len(), 1, "node rank 0 alone prints the rank table");
    rank_table_matches_the_workers(&tables[0], &tmp.path().join("out"));
}

/// The rank table in node rank 0's `stderr` lists every rank once and agrees with the workers'
/// own environment dumps in `dir` (pids and CUDA_VISIBLE_DEVICES for node rank 0's workers).
fn rank_table_matches_the_workers(stderr: &str, dir: &Path) {
    let rows: Vec<Vec<&str>> = stderr
        .lines()
        .skip_while(|l| !l.contains("rank table of generation 1"))
        .skip(2)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .take_while(|r| r.len() >= 6 && r[0].parse::<u32>().is_ok())
        .collect();
    let ranks: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(ranks, ["0", "1", "2", "3", "4", "5"], "{stderr}");
    for r in &rows {
        let dump = crate::harness::read_json(&dir.join(format!("env_{}.json", r[0])));
        let env = &dump["env"];
        assert_eq!(env["GROUP_RANK"], r[1], "{r:?}");
        assert_eq!(env["LOCAL_RANK"], r[3], "{r:?}");
        let host = format!("127.0.0.{}", r[1].parse::<u32>().unwrap() + 1);
        assert_eq!(r[2], host, "nodes rank by address here: {r:?}");
        if r[1] == "0" {
            assert_eq!(env["MASTER_ADDR"], r[2], "{r:?}");
            assert_eq!(dump["pid"].to_string(), r[4], "{r:?}");
            assert_eq!(env["CUDA_VISIBLE_DEVICES"], r[5], "{r:?}");
        } else {
            assert_eq!((r[4], r[5]), ("-", "-"), "{r:?}");
        }
    }
}

fn on_etcd(etcd: &Etcd) -> [&str; 4] {
    ["--rdzv-backend", "etcd", "--rdzv-endpoint", &etcd.endpoint]
}

#[test]
fn strict_on_one_node_refuses_on_every_node_naming_node_and_key() {
    let etcd = Etcd::start();
    strict_refuses(&on_etcd(&etcd));
}

#[test]
fn strict_refuses_through_a_rendezvous_server_too() {
    let server = RdzvServer::start(&["--store", "memory"]);
    strict_refuses(&["--rdzv-endpoint", &server.endpoint]);
}

fn strict_refuses(rdzv: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let agents = three(rdzv, "envstrict", tmp.path(), &["--env-check", "strict"], 1);
    let ids: Vec<String> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| node_id(a, i))
        .collect();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 2, "agent {i}: {err}");
        assert!(
            err.contains("env-check refused to form the group"),
            "agent {i}: {err}"
        );
        assert!(
            err.contains(&format!(
                "torch (2.3.1 on {}; 2.4.0 on {}, {})",
                ids[2], ids[0], ids[1]
            )),
            "agent {i}: {err}"
        );
        assert!(
            err.contains(&format!("sha256:bbbb on {}", ids[1])),
            "agent {i}: {err}"
        );
        assert!(!tmp.path().join("out").exists(), "no worker started");
    }
}

#[test]
fn agents_started_with_different_nnodes_are_refused() {
    let etcd = Etcd::start();
    let tmp = tempfile::tempdir().unwrap();
    let agents: Vec<Agent> = ["2", "2:3"]
        .iter()
        .enumerate()
        .map(|(i, nnodes)| {
            let mut c: Command = crate::harness::node_cmd(
                i,
                "envnnodes",
                nnodes,
                &["--rdzv-backend", "etcd", "--rdzv-endpoint", &etcd.endpoint],
            );
            c.args(["--env-check", "off", "--rdzv-conf", "last_call_timeout=1"])
                .env("XDG_CACHE_HOME", tmp.path().join("cache"))
                .arg(worker("envdump.py"))
                .arg(tmp.path().join("out"));
            Agent::start(c)
        })
        .collect();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 2, "agent {i}: {err}");
        assert!(err.contains("config.nnodes (2:2 on"), "agent {i}: {err}");
        assert!(err.contains("2:3 on"), "agent {i}: {err}");
    }
}

#[test]
fn a_newcomer_with_another_nnodes_is_turned_away_without_re_forming_the_running_job() {
    let etcd = Etcd::start();
    let tmp = tempfile::tempdir().unwrap();
    let agent = |i: usize, nnodes: &str| {
        let mut c = crate::harness::node_cmd(i, "envnew", nnodes, &on_etcd(&etcd));
        c.env("XDG_CACHE_HOME", tmp.path().join("cache")).args([
            "--rdzv-conf",
            "last_call_timeout=0",
            "--no-python",
            "sleep",
            "4",
        ]);
        Agent::start(c)
    };
    let members = [agent(0, "2:3"), agent(1, "2:3")];
    crate::harness::wait_for("generation 1 runs", Duration::from_secs(30), || {
        members
            .iter()
            .all(|a| a.stderr_so_far().contains("world formed"))
    });
    let newcomer = agent(2, "3");
    let c_id = node_id(&newcomer, 2);
    let (code, _, err) = newcomer.wait(Duration::from_secs(60));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("env-check refused to form the group"), "{err}");
    assert!(err.contains(&format!("3:3 on {c_id}")), "{err}");
    assert!(
        err.contains("2:3 on the nodes of generation 1"),
        "turned away at the door of the running generation: {err}"
    );
    for (i, a) in members.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 0, "member {i}: {err}");
        // Turned away at the door: the running group was not re-formed for it.
        assert!(
            !err.contains("re-forming") && !err.contains("gen=2"),
            "member {i}: {err}"
        );
    }
}
