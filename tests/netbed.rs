//! Faults from the network, on hosts built as network namespaces (`harness::netbed`): the bed
//! itself, and drun's agents across a pulled cable.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::cluster::RdzvServer;
use crate::harness::netbed::{bed_namespaces, Bed};
use crate::harness::{alive, drun, torch_python, wait_for, worker, Agent, DrunCmd};

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

/// How long a loaded CI machine may take from a pulled cable to the survivors' first all_reduce
/// at world 2. At the defaults it is about 2 s here (the promise: the recovery benchmark's
/// `bed-cable*` rows measure it); on a CI machine running other tests beside this one it took
/// up to 15 s. What the test asserts is how: the survivors re-form because neither the peers
/// nor the server hear the victim, not because its lease expired; this bound only catches a
/// re-form that does not come.
const SURVIVORS_WITHIN: Duration = Duration::from_secs(30);

/// Three hosts `n0`–`n2` (one torch worker each, `--nnodes 2:3`, default settings) and a
/// rendezvous server on a fourth; the cable of the host of node rank `node_rank` (the victim)
/// is pulled once all three train. The other two complete an all_reduce at world 2 within
/// seconds (the peers do not hear the victim and the server does not either: it is given up
/// without waiting for its lease); the victim's worker is stopped within the lease TTL plus
/// its grace; with the cable back the victim rejoins by itself and the world is 3 again.
fn pulled_cable(node_rank: u32) {
    let Some(Stage {
        python,
        bed,
        server,
        out,
        dir: _dir,
    }) = stage()
    else {
        return;
    };
    let agents = trainers(
        &bed,
        &["n0", "n1", "n2"],
        &server,
        &python,
        ("cable", "2:3"),
        |c| {
            c.arg(worker("steps.py")).arg(&out).arg("100000");
        },
    );
    wait_for("a generation of 3 ranks", Duration::from_secs(120), || {
        matches!(newest_generation(&out), Some((_, 3)))
    });
    let (g1, _) = newest_generation(&out).unwrap();
    // The cable is pulled once the three have trained a while: warm workers write their
    // records within milliseconds of the formation, before the peers' first probes were
    // answered (a peer never heard in a generation leaves no evidence of silence).
    wait_for(
        "the generation of 3 trained for a probe quiet limit",
        Duration::from_secs(60),
        || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            let records = crate::harness::gen_records(&out, g1);
            records.len() == 3
                && records.iter().all(|r| {
                    r["first_all_reduce_at"]
                        .as_f64()
                        .is_some_and(|t| now - t >= 2.0 * drun_launcher::peers::QUIET.as_secs_f64())
                })
        },
    );
    let (victim, victim_worker) = crate::harness::gen_records(&out, g1)
        .iter()
        .filter(|r| r["group_rank"] == node_rank)
        .find_map(|r| {
            let pid = r["pid"].as_i64()? as i32;
            let host = ["n0", "n1", "n2"]
                .into_iter()
                .find(|h| bed.pids_on(h).contains(&pid))?;
            Some((host, pid))
        })
        .expect("the victim's worker is among the generation's ranks");

    let cut = Instant::now();
    let cut_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    bed.pull_cable(victim);
    wait_for(
        "the survivors train at world 2",
        Duration::from_secs(60),
        || {
            matches!(newest_generation(&out), Some((g, 2)) if g > g1)
                && crate::harness::gen_records(&out, newest_generation(&out).unwrap().0)
                    .iter()
                    .all(|r| {
                        r["world_size"] == 2 && r["pid"].as_i64() != Some(victim_worker.into())
                    })
        },
    );
    let survivors_at = cut.elapsed();
    let (g2, _) = newest_generation(&out).unwrap();
    let first_all_reduce = crate::harness::gen_records(&out, g2)
        .iter()
        .filter_map(|r| r["first_all_reduce_at"].as_f64())
        .fold(0.0, f64::max)
        - cut_at;
    assert!(
        first_all_reduce <= SURVIVORS_WITHIN.as_secs_f64(),
        "the survivors' first all_reduce at world 2 came {first_all_reduce:.2} s after the cut"
    );
    // Given up for its silence (peers and server), not for an expired lease.
    let hosts = ["n0", "n1", "n2"];
    let survivor = hosts.iter().position(|h| *h != victim).unwrap();
    let said = agents[survivor].stderr_so_far();
    assert!(
        said.lines().any(|l| l.contains("re-forming the group")
            && l.contains(&format!("({}, rank ", bed.host(victim).addr))
            && l.contains("lost: neither its peers")),
        "a survivor re-formed because nobody hears {victim}:\n{said}"
    );
    // Cut off, the victim's agent fences itself at the lease TTL and stops its worker within
    // the shutdown grace (3 s), counted from the cut; two seconds of slack for the poll and
    // the kill.
    let bound = Duration::from_secs(TTL + 3 + 2);
    wait_for(
        "the cut-off worker is stopped",
        bound.saturating_sub(cut.elapsed()),
        || !alive(victim_worker),
    );
    let stopped_at = cut.elapsed();

    bed.plug_cable(victim);
    wait_for(
        "the victim back in a world of 3",
        Duration::from_secs(90),
        || matches!(newest_generation(&out), Some((g, 3)) if g > g2),
    );
    eprintln!(
        "cable of {victim}: survivors' first all_reduce at world 2 {first_all_reduce:.2} s after \
         the cut (seen {survivors_at:?}), its worker stopped after {stopped_at:?}, world 3 again \
         {:?} after the cut",
        cut.elapsed()
    );
    drop(agents);
    drop(server);
}

