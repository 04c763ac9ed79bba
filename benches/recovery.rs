//! Recovery, launch and footprint: drun vs torchrun side by side in one invocation, one table.
//!
//! `cargo bench --bench recovery` (needs `etcd` on PATH, and torch: `$DRUN_TORCH_PYTHON` or
//! `~/.cache/drun/venv/bin/python`, with `torchrun` beside it; without torchrun only drun is
//! measured). Each row is the median over `DRUN_BENCH_RUNS` runs (default 5), drun and torchrun
//! runs alternating, with [min–max] and the ratio drun/torchrun:
//!
//! 1. **Node loss, crashed agent, default settings.** 3 agents `--nnodes 2:3`, 1 worker each, on
//!    127.0.0.1-3, running `benches/workers/recovery.py` (real torch, a gloo all_reduce every
//!    0.1 s). drun goes through `drun-rendezvous serve --store memory` (and, as its own row,
//!    `--store etcd`; and `--rdzv-backend etcd`, no server, as row `loss-etcd-backend`) with
//!    its default `--max-restarts 0`; torchrun through its c10d backend
//!    (the store hosted by the first agent) with `--max-restarts 3`. No `--rdzv-conf`. In steady
//!    training, `DRUN_BENCH_STEADY` seconds (default 5) after every worker did its first
//!    all_reduce, the third agent is SIGKILLed: under
//!    drun the agent process only (its guard kills its worker); under torchrun the agent and
//!    its worker (which torchrun starts in a session of its own) together. Measured: the time
//!    from the SIGKILL until both survivors' new workers (world size 2) had started — their
//!    first statement, before `import torch` — and, as a second row, until both had finished
//!    their first all_reduce in the new group.
//! 2. **Hung host.** The same job; the third agent and its worker (and drun's guard) get
//!    SIGSTOP instead. Same measurement.
//! 3. **Worker failure.** 3 agents × 1 worker (`--nnodes 3`), `--max-restarts 3` for both
//!    launchers; rank 1 exits 1 once, as steadily in training (its step `DRUN_BENCH_STEADY`
//!    seconds after the first). From that worker's exit until all three new workers
//!    started (and did their first all_reduce). And `fail-standalone`: `--standalone
//!    --nproc-per-node 2`, rank 1 exits 1 once; until both new workers started (and did their
//!    first all_reduce). Rows `loss-cold` and `fail-cold` repeat the node loss and the 3-node
//!    worker failure under drun with `--warm-workers off` (every new worker starts Python and
//!    imports torch), to show what the warm interpreters save. Rows `loss-early` and
//!    `fail-standalone-early` (drun only) inject the same faults 1 s after the first all_reduce:
//!    the spare warm interpreters a restart hands off to start with the generation, and on 2
//!    cores saturated by the training they may not have imported torch yet; the restart then
//!    waits for the rest of their import. Row `arrivals`: two newcomers
//!    3 s apart join a running `--nnodes 2:4` job (`recovery/arrivals.rs`): seconds until the
//!    world of 4's first all_reduce, how many re-forms it cost and the training time lost;
//!    `arrivals-window` the same with `--nnodes 2:5`, where the default 30 s last call decides.
//! 4. **Launch overhead** (`--standalone`, 2 trivial workers `--no-python true`, as
//!    `benches/launch.rs`), **a torch script's launch** (`launch-torch`: `--standalone
//!    --nproc-per-node 2` `recovery.py`, launcher start → both ranks' first all_reduce, with its
//!    phases; drun, torchrun, and drun with `--warm-workers off`) and **rendezvous time** for N agents (`DRUN_BENCH_RDZV_N`, default
//!    2,4,8; last agent started -> last worker started, as `benches/rendezvous.rs`: drun through
//!    a `drun-rendezvous` server on etcd, torchrun c10d), and **spawning 128 local workers**
//!    (`--standalone --nproc-per-node 128`, each worker stamping its start: launcher start →
//!    last worker started).
//! 5. **Agent footprint.** `--standalone`, 2 workers sleeping: the agent process's peak RSS
//!    (`VmHWM`) and its own CPU time (`utime`+`stime` from `/proc/<pid>/stat`, children not
//!    included) during `DRUN_BENCH_IDLE` seconds (default 30) after both workers started, and
//!    in total since the agent started. In each run one drun and one torchrun are started at
//!    the same moment and read over the same window (the readings are per process).
//! 6. **Faults of the network, on a bed of hosts** (rows `bed-*`; `tests/harness/netbed.rs`, the
//!    tests' network-namespace bed, included as it is): hosts `server`, `n0`, `n1`, `n2` on one
//!    switch, one agent per host `n0`–`n2` (`--nnodes 2:3 --nproc-per-node 1`, its host's address
//!    as `--local-addr`, `GLOO_SOCKET_IFNAME=eth0`), each running `benches/workers/bed_steps.py`
//!    (a gloo all_reduce every 0.1 s, each completed step stamped with its wall time; the job's
//!    step counter checkpointed by rank 0 every 10 steps and resumed from by new workers). drun
//!    through `drun-rendezvous serve --store memory` on host `server`; torchrun with
//!    `--rdzv-backend c10d --rdzv-endpoint <n0's address>:<port>` (the store hosted by n0's
//!    agent, as torchrun users do) and `--max-restarts 3`. Default settings otherwise. Once the
//!    three train at world 3 (and 1 s more) the fault is injected:
//!    - `bed-cable0` / `bed-cable1`: the cable of the host of node rank 0 / 1 (its worker's
//!      `GROUP_RANK`) is pulled and stays out;
//!    - `bed-partition`: n1 and n2 can no longer reach each other (blackhole routes both ways);
//!      both still reach n0 and the server;
//!    - `bed-outage`: the control plane's host is cut off for 30 s, then plugged back: under drun
//!      the rendezvous server's host `server`; under torchrun n0, the host whose agent holds the
//!      c10d store (torchrun has no control plane of its own: its store lives on a training node,
//!      so losing it also loses a node).
//!
//!    Measured over the steps of every worker merged: **recovery**, the seconds from the fault
//!    until a world completes an all_reduce again (the step that ends the first pause of more
//!    than 1 s after the fault); for `bed-outage` instead the longest gap between two
//!    consecutive steps from the last step before the fault until the steps flow (a step in the
//!    last second) 10 s or more after the plug, and in how many runs new workers started (a
//!    re-form). **Work
//!    lost**: the training time lost, the seconds from the last step completed before that pause
//!    (an all_reduce whose data was exchanged may still complete just after the fault) until the
//!    job's step counter passes that step again, less one step's usual time (the
//!    median interval before the fault): the pause plus the steps done again from the
//!    checkpoint. Each run gets a fresh bed, removed with every process in it at the end. In the
//!    cable and partition rows a launcher's first run that does not recover is not repeated.
//!    Without root, `ip` or `unshare` these rows are skipped with one line.
//!
//! A run that does not recover within `DRUN_BENCH_BOUND` seconds (default 120) counts as
//! infinite: the median is a number only when most runs recovered, else the cell says "did not
//! recover"; in the hung-host row a launcher's first such run is not repeated (torchrun has no
//! hang detector; only the workers' collective timeout, 30 min for gloo, would end it). Rows are
//! chosen with `DRUN_BENCH_ONLY` / `DRUN_BENCH_SKIP` (comma-separated of `loss`, `loss-early`,
//! `loss-etcd`, `loss-etcd-backend`, `loss-cold`, `hung`, `fail`, `fail-cold`, `fail-standalone`,
//! `fail-standalone-early`, `arrivals`, `arrivals-window`, `launch`, `launch-torch`, `spawn`, `rdzv`,
//! `idle`, `bed-cable0`, `bed-cable1`,
//! `bed-partition`, `bed-outage`). Every process of a run carries the run's
//! tag in its environment; at the end of the run every launcher's process group and every tagged
//! process (workers that left their group included) is SIGKILLed. Agent logs of a run that
//! fails to start are printed to stderr, with progress lines; the table goes to stdout as
//! Markdown (`DRUN_BENCH_KEEP=1` keeps each run's worker records and agent logs). Only loopback
//! addresses are used, and the bed's own (`10.77.0.0/24`, inside its namespaces).

