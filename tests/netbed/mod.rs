//! Faults from the network, on hosts built as network namespaces (`harness::netbed`): the bed
//! itself here, and drun's agents across each fault by concern: a pulled cable (`cable`), a
//! slowed link (`slowed`), a control-plane outage (`outage`), a partition between peers
//! (`partition`), saturated cores (`saturated`), a world cut off from the server (`cut_off`), one
//! host cut off from the server alone (`server_path`).
//! The helpers they share (hosts that train, the stage of a server and three hosts, what the
//! workers recorded) are here.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::cluster::RdzvServer;
use crate::harness::netbed::{bed_namespaces, Bed};
use crate::harness::{alive, drun, torch_python, wait_for, worker, Agent, DrunCmd};

mod cable;
mod cut_off;
mod outage;
mod partition;
mod saturated;
mod server_path;
mod slowed;

/// A stdlib TCP listener on a host; killed and reaped on drop.
struct Listener(std::process::Child);

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A stdlib TCP listener on port 7000 of host `name`, accepting until dropped.
fn listener(bed: &Bed, name: &str) -> Listener {
    let mut c = Command::new("python3");
    c.args([
        "-c",
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('0.0.0.0',7000))\ns.listen()\nprint('up',flush=True)\n\
         while True:\n  s.accept()[0].close()",
    ]);
    let mut child = bed
        .on(name, &c)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a listener");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "up");
    Listener(child)
}

