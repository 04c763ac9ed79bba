//! Runs one schedule for real: a `drun-rendezvous` server (over its memory store or over etcd),
//! agents on loopback addresses or on the hosts of a network test bed (`place.rs`) running
//! `tests/workers/chaos_worker.py` (or its torch twin), the faults applied with real signals (and
//! on the bed, with cables, routes and token buckets); then the history, the ledger and the
//! outcome go to the checker, and a torch run's final model is compared with a fault-free run's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::check::check;
use super::history::{self, Corruption, Data, Kind, Ledger, Outcome};
use super::place::Place;
use super::schedule::{Event, Schedule, StoreKind, TTL_S};
use super::torch;
use crate::harness::cluster::{rendezvous_bin, Etcd, RdzvServer};
use crate::harness::{alive, drun, processes_of_run, worker, Agent, DrunCmd};

/// The workers' data: 192 samples, global batch 24 (a multiple of every world size 1..8 the
/// generator can make), 3 epochs: 24 steps.
pub const DATA: Data = Data {
    len: 192,
    global_batch: 24,
    epochs: 3,
};
/// Seconds per step of the worker.
const STEP_S: f64 = 0.2;
/// Seconds per step on the network test bed: the network's faults last seconds (a cable cut
/// past the lease TTL, a control-plane outage of up to 3 TTLs), so the training lasts longer
/// (about 19 s without faults) for them to hit a running job rather than one already over.
const BED_STEP_S: f64 = 0.8;

/// The worker the agents run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Worker {
    /// `tests/workers/chaos_worker.py` (stdlib only, no model).
    Stdlib,
    /// `tests/workers/chaos_torch_worker.py` under this interpreter (torch, gloo): a float64
    /// linear regression whose final parameters must match a fault-free run's ([`torch::TOL`]).
    Torch(PathBuf),
}

/// What a passing run did.
#[derive(Debug, Default)]
pub struct Stats {
    /// Faults applied, and those skipped because the run had already ended.
    pub applied: usize,
    pub skipped: usize,
    /// Generations that started workers.
    pub generations: usize,
    pub elapsed: Duration,
    /// Agents that exited 5 at a preemption warning and were started again.
    pub requeued: usize,
    /// Torch runs: the largest |Δ| between the final parameters and the fault-free run's.
    pub max_delta: Option<f64>,
    /// Agents SIGKILLed while a `.drun-persist-*` file of theirs was in `--ckpt-dir`
    /// ([`Event::KillPersisting`]).
    pub killed_persisting: usize,
    /// Agents SIGKILLed while they held a replica of their ring predecessor's staged
    /// checkpoint ([`Event::KillReplicaHolder`]).
    pub killed_replica_holder: usize,
    /// Resume points an agent took from the survivors' copies in memory (`--ckpt-replicas`),
    /// from the agents' logs.
    pub resumed_from_memory: usize,
}

/// `--ckpt-memory` schedules: bytes per second the agents' persisters write. A chaos worker's
/// file is about 20 bytes: each takes some 150 ms to reach the disk, a node's step (two ranks)
/// about as long as the worker's two steps between saves, so the disk keeps up but an agent is
/// mostly in the middle of persisting.
const PERSIST_RATE: &str = "128";

fn signal(pid: i32, sig: Signal) {
    // The process may be gone already (a fault can race the run's own end): not an error.
    let _ = kill(Pid::from_raw(pid), sig);
}

struct Cluster {
    /// The etcd members (none over the memory store), stopped with the cluster.
    etcd: Vec<Etcd>,
    server: RdzvServer,
    endpoint: String,
    store_args: Vec<String>,
    run: String,
    out: PathBuf,
    server_log: PathBuf,
    ckpt: PathBuf,
    nproc: u32,
    /// The worker's seconds per step.
    step_s: f64,
    worker: Worker,
    env: Vec<(String, String)>,
    /// `--ckpt-memory` with a slowed persister ([`Schedule::ckpt_memory`]), its tmpfs stand-in.
    ckpt_memory: Option<PathBuf>,
    /// `--ckpt-replicas 1` beside `--ckpt-memory` ([`Schedule::replicas`]).
    replicas: bool,
    /// Last, so that it goes after the server and the agents (a bed removes its hosts).
    place: Place,
}