#[path = "recovery/arrivals.rs"]
mod arrivals;
#[path = "recovery/bed.rs"]
mod bed;
mod common;
#[path = "recovery/launch.rs"]
mod launch;
#[path = "recovery/records.rs"]
mod records;
#[path = "recovery/table.rs"]
mod table;
use common::procs::{cpu_time, listening, peak_rss_kib, Procs};
use common::{free_port, now_ns, runs, torch_python, torchrun, Etcd, RdzvServer};

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use launch::launch_rows;
use nix::sys::signal::{kill, Signal};
use records::{group_phases, group_ready, log_tails, poll, records};
use table::{fmt, Cell, Row, Unit};

const ROWS: [&str; 21] = [
    "loss",
    "loss-early",
    "loss-etcd",
    "loss-etcd-backend",
    "loss-cold",
    "hung",
    "fail",
    "fail-cold",
    "fail-standalone",
    "fail-standalone-early",
    "arrivals",
    "arrivals-window",
    "launch",
    "launch-torch",
    "spawn",
    "rdzv",
    "idle",
    "bed-cable0",
    "bed-cable1",
    "bed-partition",
    "bed-outage",
];

/// Drops what the bench's own environment may carry of a job (a launcher's worker variables,
/// log levels), so each launcher starts from the same clean slate.
fn clear_job_env(c: &mut Command) {
    for k in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "DRUN_LOG",
        "RUST_LOG",
    ] {
        c.env_remove(k);
    }
}