#[test]
fn a_pulled_cable_of_node_rank_0_reforms_the_others_and_the_host_rejoins_when_it_is_back() {
    pulled_cable(0);
}

#[test]
fn a_pulled_cable_of_a_middle_node_reforms_the_others_and_the_host_rejoins_when_it_is_back() {
    pulled_cable(1);
}

/// Three hosts (1 torch worker each) whose `n2` sends and receives at 20 Mbit/s (token buckets)
/// beside ~10 Gbit/s veth links: `--preflight` names n2's two ring links slow, and only those,
/// from what they moved in their slots, names n2 the slow node (in a ring of 3 its two links
/// are the median, so only the links between the other nodes tell), and measures for at most
/// 5 s (before the time slots it took 39 s here: its time grew with the slowest link). One slow
/// link alone is named by `preflight::a_slowed_link_is_named_in_the_table`.
#[test]
fn preflight_names_a_host_slowed_to_20_mbit_among_fast_ones_within_five_seconds() {
    let Some(Stage {
        python,
        bed,
        server,
        out,
        dir: _dir,
    }) = stage()
    else {
        return;
    };
    bed.limit_rate("n2", "20mbit");
    bed.limit_receive_rate("n2", "20mbit");
    let agents = trainers(
        &bed,
        &["n0", "n1", "n2"],
        &server,
        &python,
        ("slowlink", "3"),
        |c| {
            c.arg("--preflight")
                .arg(worker("steps.py"))
                .arg(&out)
                .arg("3");
        },
    );
    let mut table = String::new();
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(180));
        assert_eq!(code, 0, "{err}");
        if err.contains("  link  ") {
            table = err;
        }
    }
    let rows: Vec<&str> = table.lines().filter(|l| l.contains(" Gbit/s ")).collect();
    let links: Vec<&&str> = rows.iter().filter(|l| l.contains("node ")).collect();
    assert_eq!(links.len(), 3, "three ring links:\n{table}");
    for l in links {
        let through_n2 = l.contains("n2 → ") || l.contains("→ n2");
        assert_eq!(
            l.contains("SLOW: "),
            through_n2,
            "only n2's links are slow:\n{table}"
        );
    }
    let node_line = table
        .lines()
        .find(|l| l.contains("SLOW NODE: "))
        .unwrap_or_else(|| panic!("no slow node named:\n{table}"));
    assert!(node_line.contains("(n2)"), "{node_line}");
    let heading = table
        .lines()
        .find(|l| l.contains("preflight: 3 ranks on 3 nodes (gloo) in "))
        .unwrap_or_else(|| panic!("no heading:\n{table}"));
    let measuring: f64 = heading
        .rsplit(", ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no measuring time in {heading:?}"));
    assert!(measuring <= 5.0, "{heading}");
    eprintln!("{heading}\n{}", rows.join("\n"));
}