impl Cluster {
    fn agent(&self, slot: usize) -> Agent {
        let mut c = drun();
        c.job(&self.run, &format!("1:{}", super::schedule::MAX_AGENTS))
            .nproc(self.nproc)
            .quick_shutdown();
        self.place.address(slot, &mut c);
        c.args(["--rdzv-endpoint", &self.endpoint, "--rdzv-conf"])
            .arg(format!("lease_ttl={TTL_S},last_call_timeout=0.5"))
            .args([
                "--max-restarts",
                "1000",
                "--ckpt-verify",
                "digest",
                "--on-preempt",
                "checkpoint",
                "--ckpt-dir",
            ])
            .arg(&self.ckpt);
        // Before the script: what follows it is the script's.
        if let Some(stage) = &self.ckpt_memory {
            // A tmpfs stand-in per slot: the runner sees which agent holds what.
            let stage = stage.join(slot.to_string());
            std::fs::create_dir_all(&stage).expect("the slot's staging parent");
            c.args(["--ckpt-memory", "64M"])
                .env("DRUN_CKPT_STAGE_PARENT", stage)
                .env("DRUN_CKPT_PERSIST_RATE", PERSIST_RATE);
            if self.replicas {
                c.args(["--ckpt-replicas", "1"]);
            }
        } else {
            // The direct path on purpose: a commit answers once its step is sealed on disk, and
            // the history's checks read the seals the ranks heard ([`Cluster::sealed`]). The
            // schedules of the memory path are the `--ckpt-memory` ones above.
            c.args(["--ckpt-memory", "off"]);
        }
        match &self.worker {
            Worker::Stdlib => c.arg(worker("chaos_worker.py")),
            Worker::Torch(python) => c.python(python).arg(torch::script()),
        };
        c.env("CHAOS_OUT", &self.out)
            .env("CHAOS_NODE", slot.to_string())
            .env("CHAOS_SLEEP", self.step_s.to_string());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        Agent::start(self.place.on_agent_host(slot, c))
    }

    /// Checkpoints sealed so far: the seals the ranks heard, or with `--ckpt-memory` (where a
    /// commit is answered before its step is sealed) the manifests in `--ckpt-dir`.
    fn sealed(&self) -> usize {
        if self.ckpt_memory.is_none() {
            return self.history_text().matches("\"sealed\": true").count();
        }
        let entries = |d: PathBuf| std::fs::read_dir(d).into_iter().flatten().flatten();
        // <ckpt>/<run>/step-…/drun-manifest-….json
        entries(self.ckpt.clone())
            .flat_map(|run| entries(run.path()))
            .flat_map(|step| entries(step.path()))
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("drun-manifest-")
            })
            .count()
    }

    /// Whether the agent of `slot` holds a replica of another node's staged checkpoint: a file
    /// under the `.replicas` of its staging directory.
    fn holds_replica(&self, slot: usize) -> bool {
        fn walk(dir: &Path, depth: usize, inside: bool) -> bool {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    let p = e.path();
                    let inside = inside || e.file_name() == ".replicas";
                    if p.is_dir() {
                        depth > 0 && walk(&p, depth - 1, inside)
                    } else {
                        inside
                    }
                })
        }
        self.ckpt_memory
            .as_ref()
            .is_some_and(|stage| walk(&stage.join(slot.to_string()), 6, false))
    }

    /// Whether the persister of the agent of `pid` is writing a file to `--ckpt-dir`: a
    /// `.drun-persist-<boot>.<pidns>.<pid>.<start>-…` file of that pid is there.
    fn persisting(&self, pid: i32) -> bool {
        fn walk(dir: &Path, depth: usize, pid: &str) -> bool {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let owner = name
                        .strip_prefix(".drun-persist-")
                        .and_then(|r| r.split('-').next())
                        .and_then(|token| token.split('.').nth(2));
                    owner == Some(pid) || (depth > 0 && walk(&e.path(), depth - 1, pid))
                })
        }
        walk(&self.ckpt, 3, &pid.to_string())
    }

    fn history_text(&self) -> String {
        std::fs::read_to_string(self.out.join("history.jsonl")).unwrap_or_default()
    }

    fn ledger(&self) -> Result<Ledger, String> {
        let mut status = Command::new(rendezvous_bin());
        status.args(["status", &self.run, "--json", "--endpoint", &self.endpoint]);
        let o = self
            .place
            .beside_server(status)
            .output()
            .map_err(|e| format!("drun-rendezvous status: {e}"))?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .map_err(|e| format!("status JSON: {e}: {}", String::from_utf8_lossy(&o.stderr)))?;
        serde_json::from_value(v["checkpoints"].clone()).map_err(|e| format!("ledger: {e}"))
    }
}