fn env_secs(key: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(key)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// Whether row `key` is selected by `DRUN_BENCH_ONLY` / `DRUN_BENCH_SKIP`.
fn selected(key: &str) -> bool {
    let list = |var: &str| {
        std::env::var(var).ok().map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .collect::<Vec<_>>()
        })
    };
    let only = list("DRUN_BENCH_ONLY").is_none_or(|l| l.iter().any(|k| k == key));
    let skip = list("DRUN_BENCH_SKIP").is_some_and(|l| l.iter().any(|k| k == key));
    only && !skip
}

struct Bench {
    python: PathBuf,
    torchrun: Option<PathBuf>,
    runs: usize,
    bound: Duration,
    idle: Duration,
    /// [`When::Steady`].
    steady: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Launcher {
    Drun,
    Torchrun,
}

impl Launcher {
    fn name(self) -> &'static str {
        match self {
            Launcher::Drun => "drun",
            Launcher::Torchrun => "torchrun",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// A `drun-rendezvous` server on its memory store.
    Memory,
    /// A `drun-rendezvous` server on etcd.
    Etcd,
    /// `--rdzv-backend etcd`: every agent's session directly on etcd, no server.
    AgentEtcd,
}

/// How drun runs a recovery row: its store, and whether its workers start cold
/// (`--warm-workers off`).
#[derive(Clone, Copy, PartialEq, Eq)]
struct How {
    store: Store,
    cold: bool,
}

impl How {
    const MEMORY: How = How {
        store: Store::Memory,
        cold: false,
    };
    const COLD: How = How {
        store: Store::Memory,
        cold: true,
    };
    const ETCD: How = How {
        store: Store::Etcd,
        cold: false,
    };
    const AGENT_ETCD: How = How {
        store: Store::AgentEtcd,
        cold: false,
    };
}

/// What happens in a recovery scenario.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL of the third agent (drun) or of the third agent and its worker (torchrun).
    Crash,
    /// SIGSTOP of every process of the third node.
    Hang,
    /// Rank 1 exits 1 in the first generation (3 nodes, 1 worker each).
    WorkerExit,
    /// Rank 1 exits 1 in the first generation of a `--standalone` job of 2 workers.
    StandaloneExit,
}

/// When the fault comes, counted from the moment every worker did its first all_reduce.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    /// In steady training: `DRUN_BENCH_STEADY` seconds later (default 5), and under drun not
    /// before the spare warm interpreters a restart hands off to have imported torch (see
    /// [`wait_for_fault`]). A real fault lands hours into a run far more often than in its
    /// first seconds.
    Steady,
    /// 1 s later: the spares, started with the generation, may still be importing torch (on
    /// this machine the training saturates both cores and the import gets a third of them).
    Early,
}

