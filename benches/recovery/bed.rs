//! The recovery benchmark's network-bed rows: a pulled cable, a partition and a control-plane
//! outage on hosts built as network namespaces (the tests' `tests/harness/netbed.rs`), drun and
//! torchrun side by side, each worker stamping every step it completes.

#[allow(dead_code)] // the tests use all of the bed, the bench a part
#[path = "../../tests/harness/netbed.rs"]
mod netbed;

use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::common::procs::{listening_in, Procs};
use super::common::{free_port, now_ns, RdzvServer};
use super::records::{log_tails, poll};
use super::table::{fmt, Row, Unit};
use super::{launchers, selected, Bench, Launcher};
use netbed::Bed;

/// The bed's hosts: the drun rendezvous server's, and one per node.
const HOSTS: [&str; 4] = ["server", "n0", "n1", "n2"];
const NODES: [&str; 3] = ["n0", "n1", "n2"];
/// A pause between two steps longer than this (ten steps) is a stall, not a slow step.
const STALL_NS: u128 = 1_000_000_000;
/// How long the control plane is cut off in the outage row.
const OUTAGE: Duration = Duration::from_secs(30);

/// A fault of the network, injected once the three nodes train.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BedFault {
    /// The cable of the host holding this node rank is pulled (and stays out).
    Cable(u64),
    /// n1 and n2 can no longer reach each other; both still reach n0 and the server.
    Partition,
    /// The control plane's host is cut off for [`OUTAGE`], then plugged back: drun's
    /// rendezvous server's host; under torchrun n0, whose agent hosts the c10d store.
    Outage,
}

/// One worker of a run, from `benches/workers/bed_steps.py`'s files.
struct Worker {
    host: String,
    world: u64,
    group_rank: u64,
    start_ns: u128,
    resumed_from: u64,
    /// (wall time in ns, step) of every completed step.
    steps: Vec<(u128, u64)>,
}

fn workers(dir: &Path) -> Vec<Worker> {
    let mut out = Vec::new();
    for (p, v) in super::records::json_records(dir) {
        let steps = std::fs::read_to_string(p.with_extension("steps"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
            })
            .collect();
        let (Some(host), Some(world), Some(group_rank), Some(start), Some(resumed_from)) = (
            v["host"].as_str(),
            v["world"].as_u64(),
            v["group_rank"].as_u64(),
            v["start_ns"].as_u64(),
            v["resumed_from"].as_u64(),
        ) else {
            continue;
        };
        out.push(Worker {
            host: host.to_string(),
            world,
            group_rank,
            start_ns: start.into(),
            resumed_from,
            steps,
        });
    }
    out
}

/// What one run measured, from the fault's instant `t0`.
struct Measured {
    /// Seconds from the fault until a world completed an all_reduce again (the step that ends
    /// the first stall after the fault); for the outage row the longest gap between two
    /// consecutive steps (any worker) from the last step before the fault on.
    recovery: f64,
    /// Seconds of training lost: from the last step completed before the pause until the job's
    /// step counter passed that step again, less one step's usual time.
    lost: f64,
    /// Steps done before the pause and done again after it (back to the checkpoint).
    redone: u64,
    /// Whether new workers started after the fault.
    reformed: bool,
}

/// Judges the steps of `ws` against the fault at `t0`; `None` until the training recovered
/// (for the outage row: until `settled`, the time the steps must flow after the plug).
fn measure(ws: &[Worker], t0: u128, outage: bool, settled: Option<u128>) -> Option<Measured> {
    let mut all: Vec<(u128, u64)> = ws.iter().flat_map(|w| w.steps.iter().copied()).collect();
    all.sort_unstable();
    let t_last = all.iter().rfind(|s| s.0 <= t0)?.0;
    let after: Vec<(u128, u64)> = all.iter().copied().filter(|s| s.0 >= t_last).collect();
    let gap = |w: &&[(u128, u64)]| w[1].0 - w[0].0;
    // The pause: for the outage row the longest gap, else the first one that is a stall.
    let pause = if outage {
        let settled = settled?;
        // Still stalled at the end: not recovered yet.
        if all.last()?.0 + STALL_NS < settled {
            return None;
        }
        after.windows(2).max_by_key(gap)?
    } else {
        after.windows(2).find(|w| gap(w) > STALL_NS)?
    };
    let (start, end) = (pause[0].0, pause[1].0);
    let recovery = if outage { end - start } else { end - t0 };
    // The job's step counter when the pause began: an all_reduce whose data was already
    // exchanged may still complete just after the fault.
    let c_ref = all.iter().filter(|s| s.0 <= start).map(|s| s.1).max()?;
    let passed = all.iter().find(|s| s.0 > start && s.1 > c_ref)?.0;
    // One step's usual time: the median interval of one worker's steps before the fault.
    let mut usual: Vec<u128> = ws
        .iter()
        .find(|w| w.steps.len() > 5 && w.start_ns < t0)?
        .steps
        .windows(2)
        .filter(|p| p[1].0 <= t0)
        .map(|p| p[1].0 - p[0].0)
        .collect();
    usual.sort_unstable();
    let usual = usual.get(usual.len() / 2).copied().unwrap_or(0);
    let new: Vec<&Worker> = ws.iter().filter(|w| w.start_ns > t0).collect();
    Some(Measured {
        recovery: recovery as f64 / 1e9,
        lost: (passed - start).saturating_sub(usual) as f64 / 1e9,
        redone: new
            .iter()
            .map(|w| c_ref.saturating_sub(w.resumed_from))
            .min()
            .unwrap_or(0),
        reformed: !new.is_empty(),
    })
}