/// Whether host `from` opens a TCP connection to `to`'s port 7000 within half a second.
fn reaches(bed: &Bed, from: &str, to: &str) -> bool {
    let mut c = Command::new("python3");
    c.args([
        "-c",
        "import socket,sys\nsocket.create_connection((sys.argv[1],7000),timeout=0.5).close()",
    ])
    .arg(&bed.host(to).addr);
    bed.on(from, &c)
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// What `cmd` prints on host `name`.
fn output_on(bed: &Bed, name: &str, program: &str, args: &[&str]) -> String {
    let mut c = Command::new(program);
    c.args(args);
    let o = bed.on(name, &c).output().unwrap();
    assert!(o.status.success(), "{program} {args:?} on {name}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn bed_hosts_have_their_own_name_and_address_and_each_fault_cuts_only_its_path() {
    let Some(bed) = Bed::new(&["a", "b", "c"]) else {
        return;
    };
    assert_eq!(
        output_on(&bed, "a", "cat", &["/proc/sys/kernel/hostname"]).trim(),
        "a"
    );
    assert!(output_on(&bed, "b", "ip", &["-4", "addr", "show", "eth0"])
        .contains(&format!("inet {}/24", bed.host("b").addr)));
    let routes = output_on(&bed, "a", "ip", &["route"]);
    assert!(
        !routes.contains("default"),
        "no way out of the bed: {routes}"
    );
    let listeners = [listener(&bed, "b"), listener(&bed, "c")];
    let d = Duration::from_secs(10);
    wait_for("a reaches b and c", d, || {
        reaches(&bed, "a", "b") && reaches(&bed, "a", "c")
    });

    bed.partition("a", "b");
    assert!(!reaches(&bed, "a", "b"), "partitioned");
    assert!(
        reaches(&bed, "a", "c") && reaches(&bed, "c", "b"),
        "other paths stay"
    );
    bed.heal("a", "b");
    wait_for("a reaches b after the heal", d, || reaches(&bed, "a", "b"));

    bed.partition_one_way("b", "a");
    assert!(
        !reaches(&bed, "a", "b"),
        "b's answers are lost on the way back"
    );
    bed.heal("a", "b");

    bed.pull_cable("c");
    assert!(
        !reaches(&bed, "a", "c") && !reaches(&bed, "b", "c"),
        "cable pulled"
    );
    assert!(reaches(&bed, "a", "b"));
    bed.plug_cable("c");
    wait_for("a reaches c after the cable is back", d, || {
        reaches(&bed, "a", "c")
    });

    bed.limit_rate("c", "20mbit");
    let qdisc = output_on(&bed, "c", "tc", &["qdisc", "show", "dev", "eth0"]);
    assert!(qdisc.contains("tbf") && qdisc.contains("20Mbit"), "{qdisc}");
    bed.unlimit_rate("c");
    let qdisc = output_on(&bed, "c", "tc", &["qdisc", "show", "dev", "eth0"]);
    assert!(!qdisc.contains("tbf"), "{qdisc}");

    let names = bed.namespaces();
    assert!(!bed.pids_on("b").is_empty());
    drop(listeners);
    drop(bed);
    let left: Vec<String> = bed_namespaces()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn a_bed_is_removed_when_its_test_panics() {
    let Some(probe) = Bed::new(&["x"]) else {
        return;
    };
    drop(probe);
    let names = std::sync::Mutex::new(Vec::new());
    let r = std::panic::catch_unwind(|| {
        let bed = Bed::new(&["x", "y"]).unwrap();
        *names.lock().unwrap() = bed.namespaces();
        let _l = listener(&bed, "y");
        panic!("the test fails half-way");
    });
    assert!(r.is_err());
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 3);
    let left: Vec<String> = bed_namespaces()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// One agent per host of `hosts` on `bed`: run `run` of `nnodes` nodes through `server`, one
/// torch worker each on the bed's `eth0`, a 3 s shutdown grace; `rest` adds the flags, the
/// script and its arguments.
fn trainers(
    bed: &Bed,
    hosts: &[&str],
    server: &RdzvServer,
    python: &Path,
    (run, nnodes): (&str, &str),
    rest: impl Fn(&mut Command),
) -> Vec<Agent> {
    hosts
        .iter()
        .map(|name| {
            let mut c = drun();
            c.job(run, nnodes)
                .nproc(1)
                .quick_shutdown()
                .python(python)
                .args(["--local-addr", &bed.host(name).addr])
                .args(["--rdzv-endpoint", &server.endpoint])
                .env("GLOO_SOCKET_IFNAME", "eth0");
            rest(&mut c);
            Agent::start(bed.on(name, &c))
        })
        .collect()
}

/// A bed of `server` and `n0`–`n2`, a memory-store rendezvous server on `server` logging to
/// `dir/server.log`, an empty `dir/records` for the workers, and torch's Python.
struct Stage {
    python: std::path::PathBuf,
    bed: Bed,
    dir: tempfile::TempDir,
    server: RdzvServer,
    out: std::path::PathBuf,
}

/// The [`Stage`], or `None` (skipped, with a note) without torch or a bed.
fn stage() -> Option<Stage> {
    let python = torch_python()?;
    let bed = Bed::new(&["server", "n0", "n1", "n2"])?;
    let dir = tempfile::tempdir().unwrap();
    let server = RdzvServer::start_in(
        &bed,
        "server",
        &["--store", "memory"],
        "info",
        &dir.path().join("server.log"),
    );
    let out = dir.path().join("records");
    std::fs::create_dir(&out).unwrap();
    Some(Stage {
        python,
        bed,
        dir,
        server,
        out,
    })
}

/// The highest generation with a record in `dir`, and how many records it has.
fn newest_generation(dir: &Path) -> Option<(u64, usize)> {
    let mut gens: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("gen")?.split('_').next()?.parse().ok()
        })
        .collect();
    gens.sort_unstable();
    let g = *gens.last()?;
    Some((g, gens.iter().filter(|x| **x == g).count()))
}

/// The default lease TTL: the cable tests run at the defaults.
const TTL: u64 = 10;

/// The step times of `steps_rank<rank>.log` in `dir` (`paced_steps.py`), in seconds.
fn step_times(dir: &Path, rank: u32) -> Vec<f64> {
    std::fs::read_to_string(dir.join(format!("steps_rank{rank}.log")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// The worker events of `ckpt_worker.py` in `out` (one JSON object per line).
fn ckpt_events(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The steps generation `g` sealed: a seal the ranks heard (`ckpt_worker.py`'s events in `out`),
/// or, checkpoints in memory being the default (a commit is answered staged before its step is
/// persisted and sealed), a manifest in `ckpt`.
fn sealed_steps(out: &Path, ckpt: &Path, g: u64) -> Vec<u64> {
    ckpt_events(out)
        .iter()
        .filter(|e| e["event"] == "committed" && e["gen"] == g && e["sealed"] == true)
        .filter_map(|e| e["step"].as_u64())
        .chain(
            manifests(ckpt)
                .into_iter()
                .filter(|m| m.1 == g)
                .map(|m| m.0),
        )
        .collect()
}

/// Every sealed manifest under `ckpt`: (step, generation, the ranks whose files it lists).
fn manifests(ckpt: &Path) -> Vec<(u64, u64, Vec<u64>)> {
    let mut v = Vec::new();
    let mut dirs = vec![ckpt.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("drun-manifest-") && name.ends_with(".json")) {
                continue;
            }
            let m = crate::harness::read_json(&p);
            let ranks = m["files"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["rank"].as_u64())
                .collect();
            v.push((
                m["step"].as_u64().unwrap_or(0),
                m["generation"].as_u64().unwrap_or(0),
                ranks,
            ));
        }
    }
    v
}

/// Three hosts training through a server on a fourth (memory store, default settings).
struct Trio {
    bed: Bed,
    dir: tempfile::TempDir,
    server: RdzvServer,
    /// The workers' records and step logs (`paced_steps.py`).
    out: std::path::PathBuf,
    /// The agents of `n0`, `n1`, `n2`, in that order.
    agents: Vec<Agent>,
}

/// `n0`–`n2` train run `run` (`--nnodes nnodes`, one `paced_steps.py` worker each) through a
/// server on `server`; returns once every rank took a few steps. `None`: skipped (no torch or no
/// bed).
fn trio(run: &str, nnodes: &str) -> Option<Trio> {
    let Stage {
        python,
        bed,
        dir,
        server,
        out,
    } = stage()?;
    let agents = trainers(
        &bed,
        &["n0", "n1", "n2"],
        &server,
        &python,
        (run, nnodes),
        |c| {
            c.arg(worker("paced_steps.py")).arg(&out);
        },
    );
    wait_for("generation 1 trains", Duration::from_secs(120), || {
        (0..3).all(|r| step_times(&out, r).len() > 5)
    });
    Some(Trio {
        bed,
        dir,
        server,
        out,
        agents,
    })
}