impl When {
    fn after(self, b: &Bench) -> Duration {
        match self {
            When::Steady => b.steady,
            When::Early => Duration::from_secs(1),
        }
    }
}

/// One recovery run.
enum Sample {
    /// Seconds from the fault until both new workers started, and until both did their first
    /// all_reduce.
    Recovered {
        started: f64,
        ready: f64,
        /// [`records::group_phases`]: spawned, import, init, first all_reduce.
        phases: [f64; 4],
    },
    /// Not within the bound.
    NotRecovered,
    /// The job never reached its first generation (an environment problem, not a result).
    SetupFailed,
}

/// One run of a recovery scenario with launcher `l`.
fn recovery(b: &Bench, l: Launcher, fault: Fault, how: How, when: When, run: usize) -> Sample {
    let (nodes, nnodes, workers_after) = match fault {
        Fault::WorkerExit => (3, "3", 3),
        Fault::StandaloneExit => (1, "1", 2),
        Fault::Crash | Fault::Hang => (3, "2:3", 2),
    };
    let store = how.store;
    let fails = matches!(fault, Fault::WorkerExit | Fault::StandaloneExit);
    let standalone = fault == Fault::StandaloneExit;
    let dir = tempfile::tempdir().unwrap();
    let (recs, logs) = (dir.path().join("rec"), dir.path().join("log"));
    std::fs::create_dir_all(&recs).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/workers/recovery.py");
    let id = format!("rec{run}");
    let etcd = (store != Store::Memory && l == Launcher::Drun).then(Etcd::start);
    let server =
        (l == Launcher::Drun && !standalone && store != Store::AgentEtcd).then(|| match &etcd {
            Some(e) => RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &e.endpoint]),
            None => RdzvServer::start(&["--store", "memory"]),
        });
    let port = free_port();
    let make = |i: usize| {
        let mut c = match l {
            Launcher::Drun => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_drun"));
                if let Some(server) = &server {
                    c.args(["--rdzv-endpoint", &server.1]);
                } else if let (Store::AgentEtcd, Some(e)) = (store, &etcd) {
                    c.args(["--rdzv-backend", "etcd", "--rdzv-endpoint", &e.endpoint]);
                }
                if fails {
                    c.args(["--max-restarts", "3"]);
                }
                c.arg("--python").arg(&b.python);
                c
            }
            Launcher::Torchrun => {
                let mut c = Command::new(b.torchrun.as_ref().unwrap());
                if !standalone {
                    c.args(["--rdzv-backend", "c10d"])
                        .args(["--rdzv-endpoint", &format!("127.0.0.1:{port}")]);
                }
                c.args(["--max-restarts", "3"]);
                c
            }
        };
        if standalone {
            c.args(["--standalone", "--nproc-per-node", "2"]);
        } else {
            c.args([
                "--nnodes",
                nnodes,
                "--nproc-per-node",
                "1",
                "--rdzv-id",
                &id,
            ])
            .arg("--local-addr")
            .arg(format!("127.0.0.{}", i + 1));
        }
        c.arg(&worker).arg(&recs);
        if fails {
            // Rank 1 exits at its first step once the bench creates `recs/go` (see `inject`).
            c.args(["1", "go"]);
        }
        clear_job_env(&mut c);
        if how.cold {
            c.env("DRUN_WARM_WORKERS", "off");
        }
        let log = File::create(logs.join(format!("agent{i}.log"))).unwrap();
        c.stdout(log.try_clone().unwrap()).stderr(log);
        c
    };
    let mut procs = Procs::new(&format!("{}-{}", l.name(), id));
    let mut agents = Vec::new();
    for i in 0..nodes {
        agents.push(procs.spawn(make(i), i).expect("start launcher"));
        if l == Launcher::Torchrun && i == 0 {
            // The first agent hosts the c10d store, so that the victim (the third) is not it.
            poll(Duration::from_secs(60), || listening(port).then_some(()));
        }
    }
    let formed = poll(Duration::from_secs(180), || {
        group_ready(
            &records(&recs),
            0,
            if standalone { 2 } else { nodes as u64 },
        )
    });
    if formed.is_none() {
        eprintln!("  {} did not start its first generation:", l.name());
        log_tails(&logs, nodes);
        return Sample::SetupFailed;
    }
    let spares = match (l, how.cold, standalone) {
        (Launcher::Drun, false, true) => 2,
        (Launcher::Drun, false, false) => 1,
        _ => 0,
    };
    wait_for_fault(b, when, &agents, spares);
    let Some(t0) = inject(fault, l, &agents, &procs, &recs) else {
        eprintln!("  the failing worker never exited:");
        log_tails(&logs, nodes);
        return Sample::SetupFailed;
    };
    let after = poll(b.bound, || group_ready(&records(&recs), t0, workers_after));
    let sample = match after {
        Some((s, r)) => Sample::Recovered {
            started: s as f64 / 1e9,
            ready: r as f64 / 1e9,
            phases: group_phases(&records(&recs), t0, workers_after).unwrap_or_default(),
        },
        None => Sample::NotRecovered,
    };
    if l == Launcher::Drun {
        show_drun_restart(&logs, nodes, &sample);
    }
    procs.kill_all();
    if std::env::var_os("DRUN_BENCH_KEEP").is_some() {
        eprintln!("  kept {}", dir.keep().display());
    }
    sample
}