/// One run's outcome.
enum Sample {
    Recovered(Measured),
    /// Not within the bound; whether it had re-formed.
    NotRecovered,
    /// The job never trained at world 3 (an environment problem, not a result).
    SetupFailed,
}

/// Where a run's agents meet and what they share.
struct Job<'a> {
    bed: &'a Bed,
    /// The rendezvous endpoint: drun's server, or torchrun's c10d store on n0.
    rdzv: String,
    id: String,
    /// The workers' records.
    out: &'a Path,
    /// The agents' logs, `agent<i>.log` for node `n<i>`.
    logs: &'a Path,
}

/// The agent of launcher `l` on host `NODES[i]` of the job's bed.
fn agent(b: &Bench, l: Launcher, job: &Job, i: usize) -> Command {
    let host = NODES[i];
    let mut c = match l {
        Launcher::Drun => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_drun"));
            c.args(["--rdzv-endpoint", &job.rdzv])
                .arg("--python")
                .arg(&b.python);
            c
        }
        Launcher::Torchrun => {
            let mut c = Command::new(b.torchrun.as_ref().unwrap());
            c.args(["--rdzv-backend", "c10d", "--rdzv-endpoint", &job.rdzv])
                .args(["--max-restarts", "3"]);
            c
        }
    };
    c.args([
        "--nnodes",
        "2:3",
        "--nproc-per-node",
        "1",
        "--rdzv-id",
        &job.id,
    ])
    .args(["--local-addr", &job.bed.host(host).addr])
    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/workers/bed_steps.py"))
    .arg(job.out)
    .env("GLOO_SOCKET_IFNAME", "eth0");
    super::clear_job_env(&mut c);
    let mut c = job.bed.on(host, &c);
    let log = File::create(job.logs.join(format!("agent{i}.log"))).unwrap();
    c.stdout(log.try_clone().unwrap()).stderr(log);
    c
}