/// SIGKILLs agent `a` once `caught` says it is in the state the fault wants (persisting,
/// holding a replica), or after 30 s; whether it was caught so (not when it exited first).
fn kill_when(a: &mut Agent, mut caught: impl FnMut() -> bool) -> bool {
    let mut over = false;
    let in_state = wait_until(Duration::from_secs(30), || {
        over = exited(a);
        over || caught()
    }) && !over;
    signal(a.pid(), Signal::SIGKILL);
    in_state
}

fn exited(a: &mut Agent) -> bool {
    a.child.try_wait().ok().flatten().is_some()
}

/// Waits for `a` up to `deadline`; its exit code (128+signal), or None (then it is killed), and
/// its stderr.
fn finish(mut a: Agent, deadline: Instant, log: &Path) -> (Option<i32>, String) {
    while !exited(&mut a) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let timed_out = !exited(&mut a);
    if timed_out {
        signal(a.pid(), Signal::SIGKILL);
    }
    let (code, out, err) = a.wait(Duration::from_secs(10));
    let _ = std::fs::write(log, format!("{err}\n--- stdout ---\n{out}"));
    ((!timed_out).then_some(code), err)
}

/// Runs `s` with `worker` and extra worker environment `env`; Ok with what it did when every
/// invariant holds (and, for torch, the final model matches the fault-free run's), else the
/// report: seed, schedule, events as applied, violations with their history excerpts, and where
/// the logs were kept (`$TMPDIR/drun-chaos-<seed>-<store>[-bed]-<pid>`, also kept for a passing
/// run when `DRUN_CHAOS_KEEP` is set). A bed schedule where no bed can be built is skipped (a
/// note, and every fault counted as skipped).
pub fn run(s: &Schedule, worker: &Worker, env: &[(&str, &str)]) -> Result<Stats, String> {
    let store = match s.store {
        StoreKind::Memory => "memory",
        StoreKind::Etcd => "etcd",
    };
    let Some(place) = Place::for_schedule(s) else {
        return Ok(Stats {
            skipped: s.faults(),
            ..Stats::default()
        });
    };
    let on = if s.bed { "-bed" } else { "" };
    let dir = std::env::temp_dir().join(format!(
        "drun-chaos-{}-{store}{on}-{}",
        s.seed,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("out")).unwrap();
    std::fs::create_dir_all(dir.join("shm")).unwrap();
    let etcd: Vec<Etcd> = if s.store == StoreKind::Etcd {
        Etcd::cluster(s.etcd_members())
    } else {
        Vec::new()
    };
    let store_args: Vec<String> = if etcd.is_empty() {
        vec!["--store".into(), "memory".into()]
    } else {
        let endpoints: Vec<&str> = etcd.iter().map(|e| e.endpoint.as_str()).collect();
        vec![
            "--store".into(),
            "etcd".into(),
            "--etcd-endpoints".into(),
            endpoints.join(","),
        ]
    };
    let args: Vec<&str> = store_args.iter().map(String::as_str).collect();
    let server = place.server(&args, &dir.join("server.log"));
    let c = Cluster {
        endpoint: server.endpoint.clone(),
        server,
        etcd,
        store_args,
        // The test process's pid too: tests of one seed and store (`chaos_ci_seed_1_etcd` and
        // `chaos_ci_seed_1_etcd_members`) may run side by side, and the leftover check looks
        // processes up by run id.
        run: format!(
            "chaos{}{store}{}-{}",
            s.seed,
            if s.bed { "bed" } else { "" },
            std::process::id()
        ),
        out: dir.join("out"),
        server_log: dir.join("server.log"),
        ckpt: dir.join("ckpt"),
        nproc: s.nproc,
        step_s: if s.bed { BED_STEP_S } else { STEP_S },
        worker: worker.clone(),
        ckpt_memory: s.ckpt_memory().then(|| dir.join("shm")),
        replicas: s.replicas(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        place,
    };
    let mut c = c;
    // The fault-free reference trains beside the chaos run (once per process).
    let reference = match worker {
        Worker::Torch(python) => {
            let python = python.clone();
            Some(std::thread::spawn(move || {
                torch::reference(&python, DATA).map(|_| ())
            }))
        }
        Worker::Stdlib => None,
    };
    let t0 = Instant::now();
    let mut slots: Vec<Option<Agent>> = (0..s.agents).map(|i| Some(c.agent(i))).collect();
    let mut gone: Vec<(usize, Agent, bool)> = Vec::new(); // (slot, agent, left on SIGTERM)
    let mut log = Vec::new();
    let mut stats = Stats::default();
    let mut outcome = Outcome::default();
    let bound =
        Duration::from_millis(s.bound_ms((DATA.total_steps() as f64 * c.step_s * 1000.0) as u64));
    let started = wait_until(Duration::from_secs(60), || {
        c.history_text().contains("\"step\"")
    });
    for t in &s.events {
        std::thread::sleep(Duration::from_millis(t.delay_ms));
        let over = !started || slots.iter_mut().flatten().all(exited);
        if over {
            if t.event != Event::WaitSealed {
                stats.skipped += 1;
            }
            log.push(format!(
                "  +{:>6} ms  skipped (the run is over): {}",
                t0.elapsed().as_millis(),
                t.event
            ));
            continue;
        }
        log.push(format!(
            "  +{:>6} ms  {}",
            t0.elapsed().as_millis(),
            t.event
        ));
        match t.event {
            Event::KillAgent(i) | Event::Leave(i) => {
                let a = slots[i]
                    .take()
                    .expect("the generator kills live agents only");
                let leave = matches!(t.event, Event::Leave(_));
                signal(
                    a.pid(),
                    if leave {
                        Signal::SIGTERM
                    } else {
                        Signal::SIGKILL
                    },
                );
                gone.push((i, a, leave));
            }
            Event::KillPersisting(i) => {
                let mut a = slots[i]
                    .take()
                    .expect("the generator kills live agents only");
                let pid = a.pid();
                if kill_when(&mut a, || c.persisting(pid)) {
                    stats.killed_persisting += 1;
                } else {
                    log.push(
                        "      (not caught persisting: it exited, or 30 s passed; killed anyway)"
                            .into(),
                    );
                }
                gone.push((i, a, false));
            }
            Event::KillReplicaHolder(i) => {
                let mut a = slots[i]
                    .take()
                    .expect("the generator kills live agents only");
                if kill_when(&mut a, || c.holds_replica(i)) {
                    stats.killed_replica_holder += 1;
                } else {
                    log.push(
                        "      (not caught holding a replica: it exited, or 30 s passed; killed anyway)"
                            .into(),
                    );
                }
                gone.push((i, a, false));
            }
            Event::StopAgent { slot, ms } => {
                let pid = slots[slot].as_ref().unwrap().pid();
                signal(pid, Signal::SIGSTOP);
                std::thread::sleep(Duration::from_millis(ms));
                signal(pid, Signal::SIGCONT);
            }
            Event::KillWorker { pick } => {
                let h = history::parse(&c.history_text()).unwrap_or_default();
                let newest = h.iter().map(|r| r.gen).max().unwrap_or(0);
                let mut pids: Vec<i32> = h
                    .iter()
                    .filter(|r| r.gen == newest && matches!(r.kind, Kind::Start { .. }))
                    .map(|r| r.pid)
                    .filter(|p| alive(*p))
                    .collect();
                pids.sort_unstable();
                if let Some(p) = pids.get(pick % pids.len().max(1)) {
                    signal(*p, Signal::SIGKILL);
                }
            }
            Event::ScaleUp(i) => {
                if slots.len() <= i {
                    slots.resize_with(i + 1, || None);
                }
                slots[i] = Some(c.agent(i));
            }
            Event::RestartServer { down_ms } => {
                c.server.kill();
                std::thread::sleep(Duration::from_millis(down_ms));
                let args: Vec<&str> = c.store_args.iter().map(String::as_str).collect();
                c.server = c.place.restart_server(&c.endpoint, &args, &c.server_log);
            }
            Event::EtcdMember {
                leader,
                kill,
                down_ms,
            } => {
                let i = c
                    .etcd
                    .iter()
                    .position(|m| m.is_leader() == leader)
                    .unwrap_or(0);
                let down = Duration::from_millis(down_ms);
                let m = &mut c.etcd[i];
                if kill {
                    m.restart_after(down);
                } else {
                    m.signal(Signal::SIGSTOP);
                    std::thread::sleep(down);
                    m.signal(Signal::SIGCONT);
                }
            }
            Event::CorruptShard { pick, truncate } => match corrupt(&c.ckpt, pick, truncate) {
                Some((step, generation)) => outcome.corrupted.push(Corruption {
                    step,
                    generation,
                    t: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .expect("after 1970")
                        .as_secs_f64(),
                }),
                None => {
                    stats.skipped += 1;
                    log.push("      (nothing sealed to corrupt)".into());
                    continue;
                }
            },
            Event::CutCable { .. }
            | Event::Partition { .. }
            | Event::CutServer { .. }
            | Event::SlowLink { .. } => c.place.network_fault(&t.event),
            Event::Preempt(slot) => {
                signal(slots[slot].as_ref().unwrap().pid(), Signal::SIGUSR1);
                log.extend(requeue(&c, &mut slots, slot, &dir, &mut outcome));
            }
            Event::WaitSealed => {
                let before = c.sealed();
                wait_until(Duration::from_secs(30), || {
                    c.sealed() > before || slots.iter_mut().flatten().all(exited)
                });
            }
        }
        if t.event != Event::WaitSealed {
            stats.applied += 1;
        }
    }
    let deadline = t0 + bound;
    for (i, a) in slots.into_iter().enumerate() {
        if let Some(a) = a {
            let (code, err) = finish(a, deadline, &dir.join(format!("agent{i}.log")));
            if code == Some(3) && err.contains("already finished") {
                outcome.late += 1;
            } else {
                outcome.finishers.push(code.unwrap_or(-1));
            }
        }
    }
    for (i, a, leave) in gone {
        let (code, _) = finish(
            a,
            deadline.max(Instant::now() + Duration::from_secs(10)),
            &dir.join(format!("agent{i}.gone.log")),
        );
        if leave {
            outcome.leavers.push(code.unwrap_or(-1));
        }
    }
    // The resume points every agent verified and took, from the logs `finish` kept.
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("agent") && name.ends_with(".log") {
            let log = std::fs::read_to_string(e.path()).unwrap_or_default();
            outcome.verified.extend(history::verified(&log));
            stats.resumed_from_memory += log
                .lines()
                .filter(|l| l.contains("from the survivors' copies in memory, every file verified"))
                .count();
        }
    }
    stats.requeued = outcome.preempted.iter().filter(|c| **c == 5).count();
    outcome.bound_ms = bound.as_millis() as u64;
    outcome.elapsed_ms = t0.elapsed().as_millis() as u64;
    stats.elapsed = t0.elapsed();
    wait_until(Duration::from_secs(10), || {
        processes_of_run(&c.run).is_empty()
    });
    outcome.leftover = processes_of_run(&c.run);
    for p in &outcome.leftover {
        signal(*p, Signal::SIGKILL);
    }
    let text = c.history_text();
    let verdict = history::parse(&text).and_then(|h| {
        let ledger = c.ledger()?;
        stats.generations = h
            .iter()
            .filter(|r| matches!(r.kind, Kind::Start { .. }))
            .map(|r| r.gen)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let mut found = check(&h, &ledger, &outcome, DATA);
        if let Worker::Torch(python) = worker {
            if let Some(t) = reference {
                let _ = t.join();
            }
            match torch::check_model(python, &c.out, DATA) {
                Ok(d) => stats.max_delta = Some(d),
                Err(v) => found.push(v),
            }
        }
        Ok(found)
    });
    match verdict {
        Ok(v) if v.is_empty() => {
            if std::env::var_os("DRUN_CHAOS_KEEP").is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            Ok(stats)
        }
        found => {
            let found = match found {
                Ok(v) => v.iter().map(|v| v.to_string()).collect::<String>(),
                Err(e) => format!("the history could not be checked: {e}\n"),
            };
            let mut knobs = String::new();
            if matches!(worker, Worker::Torch(_)) {
                knobs.push_str("DRUN_CHAOS_TORCH=1 ");
            }
            if s.events
                .iter()
                .any(|t| matches!(t.event, Event::Preempt(_)))
            {
                knobs.push_str("DRUN_CHAOS_PREEMPT=1 ");
            }
            if s.bed {
                knobs.push_str("DRUN_CHAOS_BED=1 ");
            }
            if s.replicas() {
                knobs.push_str("DRUN_CHAOS_REPLICA_KILL=1 ");
            } else if s.ckpt_memory() {
                knobs.push_str("DRUN_CHAOS_PERSIST_KILL=1 ");
            }
            let shown = Outcome {
                verified: Vec::new(),
                ..outcome.clone()
            };
            Err(format!(
                "chaos run failed; replay: {knobs}DRUN_CHAOS_SEED={} DRUN_CHAOS_STORE={store} \
                 DRUN_CHAOS_SCHEDULES=1 cargo test --test tests chaos_campaign -- --ignored \
                 --nocapture\n{s}as applied:\n{}\n{found}outcome: {shown:?}\n\
                 ({} resume points verified, from the agents' logs)\n\
                 history, agent and server logs kept in {}",
                s.seed,
                log.join("\n"),
                outcome.verified.len(),
                dir.display()
            ))
        }
    }
}

/// After a preemption warning to agent `warned`: waits for it to exit (60 s) and for the others
/// to follow (10 s more), then starts again, in its slot, every agent that exited 5 — a requeue
/// under the same run id. An agent that exited 0 (the run ended first) counts as a finisher.
/// Lines for the runner's log.
fn requeue(
    c: &Cluster,
    slots: &mut [Option<Agent>],
    warned: usize,
    dir: &Path,
    outcome: &mut Outcome,
) -> Vec<String> {
    let mut log = Vec::new();
    if !wait_until(Duration::from_secs(60), || {
        slots[warned].as_mut().is_none_or(exited)
    }) {
        log.push(format!("      (agent {warned} did not exit within 60 s)"));
    }
    wait_until(Duration::from_secs(10), || {
        slots.iter_mut().flatten().all(exited)
    });
    let n = outcome.preempted.len();
    for (i, slot) in slots.iter_mut().enumerate() {
        if !slot.as_mut().is_some_and(exited) {
            continue;
        }
        let a = slot.take().expect("exited");
        let (code, err) = finish(
            a,
            Instant::now(),
            &dir.join(format!("agent{i}.preempt{n}.log")),
        );
        let code = code.unwrap_or(-1);
        if i == warned && err.contains("SIGUSR1 before workers started; nothing to relay") {
            outcome.dropped_warnings += 1;
        }
        if code == 0 {
            outcome.finishers.push(0);
            continue;
        }
        outcome.preempted.push(code);
        log.push(format!("      agent {i} exited {code}; started again"));
        *slot = Some(c.agent(i));
    }
    log
}

/// Truncates to half, or flips the first byte of, the `pick`-th file of the checkpoint
/// `<ckpt>/latest` points at; its (step, generation), or None when nothing is sealed yet.
fn corrupt(ckpt: &Path, pick: usize, truncate: bool) -> Option<(u64, u64)> {
    let rel = std::fs::read_to_string(ckpt.join("latest")).ok()?;
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join(rel.trim())).ok()?).ok()?;
    let files = m["files"].as_array().filter(|f| !f.is_empty())?;
    let path = PathBuf::from(files[pick % files.len()]["path"].as_str()?);
    let mut bytes = std::fs::read(&path).ok()?;
    if truncate {
        bytes.truncate(bytes.len() / 2);
    } else {
        bytes[0] ^= 0x55;
    }
    std::fs::write(&path, &bytes).ok()?;
    Some((m["step"].as_u64()?, m["generation"].as_u64()?))
}

/// Polls `cond` every 50 ms until it holds (true) or `timeout` passes (false).
fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