/// Waits, from the moment the group was ready, until the fault is due ([`When`]): 1 s early;
/// in steady training `b.steady`, and until each of drun's `agents` has `spares` warm
/// interpreters that imported torch and wait for a hand-off (bounded by 180 s, then it goes on
/// with a line).
fn wait_for_fault(b: &Bench, when: When, agents: &[nix::unistd::Pid], spares: usize) {
    let t0 = Instant::now();
    std::thread::sleep(when.after(b));
    if when == When::Early || spares == 0 {
        return;
    }
    let ready = || {
        agents
            .iter()
            .all(|a| idle_spares(*a) >= spares)
            .then_some(())
    };
    if poll(Duration::from_secs(180), ready).is_none() {
        eprintln!("  the spare warm interpreters did not get ready within 180 s; injecting anyway");
    }
    let waited = t0.elapsed().as_secs_f64();
    if waited > b.steady.as_secs_f64() + 0.5 {
        eprintln!("  (spares ready {waited:.1} s after the group)");
    }
}

/// How many of agent `agent`'s children are warm interpreters blocked reading their hand-off
/// socket: they imported torch and wait (a worker, started on one, trains or sleeps instead).
fn idle_spares(agent: nix::unistd::Pid) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let parent = agent.as_raw().to_string();
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            let p = e.path();
            let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
            // pid (comm) state ppid ...: the comm may hold spaces, so split after its ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1));
            ppid == Some(parent.as_str())
                // A warm interpreter runs drun's one-line stub (`launcher/src/warm/handoff.rs`
                // STUB); so does the worker it became, which is not blocked on its socket.
                && std::fs::read(p.join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("DRUN_WARM_BOOTSTRAP"))
                && std::fs::read_to_string(p.join("wchan"))
                    .is_ok_and(|w| w.starts_with("unix_stream"))
        })
        .count()
}