/// One run of `fault` with launcher `l` on a fresh bed.
fn bed_run(b: &Bench, l: Launcher, fault: BedFault, run: usize, what: &str) -> Sample {
    let Some(bed) = Bed::new(&HOSTS) else {
        return Sample::SetupFailed;
    };
    let dir = tempfile::tempdir().unwrap();
    let (out, logs) = (dir.path().join("rec"), dir.path().join("log"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let port = free_port();
    let server = (l == Launcher::Drun).then(|| {
        let listen = format!("{}:0", bed.host("server").addr);
        RdzvServer::start_as(&listen, &["--store", "memory"], |c| bed.on("server", &c))
    });
    let job = Job {
        bed: &bed,
        rdzv: match &server {
            Some(s) => s.1.clone(),
            None => format!("{}:{port}", bed.host("n0").addr),
        },
        id: format!("bed{run}"),
        out: &out,
        logs: &logs,
    };
    let mut procs = Procs::new(&format!("{}-{}", l.name(), job.id));
    for i in 0..NODES.len() {
        let pid = procs
            .spawn(agent(b, l, &job, i), i)
            .expect("start launcher");
        if l == Launcher::Torchrun && i == 0 {
            // n0's agent hosts the c10d store: the others find it listening.
            poll(Duration::from_secs(60), || {
                listening_in(&pid.to_string(), port).then_some(())
            });
        }
    }
    let trains = poll(Duration::from_secs(180), || {
        let ws = workers(&out);
        let at3 = ws.iter().filter(|w| w.world == 3 && w.steps.len() >= 5);
        (at3.count() == 3).then_some(())
    });
    if trains.is_none() {
        eprintln!("  {} did not train at world 3:", l.name());
        log_tails(&logs, NODES.len());
        return Sample::SetupFailed;
    }
    std::thread::sleep(Duration::from_secs(1));
    let victim = match (fault, l) {
        (BedFault::Cable(k), _) => workers(&out)
            .into_iter()
            .find(|w| w.world == 3 && w.group_rank == k)
            .map(|w| w.host)
            .expect("a worker of the world of 3 has that node rank"),
        (BedFault::Partition, _) => "n1 ↮ n2".into(),
        (BedFault::Outage, Launcher::Drun) => "server".into(),
        (BedFault::Outage, Launcher::Torchrun) => "n0".into(),
    };
    let t0 = now_ns();
    match fault {
        BedFault::Cable(_) | BedFault::Outage => bed.pull_cable(&victim),
        BedFault::Partition => bed.partition("n1", "n2"),
    }
    let measured = if fault == BedFault::Outage {
        std::thread::sleep(OUTAGE);
        bed.plug_cable(&victim);
        let plugged = now_ns();
        let left = b.bound.saturating_sub(OUTAGE);
        poll(left, || {
            let now = now_ns();
            // Judged no earlier than 10 s after the plug, once the steps flow (a step in the
            // last second): a re-form soon after the plug shows there.
            let settled = (now > plugged + 10_000_000_000).then_some(now);
            measure(&workers(&out), t0, true, settled)
        })
    } else {
        poll(b.bound, || measure(&workers(&out), t0, false, None))
    };
    let sample =
        match measured {
            Some(m) => {
                eprintln!(
                "[{what}] run {}/{} {}: fault at {victim}; {} {}, work lost {}, {} steps redone{}",
                run + 1,
                b.runs,
                l.name(),
                if fault == BedFault::Outage {
                    "longest gap"
                } else {
                    "a world's all_reduce again after"
                },
                fmt(m.recovery, Unit::Seconds),
                fmt(m.lost, Unit::Seconds),
                m.redone,
                if m.reformed { ", re-formed" } else { ", no re-form" }
            );
                Sample::Recovered(m)
            }
            None => {
                eprintln!(
                    "[{what}] run {}/{} {}: fault at {victim}; did not recover in {} s",
                    run + 1,
                    b.runs,
                    l.name(),
                    b.bound.as_secs()
                );
                if l == Launcher::Drun {
                    log_tails(&logs, NODES.len());
                }
                Sample::NotRecovered
            }
        };
    procs.kill_all();
    drop(server);
    if std::env::var_os("DRUN_BENCH_KEEP").is_some() {
        eprintln!("  kept {}", dir.keep().display());
    }
    drop(bed);
    sample
}

/// The two rows of one bed fault, both launchers alternating. With `give_up`, a launcher's
/// first run that does not recover ends its part of the row.
fn bed_rows(b: &Bench, what: &str, fault: BedFault, give_up: bool) -> [Row; 2] {
    let outage = fault == BedFault::Outage;
    let mut recovery = Row::new(
        if outage {
            format!("{what} → longest gap between two steps")
        } else {
            format!("{what} → a world's next all_reduce")
        },
        Unit::Seconds,
    );
    let mut lost = Row::new(
        format!("{what} → work lost (training time until the step counter passes its value at the fault)"),
        Unit::Seconds,
    );
    let mut reformed = [0usize; 2];
    for run in 0..b.runs {
        for l in launchers(b) {
            if give_up && recovery.cell(l).gave_up() {
                continue;
            }
            let (r, w) = match bed_run(b, l, fault, run, what) {
                Sample::Recovered(m) => {
                    reformed[l as usize] += usize::from(m.reformed);
                    (m.recovery, m.lost)
                }
                Sample::NotRecovered => (f64::INFINITY, f64::INFINITY),
                Sample::SetupFailed => {
                    recovery.cell(l).setup_failed += 1;
                    lost.cell(l).setup_failed += 1;
                    continue;
                }
            };
            recovery.cell(l).values.push(r);
            lost.cell(l).values.push(w);
        }
    }
    if outage {
        for l in launchers(b) {
            let n = recovery.cell(l).values.len();
            recovery.cell(l).note = Some(format!("re-formed in {}/{n}", reformed[l as usize]));
        }
    }
    [recovery, lost]
}

/// The bed rows that `DRUN_BENCH_ONLY` / `DRUN_BENCH_SKIP` select; without root or `ip`, one
/// line saying they are skipped.
pub(super) fn network_rows(b: &Bench, rows: &mut Vec<Row>) {
    let chosen: Vec<&str> = ["bed-cable0", "bed-cable1", "bed-partition", "bed-outage"]
        .into_iter()
        .filter(|k| selected(k))
        .collect();
    if chosen.is_empty() {
        return;
    }
    // Bed::new says in one line why it cannot build a bed.
    if Bed::new(&["probe"]).is_none() {
        return;
    }
    for key in chosen {
        let (what, fault, give_up) = match key {
            "bed-cable0" => (
                "bed: cable of node rank 0's host pulled, 1 of 3 hosts, defaults",
                BedFault::Cable(0),
                true,
            ),
            "bed-cable1" => (
                "bed: cable of node rank 1's host pulled, 1 of 3 hosts, defaults",
                BedFault::Cable(1),
                true,
            ),
            "bed-partition" => (
                "bed: n1 ↮ n2 partitioned (both reach n0 and the server), defaults",
                BedFault::Partition,
                true,
            ),
            _ => (
                "bed: control plane's host cut off 30 s (drun: the rendezvous server's host; torchrun: n0, whose agent hosts the c10d store), defaults",
                BedFault::Outage,
                false,
            ),
        };
        rows.extend(bed_rows(b, what, fault, give_up));
    }
}