/// The step times of `steps_rank<rank>.log` in `dir` (`paced_steps.py`), in seconds.
fn step_times(dir: &Path, rank: u32) -> Vec<f64> {
    std::fs::read_to_string(dir.join(format!("steps_rank{rank}.log")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// etcd on host `name` of `bed`, on that host's own loopback (the control plane's network);
/// healthy when this returns; killed with the guard.
fn etcd_on(bed: &Bed, name: &str, data: &Path) -> Listener {
    let mut c = Command::new("etcd");
    c.args(["--name", "e0", "--data-dir"])
        .arg(data)
        .args(["--listen-client-urls", "http://127.0.0.1:2379"])
        .args(["--advertise-client-urls", "http://127.0.0.1:2379"])
        .args(["--listen-peer-urls", "http://127.0.0.1:2380"])
        .args(["--logger", "zap", "--log-level", "error"]);
    let guard = Listener(
        bed.on(name, &c)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (apt-get install etcd-server)"),
    );
    let mut health = Command::new("python3");
    health.args([
        "-c",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:2379/health',timeout=1).read()",
    ]);
    wait_for(
        "etcd on the bed to become healthy",
        Duration::from_secs(30),
        || {
            bed.on(name, &health)
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success()
        },
    );
    guard
}

/// Two hosts train (one torch worker each, `paced_steps.py`) through a rendezvous server on a
/// third host (`store`: memory, or etcd on the server's host); the server host's cable is pulled
/// for four lease TTLs. Every peer still answers, so neither agent fences and the server, hearing
/// no agent at all, holds their leases: the training does not pause (2 s allowed on a loaded
/// machine), no re-form happens, the workers are the same processes, and both agents attach
/// again when the cable is back. The TTL is [`OUTAGE_TTL`]: the rules are the same at every TTL,
/// and four TTLs of 10 s plus two after the outage were a minute of waiting per store.
fn control_plane_outage(store: &str) {
    let Some(python) = torch_python() else { return };
    let Some(bed) = Bed::new(&["server", "n0", "n1"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let _etcd = (store == "etcd").then(|| etcd_on(&bed, "server", &dir.path().join("etcd")));
    let store_args: &[&str] = if store == "etcd" {
        &["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"]
    } else {
        &["--store", "memory"]
    };
    let server = RdzvServer::start_in(
        &bed,
        "server",
        store_args,
        "info",
        &dir.path().join("server.log"),
    );
    let out = dir.path().join("records");
    std::fs::create_dir(&out).unwrap();
    // `DRUN_BED_LEASE_TTL` and `DRUN_BED_OUTAGE_SECS` measure the same path at other settings
    // (the defaults: `DRUN_BED_LEASE_TTL=10`; a 30 s or 5-minute outage), as the guide quotes.
    let ttl: u64 = std::env::var("DRUN_BED_LEASE_TTL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(OUTAGE_TTL);
    let conf = format!("lease_ttl={ttl}");
    let agents = trainers(
        &bed,
        &["n0", "n1"],
        &server,
        &python,
        ("outage", "2"),
        |c| {
            // The generation is kept through the outage (the assertion): no restart would use
            // a warm interpreter.
            c.args(["--rdzv-conf", &conf, "--warm-workers", "off"])
                .arg(worker("paced_steps.py"))
                .arg(&out);
        },
    );
    wait_for("generation 1 trains", Duration::from_secs(120), || {
        step_times(&out, 0).len() > 20 && step_times(&out, 1).len() > 20
    });
    let workers: Vec<i64> = crate::harness::gen_records(&out, 1)
        .iter()
        .map(|r| r["pid"].as_i64().unwrap())
        .collect();
    assert_eq!(workers.len(), 2);

    let cut = Instant::now();
    let cut_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    bed.pull_cable("server");
    let outage = Duration::from_secs(
        std::env::var("DRUN_BED_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4 * ttl),
    );
    crate::harness::holds_for("the workers train on", outage, || {
        workers.iter().all(|p| alive(*p as i32)) && newest_generation(&out) == Some((1, 2))
    });
    bed.plug_cable("server");
    let back = Instant::now();
    wait_for("both agents attach again", Duration::from_secs(30), || {
        agents
            .iter()
            .all(|a| a.stderr_so_far().contains("reconnected to the rendezvous"))
    });
    let attached = back.elapsed();
    crate::harness::holds_for(
        "no re-form after the outage",
        Duration::from_secs(2 * ttl),
        || workers.iter().all(|p| alive(*p as i32)) && newest_generation(&out) == Some((1, 2)),
    );
    let mut longest = 0.0f64;
    for rank in 0..2 {
        let times = step_times(&out, rank);
        let during: Vec<f64> = times.into_iter().filter(|t| *t >= cut_at - 1.0).collect();
        assert!(during.len() > 50, "rank {rank} trained through the outage");
        let gap = during.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        // Measured at the defaults: 0.06 s (the step's own 50 ms); the bound leaves room for a
        // loaded CI machine, and a generation that was not kept fails far beyond it.
        assert!(
            gap <= 2.0,
            "rank {rank} paused {gap:.2} s during the outage"
        );
        longest = longest.max(gap);
    }
    for a in &agents {
        let err = a.stderr_so_far();
        assert!(
            err.contains("but every peer of generation 1 answers"),
            "{err}"
        );
        assert!(!err.contains("fenced"), "{err}");
    }
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    assert!(
        log.contains("holding"),
        "the server said it held the leases:\n{log}"
    );
    let mut status = Command::new(crate::harness::cluster::rendezvous_bin());
    status.args(["status", "outage", "--endpoint", &server.endpoint]);
    let mut view = String::new();
    let shown = crate::harness::poll_until(Duration::from_secs(10), || {
        let o = bed.on("n0", &status).output().unwrap();
        view = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        view.contains("outage control plane away ") && view.contains("generation 1 kept")
    });
    assert!(shown, "status shows the outage:\n{view}");
    let secs: f64 = view
        .split("control plane away ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap();
    assert!(
        secs >= outage.as_secs_f64() - 1.0 && secs <= outage.as_secs_f64() + 15.0,
        "its length: {view}"
    );
    eprintln!(
        "{store} store, lease TTL {ttl} s, server cut off for {:?}: longest gap between two steps {longest:.3} s, both agents attached again {attached:?} after the cable was back",
        back - cut
    );
}

/// The lease TTL of the outage tests, seconds: shorter than the default (10 s), longer than the
/// 3 s of the queued-commit test below; an outage lasts four of them.
const OUTAGE_TTL: u64 = 4;

#[test]
fn a_control_plane_outage_is_not_a_training_outage_memory() {
    control_plane_outage("memory");
}

#[test]
fn a_control_plane_outage_is_not_a_training_outage_etcd() {
    control_plane_outage("etcd");
}

/// A checkpoint committed while the control plane is away is queued, not refused: two hosts
/// checkpoint through the ledger (a stdlib worker committing every other step) and the server
/// host's cable is pulled for three lease TTLs (a 3 s TTL, to stay short). The commits sent
/// meanwhile wait (the committing ranks with them) and are replayed when the agents attach
/// again; the step is then sealed in generation 1. No re-form, the same workers.
#[test]
fn a_checkpoint_committed_during_a_control_plane_outage_is_sealed_when_it_returns() {
    let Some(Stage {
        python,
        bed,
        server,
        out,
        dir,
    }) = stage()
    else {
        return;
    };
    let ckpt = dir.path().join("ckpt");
    let ttl = 3;
    let conf = format!("lease_ttl={ttl}");
    let agents = trainers(
        &bed,
        &["n0", "n1"],
        &server,
        &python,
        ("queued", "2"),
        |c| {
            c.args(["--rdzv-conf", &conf])
                .arg("--ckpt-dir")
                .arg(&ckpt)
                .arg(worker("ckpt_worker.py"))
                .env("CKPT_OUT", &out)
                .env("CKPT_STEPS", "1000000")
                .env("CKPT_SLEEP", "0.05");
        },
    );
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    // Sealed: a seal the ranks heard, or (checkpoints in memory, the default: a commit is
    // answered staged before its step is persisted and sealed) its manifest in --ckpt-dir.
    let sealed = |g: u64| -> Vec<u64> {
        ckpt_events(&out)
            .iter()
            .filter(|e| e["event"] == "committed" && e["gen"] == g && e["sealed"] == true)
            .filter_map(|e| e["step"].as_u64())
            .chain(
                manifests(&ckpt)
                    .into_iter()
                    .filter(|m| m.1 == g)
                    .map(|m| m.0),
            )
            .collect()
    };
    wait_for(
        "generation 1 seals a checkpoint",
        Duration::from_secs(120),
        || !sealed(1).is_empty(),
    );
    let cut_at = now();
    bed.pull_cable("server");
    crate::harness::holds_for(
        "the workers run on, no commit refused",
        Duration::from_secs(3 * ttl),
        || {
            ckpt_events(&out)
                .iter()
                .all(|e| e["event"] != "refused" && (e["event"] != "start" || e["gen"] == 1))
        },
    );
    let plug_at = now();
    bed.plug_cable("server");
    let during: Vec<u64> = ckpt_events(&out)
        .iter()
        .filter(|e| e["event"] == "committing" && e["gen"] == 1)
        .filter(|e| e["t"].as_f64().is_some_and(|t| t > cut_at && t < plug_at))
        .filter_map(|e| e["step"].as_u64())
        .collect();
    assert!(!during.is_empty(), "the ranks committed during the outage");
    wait_for(
        "a step committed during the outage is sealed",
        Duration::from_secs(30),
        || sealed(1).iter().any(|s| during.contains(s)),
    );
    let evs = ckpt_events(&out);
    assert!(
        evs.iter().all(|e| e["event"] != "start" || e["gen"] == 1),
        "no re-form"
    );
    assert!(
        !evs.iter().any(|e| e["event"] == "refused"),
        "no commit was refused"
    );
    for a in &agents {
        let err = a.stderr_so_far();
        assert!(!err.contains("fenced"), "{err}");
    }
    eprintln!(
        "commits of steps {during:?} sent during a {:.1} s outage; sealed after it: {:?}",
        plug_at - cut_at,
        sealed(1)
            .into_iter()
            .filter(|s| during.contains(s))
            .collect::<Vec<_>>()
    );
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

/// Three hosts train (one torch worker each, default settings) through a server on a fourth;
/// n1 and n2 can no longer reach each other, while both still reach the server and n0. Within
/// 10 s both agents name the peer they cannot reach (its node rank and address); the node of the
/// pair with the higher rank is sent away (the largest set that all reach each other, ties
/// towards node rank 0), the other two train at world 2 soon after the break, the one sent
/// away stands by; when the partition heals it joins again and the world is 3 again.
#[test]
fn a_partition_between_two_peers_is_named_and_healed_by_sending_one_side_away() {
    let Some(Trio {
        bed,
        dir,
        out,
        agents,
        server: _server,
    }) = trio("split", "2:3")
    else {
        return;
    };
    let rank_of = |name: &str| -> u64 {
        let pids = bed.pids_on(name);
        crate::harness::gen_records(&out, 1)
            .iter()
            .find(|r| pids.contains(&(r["pid"].as_i64().unwrap() as i32)))
            .and_then(|r| r["group_rank"].as_u64())
            .unwrap()
    };
    let (r1, r2) = (rank_of("n1"), rank_of("n2"));

    let cut = Instant::now();
    bed.partition("n1", "n2");
    let names = |a: &Agent, rank: u64, host: &str| {
        a.stderr_so_far().contains(&format!(
            "cannot reach node rank {rank} ({}) of generation 1",
            bed.host(host).addr
        ))
    };
    wait_for("both sides name the other", Duration::from_secs(10), || {
        names(&agents[1], r2, "n2") && names(&agents[2], r1, "n1")
    });
    let named = cut.elapsed();
    assert!(
        !agents[0].stderr_so_far().contains("cannot reach node rank"),
        "n0 reaches both"
    );
    let (kept, away) = if r1 < r2 { ("n1", "n2") } else { ("n2", "n1") };
    let cut_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - cut.elapsed().as_secs_f64();
    let first_step_at_world_2 = || -> Option<f64> {
        (0..2).find_map(|r| {
            std::fs::read_to_string(out.join(format!("steps_rank{r}.log")))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.get(2) == Some(&"2"))
                        .then(|| f[0].parse::<f64>().ok())
                        .flatten()
                })
                .find(|t| *t > cut_at)
        })
    };
    let reformed = crate::harness::poll_until(Duration::from_secs(60), || {
        first_step_at_world_2().is_some()
    });
    assert!(
        reformed,
        "the other two train at world 2; server log:\n{}",
        std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
    );
    let trained = first_step_at_world_2().unwrap() - cut_at;
    let i_away = if away == "n1" { 1 } else { 2 };
    let i_kept = if kept == "n1" { 1 } else { 2 };
    wait_for(
        "the node sent away stands by",
        Duration::from_secs(10),
        || {
            agents[i_away]
                .stderr_so_far()
                .contains("standing by: sent away from generation 1")
        },
    );
    let reason = format!(
        "node {} ↔ node {} cannot reach each other",
        r1.min(r2),
        r1.max(r2)
    );
    assert!(
        agents[0].stderr_so_far().contains(&reason),
        "the survivors name why: {}",
        agents[0].stderr_so_far()
    );
    assert!(!agents[i_kept].stderr_so_far().contains("standing by"));
    let (g2, _) = newest_generation(&out).unwrap();
    bed.heal("n1", "n2");
    wait_for(
        "the world is 3 again",
        Duration::from_secs(90),
        || matches!(newest_generation(&out), Some((g, 3)) if g > g2),
    );
    assert!(agents[i_away]
        .stderr_so_far()
        .contains("every node to reach answers this node's probes again"));
    eprintln!(
        "partition named on both sides {named:?} after it began; world 2 trained {trained:.2} s after it"
    );
    // Measured at the defaults: 9.0–9.4 s (the target: 15 s); the bound leaves room for
    // a loaded CI machine (the restart includes `import torch`).
    assert!(
        trained <= 30.0,
        "the remaining world trained {trained:.2} s after the break"
    );
}

/// The same partition in a run that needs all three nodes (`--nnodes 3`): no two-node world may
/// go on, so the run ends on every node with one line naming the broken pair (exit 3, which a
/// restart policy retries), instead of hanging in the collective for its 30-minute timeout.
#[test]
fn a_partition_that_leaves_fewer_than_min_nodes_ends_the_run_naming_the_broken_pair() {
    // Every field bound: `..` would drop the server and the records' folder right here.
    let Some(Trio {
        bed,
        agents,
        out: _out,
        server: _server,
        dir: _dir,
    }) = trio("split-min", "3")
    else {
        return;
    };
    bed.partition("n1", "n2");
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains("the nodes cannot all reach each other (node 1 ↔ node 2): no 3 of them"),
            "{err}"
        );
    }
}

/// Busy loops, one per core, killed when dropped.
struct Burners(Vec<std::process::Child>);

impl Burners {
    fn start() -> Burners {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Burners(
            (0..cores)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The false-positive side of the silence rule: three hosts train at the defaults for
/// `DRUN_SOAK_SECS` (30 minutes unless set) while every core is kept busy by other work (one
/// busy loop per core at the same priority); no member is lost — generation 1 runs throughout
/// with its 3 ranks — and the training keeps stepping. Long: `cargo test --test tests
/// saturated -- --ignored` runs it.
#[test]
#[ignore = "30 minutes; run with --ignored"]
fn saturated_cores_for_half_an_hour_lose_no_member() {
    let secs: u64 = std::env::var("DRUN_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800);
    let Some(Trio {
        bed: _bed,
        dir: _dir,
        server: _server,
        out,
        agents,
    }) = trio("soak", "2:3")
    else {
        return;
    };
    let (g, ranks) = newest_generation(&out).expect("generation 1 runs");
    assert_eq!((g, ranks), (1, 3));
    let burners = Burners::start();
    let t0 = Instant::now();
    let mut checked = 0u64;
    crate::harness::holds_for(
        "generation 1 with its 3 ranks and its agents",
        Duration::from_secs(secs),
        || {
            let now = t0.elapsed().as_secs();
            if now / 60 > checked {
                checked = now / 60;
                eprintln!(
                    "soak: {} min, rank 0 at step {}",
                    checked,
                    step_times(&out, 0).len()
                );
            }
            newest_generation(&out) == Some((1, 3)) && agents.iter().all(|a| alive(a.pid()))
        },
    );
    drop(burners);
    let steps = step_times(&out, 0);
    let last = *steps.last().expect("steps");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(now - last < 5.0, "still training at the end");
    for a in &agents {
        let err = a.stderr_so_far();
        assert!(!err.contains("lost:") && !err.contains("fenced"), "{err}");
    }
    eprintln!(
        "{} s with every core busy: generation 1 kept its 3 ranks; rank 0 took {} steps",
        secs,
        steps.len()
    );
}

/// The worker events of `ckpt_worker.py` in `out` (one JSON object per line).
fn ckpt_events(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
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

/// No split brain, at the defaults: three hosts checkpoint through drun's ledger (a stdlib
/// worker that keeps stepping without collectives, so the cut-off host's world goes on too)
/// and the cable of the host of node rank 2 is pulled. The survivors re-form and seal new
/// checkpoints; the cut-off world's commits are never accepted and never sealed (its agent
/// cannot reach the server, then fences at the lease TTL and stops its worker); no manifest of
/// its generation covers a step after the cut, and none lists its files. When the cable is back
/// the host rejoins by itself and every rank resumes from a checkpoint the survivors sealed.
#[test]
fn a_cut_off_world_commits_nothing_and_the_host_resumes_from_what_the_survivors_sealed() {
    let Some(Stage {
        python,
        bed,
        server,
        out,
        dir,
    }) = stage()
    else {
        return;
    };
    let ckpt = dir.path().join("ckpt");
    let agents = trainers(
        &bed,
        &["n0", "n1", "n2"],
        &server,
        &python,
        ("split", "2:3"),
        |c| {
            c.arg("--ckpt-dir")
                .arg(&ckpt)
                .arg(worker("ckpt_worker.py"))
                .env("CKPT_OUT", &out)
                .env("CKPT_STEPS", "1000000")
                .env("CKPT_SLEEP", "0.05");
        },
    );
    // Sealed: a seal the ranks heard, or (checkpoints in memory, the default: a commit is
    // answered staged before its step is persisted and sealed) its manifest in --ckpt-dir.
    let sealed_in = |evs: &[serde_json::Value], g: u64| {
        evs.iter()
            .filter(|e| e["event"] == "committed" && e["gen"] == g && e["sealed"] == true)
            .filter_map(|e| e["step"].as_u64())
            .chain(
                manifests(&ckpt)
                    .into_iter()
                    .filter(|m| m.1 == g)
                    .map(|m| m.0),
            )
            .max()
    };
    wait_for(
        "generation 1 seals a checkpoint",
        Duration::from_secs(120),
        || sealed_in(&ckpt_events(&out), 1).is_some(),
    );
    // The victim: the rank of generation 1 whose worker runs on the host of node rank 2.
    let evs = ckpt_events(&out);
    let (victim_host, victim_rank) = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"] == 1)
        .find_map(|e| {
            let pid = e["pid"].as_i64()? as i32;
            let host = ["n0", "n1", "n2"]
                .into_iter()
                .find(|h| bed.pids_on(h).contains(&pid))?;
            (e["rank"] == 2).then_some((host, 2u64))
        })
        .expect("rank 2 runs on one of the hosts");
    let cut_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    bed.pull_cable(victim_host);
    wait_for(
        "the survivors seal a checkpoint of their own",
        Duration::from_secs(60),
        || manifests(&ckpt).iter().any(|m| m.1 >= 2),
    );
    // Cut off, the victim's agent fences at the lease TTL and stops its worker.
    wait_for(
        "the cut-off worker is stopped",
        Duration::from_secs(TTL + 3 + 5),
        || {
            ckpt_events(&out)
                .iter()
                .filter(|e| e["event"] == "start" && e["gen"] == 1 && e["rank"] == victim_rank)
                .all(|e| !alive(e["pid"].as_i64().unwrap() as i32))
        },
    );
    bed.plug_cable(victim_host);
    wait_for(
        "the victim back in a world of 3",
        Duration::from_secs(90),
        || {
            ckpt_events(&out)
                .iter()
                .any(|e| e["event"] == "start" && e["gen"].as_u64() > Some(2) && e["world"] == 3)
        },
    );
    let evs = ckpt_events(&out);
    let victims = |e: &&serde_json::Value| e["gen"] == 1 && e["rank"] == victim_rank;
    // Commits the cut-off world sent after the cut (one in flight at the cut may land).
    let sent_after: Vec<u64> = evs
        .iter()
        .filter(victims)
        .filter(|e| e["event"] == "committing" && e["t"].as_f64() > Some(cut_at))
        .filter_map(|e| e["step"].as_u64())
        .collect();
    let last_sent_before = evs
        .iter()
        .filter(victims)
        .filter(|e| e["event"] == "committing" && e["t"].as_f64() <= Some(cut_at))
        .filter_map(|e| e["step"].as_u64())
        .max()
        .unwrap_or(0);
    // Accepted by the ledger: a commit answered by it. A staged answer is the cut-off agent's
    // own (checkpoints in memory, the default), given before the ledger sees the step; whether
    // the ledger took such a step shows as its manifest, checked below.
    let accepted: Vec<&serde_json::Value> = evs
        .iter()
        .filter(victims)
        .filter(|e| e["event"] == "committed" && e["staged"] != true)
        .filter(|e| e["step"].as_u64().is_some_and(|s| sent_after.contains(&s)))
        .collect();
    assert!(
        accepted.is_empty(),
        "a commit the cut-off world sent after the cut was accepted: {accepted:?}"
    );
    for (step, g, ranks) in manifests(&ckpt) {
        assert!(
            g != 1 || step <= last_sent_before,
            "generation 1 sealed step {step}, which its cut-off node committed after the cut"
        );
        assert!(
            g > 2 || step <= last_sent_before || !ranks.contains(&victim_rank),
            "the manifest of step {step} (generation {g}) lists the cut-off rank's files"
        );
    }
    // What was sealed: the manifests on disk, and the seals the workers heard of (retention may
    // have removed older manifests; a worker stopped right after a seal may not have said so).
    let sealed: Vec<(u64, u64)> = evs
        .iter()
        .filter(|e| e["event"] == "committed" && e["sealed"] == true)
        .filter_map(|e| Some((e["step"].as_u64()?, e["gen"].as_u64()?)))
        .chain(manifests(&ckpt).into_iter().map(|m| (m.0, m.1)))
        .collect();
    let resumed: Vec<u64> = evs
        .iter()
        .filter(|e| e["event"] == "start" && e["gen"].as_u64() > Some(2))
        .filter_map(|e| e["resume_step"].as_u64())
        .collect();
    assert!(
        !resumed.is_empty(),
        "the world of 3 resumed from a checkpoint"
    );
    for step in &resumed {
        assert!(
            sealed.iter().any(|(s, g)| s == step && *g == 2),
            "resumed from step {step}, not a checkpoint the survivors sealed: {sealed:?}"
        );
    }
    eprintln!(
        "cut-off world: {} commits sent after the cut, none accepted; survivors sealed up to {:?}; \
         the world of 3 resumed from step {:?}",
        sent_after.len(),
        sealed_in(&evs, 2),
        resumed.first()
    );
    drop(agents);
    drop(server);
}