/// Injects `fault` into the third agent (or lets the failing worker exit, creating `recs/go`):
/// the fault's instant in ns, or None when the worker never exited.
fn inject(
    fault: Fault,
    l: Launcher,
    agents: &[nix::unistd::Pid],
    procs: &Procs,
    recs: &Path,
) -> Option<u128> {
    match fault {
        Fault::Crash | Fault::Hang => {
            let t0 = now_ns();
            match (fault, l) {
                (Fault::Crash, Launcher::Drun) => kill(agents[2], Signal::SIGKILL).unwrap(),
                (Fault::Crash, Launcher::Torchrun) => {
                    procs.signal_node(2, Signal::SIGKILL);
                }
                _ => {
                    procs.signal_node(2, Signal::SIGSTOP);
                }
            }
            Some(t0)
        }
        Fault::WorkerExit | Fault::StandaloneExit => {
            std::fs::write(recs.join("go"), b"").expect("write the go file");
            poll(Duration::from_secs(60), || {
                records(recs).iter().find_map(|r| r.exit_ns)
            })
        }
    }
}

/// Prints drun agent 0's restart line (or, when it did not recover, the agents' log tails).
fn show_drun_restart(logs: &Path, nodes: usize, sample: &Sample) {
    let text = std::fs::read_to_string(logs.join("agent0.log")).unwrap_or_default();
    if let Some(line) = text.lines().find(|l| l.contains("restart into generation")) {
        let at = line.find("restart into").unwrap();
        eprintln!("  drun agent 0: {}", &line[at..]);
    } else if matches!(sample, Sample::NotRecovered) {
        log_tails(logs, nodes);
    }
}

/// The phases of a group's start (see [`records::group_phases`]), one line.
fn show_phases(p: &[f64; 4]) -> String {
    format!(
        "workers started {}, imported torch +{}, joined the group +{}, first all_reduce +{}",
        fmt(p[0], Unit::Seconds),
        fmt(p[1], Unit::Seconds),
        fmt(p[2], Unit::Seconds),
        fmt(p[3], Unit::Seconds)
    )
}

fn launchers(b: &Bench) -> Vec<Launcher> {
    let mut v = vec![Launcher::Drun];
    if b.torchrun.is_some() {
        v.push(Launcher::Torchrun);
    }
    v
}

/// Rows 1-3: a recovery scenario, both launchers alternating.
/// With `give_up`, a launcher's first run that does not recover ends its part of the row (for a
/// hang torchrun has no detector: only the workers' collective timeout, 30 min for gloo, ends it).
fn recovery_rows(
    b: &Bench,
    what: &str,
    fault: Fault,
    how: How,
    when: When,
    with_torch: bool,
    give_up: bool,
) -> [Row; 2] {
    let mut started = Row::new(format!("{what} → both new workers started"), Unit::Seconds);
    let mut ready = Row::new(
        format!("{what} → new group's first all_reduce"),
        Unit::Seconds,
    );
    let mut all_phases: Vec<Vec<[f64; 4]>> = vec![Vec::new(); 2];
    let ls: Vec<Launcher> = launchers(b)
        .into_iter()
        .filter(|&l| with_torch || l == Launcher::Drun)
        .collect();
    for run in 0..b.runs {
        for &l in &ls {
            if give_up && started.cell(l).gave_up() {
                continue;
            }
            let sample = recovery(b, l, fault, how, when, run);
            let (s, r) = match sample {
                Sample::Recovered {
                    started,
                    ready,
                    phases,
                } => {
                    eprintln!(
                        "[{what}] run {}/{} {}: new workers started after {}, first all_reduce after {} ({})",
                        run + 1,
                        b.runs,
                        l.name(),
                        fmt(started, Unit::Seconds),
                        fmt(ready, Unit::Seconds),
                        show_phases(&phases)
                    );
                    all_phases[l as usize].push(phases);
                    (started, ready)
                }
                Sample::NotRecovered => {
                    eprintln!(
                        "[{what}] run {}/{} {}: did not recover in {} s",
                        run + 1,
                        b.runs,
                        l.name(),
                        b.bound.as_secs()
                    );
                    (f64::INFINITY, f64::INFINITY)
                }
                Sample::SetupFailed => {
                    started.cell(l).setup_failed += 1;
                    ready.cell(l).setup_failed += 1;
                    continue;
                }
            };
            started.cell(l).values.push(s);
            ready.cell(l).values.push(r);
        }
    }
    for &l in &ls {
        let runs = &all_phases[l as usize];
        if runs.is_empty() {
            continue;
        }
        let median = |i: usize| {
            let mut v: Vec<f64> = runs.iter().map(|p| p[i]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        ready.cell(l).note = Some(format!(
            "medians: {}",
            show_phases(&[median(0), median(1), median(2), median(3)])
        ));
    }
    if !with_torch {
        for row in [&mut started, &mut ready] {
            row.torchrun = Cell::absent(if how.cold {
                "— (drun's cold start; see above)"
            } else if when == When::Early {
                "— (as in steady training; see above)"
            } else {
                "— (c10d only; see above)"
            });
        }
    }
    [started, ready]
}

/// Row 5: in each run one drun and one torchrun agent (`--standalone`, 2 sleeping workers),
/// started together and read over the same idle window.
fn idle_rows(b: &Bench) -> [Row; 3] {
    let secs = b.idle.as_secs();
    let mut rss = Row::new(
        "agent peak RSS (VmHWM), `--standalone`, 2 workers sleeping",
        Unit::Mib,
    );
    let mut cpu = Row::new(
        format!("agent CPU time (user+sys) during {secs} s idle"),
        Unit::CpuSeconds,
    );
    let mut total = Row::new(
        format!("agent CPU time since start (startup + {secs} s idle)"),
        Unit::CpuSeconds,
    );
    const SLEEPER: &str = "touch \"$0/$RANK\"; exec sleep 3600";
    for run in 0..b.runs {
        let mut procs = Procs::new(&format!("idle{run}"));
        let mut agents = Vec::new();
        for (i, l) in launchers(b).into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let mut c = match l {
                Launcher::Drun => Command::new(env!("CARGO_BIN_EXE_drun")),
                Launcher::Torchrun => Command::new(b.torchrun.as_ref().unwrap()),
            };
            c.args(["--standalone", "--nproc-per-node", "2", "--no-python"])
                .args(["sh", "-c", SLEEPER])
                .arg(dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let pid = procs.spawn(c, i).expect("start launcher");
            agents.push((l, pid, dir));
        }
        let up = poll(Duration::from_secs(120), || {
            agents
                .iter()
                .all(|(_, _, d)| d.path().join("0").exists() && d.path().join("1").exists())
                .then_some(())
        });
        assert!(up.is_some(), "idle run {run}: workers did not start");
        let cpu0: Vec<Duration> = agents
            .iter()
            .map(|(_, p, _)| cpu_time(*p).expect("agent alive"))
            .collect();
        std::thread::sleep(b.idle);
        for ((l, pid, _), c0) in agents.iter().zip(cpu0) {
            let c1 = cpu_time(*pid).expect("agent alive after the idle window");
            let hwm = peak_rss_kib(*pid).expect("VmHWM");
            rss.cell(*l).values.push(hwm as f64 / 1024.0);
            cpu.cell(*l).values.push((c1 - c0).as_secs_f64());
            total.cell(*l).values.push(c1.as_secs_f64());
        }
        procs.kill_all();
        eprintln!("[idle] run {}/{} done", run + 1, b.runs);
    }
    [rss, cpu, total]
}

fn main() {
    let started = Instant::now();
    let python = torch_python().expect("python with torch: set DRUN_TORCH_PYTHON");
    let b = Bench {
        python,
        torchrun: torchrun(),
        runs: runs(5),
        bound: env_secs("DRUN_BENCH_BOUND", 120),
        idle: env_secs("DRUN_BENCH_IDLE", 30),
        steady: env_secs("DRUN_BENCH_STEADY", 5),
    };
    let unknown: Vec<String> = ["DRUN_BENCH_ONLY", "DRUN_BENCH_SKIP"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .flat_map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|k| !k.is_empty() && !ROWS.contains(&k.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "unknown rows {unknown:?}; known: {ROWS:?}"
    );
    let mut rows: Vec<Row> = Vec::new();
    let loss = "node loss, SIGKILL of 1 of 3 agents, defaults";
    let fail = "worker exits 1 (3 agents, `--max-restarts 3`)";
    let early = "the fault 1 s after the group was ready (the spares still importing torch)";
    let standalone = "worker exits 1 (`--standalone --nproc-per-node 2`, `--max-restarts 3`)";
    // (row key, what, fault, how drun runs, when, torchrun beside it, give up after a first miss)
    let recovery_table = [
        (
            "loss",
            format!("{loss}, drun memory store"),
            Fault::Crash,
            How::MEMORY,
            When::Steady,
            true,
            false,
        ),
        (
            "loss-early",
            format!("{loss}, {early}"),
            Fault::Crash,
            How::MEMORY,
            When::Early,
            false,
            false,
        ),
        (
            "loss-etcd",
            format!("{loss}, drun etcd store"),
            Fault::Crash,
            How::ETCD,
            When::Steady,
            false,
            false,
        ),
        (
            "loss-etcd-backend",
            format!("{loss}, drun `--rdzv-backend etcd` (no server)"),
            Fault::Crash,
            How::AGENT_ETCD,
            When::Steady,
            false,
            false,
        ),
        (
            "loss-cold",
            format!("{loss}, drun with `--warm-workers off`"),
            Fault::Crash,
            How::COLD,
            When::Steady,
            false,
            false,
        ),
        (
            "hung",
            "hung host, SIGSTOP of 1 of 3 agents and its worker, defaults".to_string(),
            Fault::Hang,
            How::MEMORY,
            When::Steady,
            true,
            true,
        ),
        (
            "fail",
            fail.to_string(),
            Fault::WorkerExit,
            How::MEMORY,
            When::Steady,
            true,
            false,
        ),
        (
            "fail-cold",
            format!("{fail}, drun with `--warm-workers off`"),
            Fault::WorkerExit,
            How::COLD,
            When::Steady,
            false,
            false,
        ),
        (
            "fail-standalone",
            standalone.to_string(),
            Fault::StandaloneExit,
            How::MEMORY,
            When::Steady,
            true,
            false,
        ),
        (
            "fail-standalone-early",
            format!("{standalone}, {early}"),
            Fault::StandaloneExit,
            How::MEMORY,
            When::Early,
            false,
            false,
        ),
    ];
    for (key, what, fault, how, when, with_torch, give_up) in recovery_table {
        if selected(key) {
            rows.extend(recovery_rows(
                &b, &what, fault, how, when, with_torch, give_up,
            ));
        }
    }
    if selected("arrivals") {
        rows.push(arrivals::arrivals_row(&b, 4));
    }
    if selected("arrivals-window") {
        rows.push(arrivals::arrivals_row(&b, 5));
    }
    launch_rows(&b, &mut rows);
    if selected("idle") {
        rows.extend(idle_rows(&b));
    }
    bed::network_rows(&b, &mut rows);

    let torch_version = Command::new(&b.python)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "drun vs torchrun {torch_version}: medians of {} runs each, alternating [min–max]; {cores} cores; bench took {:.0} s",
        b.runs,
        started.elapsed().as_secs_f64()
    );
    println!();
    println!("| measurement | drun | torchrun | drun/torchrun |");
    println!("|---|---|---|---|");
    for r in &rows {
        let torch = if b.torchrun.is_none() && r.torchrun.absent.is_none() {
            "— (torchrun not found)".to_string()
        } else {
            r.torchrun.show(r.unit, b.bound, b.runs)
        };
        println!(
            "| {} | {} | {} | {} |",
            r.name,
            r.drun.show(r.unit, b.bound, b.runs),
            torch,
            r.ratio(b.bound)
        );
    }
}
