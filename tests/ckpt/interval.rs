//! `--ckpt-interval auto` end to end: real agents, stdlib workers whose checkpoint takes 0.5 s,
//! and a test-side fault loop SIGKILLing a worker every `PERIOD` seconds. The interval must
//! converge near Young's optimum √(2·C·M) for C = 0.5 s and M = `PERIOD`, and every rank must
//! save at the same step each time.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::{dirs, events, rdzv, Store};
use crate::harness::{drun, wait_for, worker, Agent, DrunCmd};

/// Seconds between the fault loop's kills: the job's true mean time between failures.
const PERIOD: f64 = 8.0;
/// Seconds one checkpoint takes in the worker (the save cost C, before drun's own overhead).
const SAVE: f64 = 0.5;
/// Kills; the interval is judged after the last.
const KILLS: u32 = 5;
/// Allowed distance of the converged interval from √(2·SAVE·PERIOD), as a fraction. The
/// measured C also holds the commit and seal (a few tens of ms), and M = run time / failures
/// also counts the restarts' own time, both of which lengthen it a little.
const TOLERANCE: f64 = 0.4;

/// The last "checkpoint interval" log line's numbers: (interval, C, M, failures).
fn last_interval(log: &str) -> Option<(f64, f64, f64, u32)> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("checkpoint interval ") && l.contains("(C = "))?;
    let num = |after: &str| -> Option<f64> {
        let rest = &line[line.find(after)? + after.len()..];
        rest.split_whitespace().next()?.parse().ok()
    };
    let failures = line
        .split(" from ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Some((
        num("checkpoint interval ")?,
        num("C = ")?,
        num("M = ")?,
        failures,
    ))
}

/// The generation and pid of `rank` in the newest generation after `after`, once it started.
fn started_after(evs: &[Value], after: u64, rank: u64) -> Option<(u64, i32)> {
    evs.iter()
        .filter(|e| e["event"] == "start" && e["rank"] == rank)
        .filter_map(|e| Some((e["gen"].as_u64()?, e["pid"].as_i64()? as i32)))
        .filter(|(g, _)| *g > after)
        .max()
}

fn converges(store: Store) {
    let run = format!("ckpt-interval-{store:?}").to_lowercase();
    let r = rdzv(store, &run, "1");
    let d = dirs();
    let mut c: Command = drun();
    c.args(&r.args)
        .nproc(2)
        .node(0)
        .quick_shutdown()
        .args(["--max-restarts", "100", "--ckpt-interval", "auto"])
        // A prior far from the truth: the interval must move to the measured M.
        .args(["--expected-mtbf", "300", "--ckpt-dir"])
        .arg(&d.ckpt)
        .arg(worker("interval_worker.py"))
        .env("CKPT_OUT", &d.out)
        .env("SAVE_SECONDS", SAVE.to_string());
    if matches!(store, Store::Memory) {
        c.args(["--rdzv-id", &run]);
    }
    let agent = Agent::start(c);

    // The fault loop: rank 1 of the running generation is SIGKILLed every PERIOD seconds.
    let (mut t0, mut killed, mut gens) = (None, 0, Vec::new());
    for k in 1..=KILLS {
        let mut found = None;
        wait_for(
            &format!("rank 1 of a generation after {killed}"),
            Duration::from_secs(30),
            || {
                found = started_after(&events(&d), killed, 1);
                found.is_some()
            },
        );
        let (g, pid) = found.unwrap();
        let start = *t0.get_or_insert_with(Instant::now);
        let at = start + Duration::from_secs_f64(PERIOD * f64::from(k));
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        (killed, _) = (g, gens.push(g));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while last_interval(&agent.stderr_so_far()).is_none_or(|i| i.3 != KILLS) {
        assert!(
            Instant::now() < deadline,
            "no interval re-evaluated after the last failure in 30 s:\n{}",
            agent.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = (!r.status.is_empty()).then(|| {
        let o = Command::new(crate::harness::cluster::rendezvous_bin())
            .args(["status", &run, "--json"])
            .args(&r.status)
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&o.stdout).expect("status JSON")
    });
    agent.signal(Signal::SIGTERM);
    let (_, _, log) = agent.wait(Duration::from_secs(30));

    let (interval, cost, mtbf, failures) = last_interval(&log).expect("an interval line");
    let expected = (2.0 * SAVE * PERIOD).sqrt();
    eprintln!("{store:?}: converged to {interval} s (C = {cost} s, M = {mtbf} s); √(2·{SAVE}·{PERIOD}) = {expected:.2} s");
    for l in log
        .lines()
        .filter(|l| l.contains("(C = ") || l.contains("the re-form lost"))
    {
        eprintln!("  {l}");
    }
    assert_eq!(failures, KILLS, "{log}");
    assert!(
        ((SAVE * 0.9)..SAVE * 2.0).contains(&cost),
        "C measured from the ranks' save start to the seal: {cost}\n{log}"
    );
    assert!(
        ((PERIOD * 0.9)..PERIOD * 1.5).contains(&mtbf),
        "M from the failure history: {mtbf}\n{log}"
    );
    assert!(
        ((2.0 * cost * mtbf).sqrt() - interval).abs() < 0.1,
        "the interval is √(2·C·M) of the numbers it reports: {interval}\n{log}"
    );
    assert!(
        (interval - expected).abs() <= TOLERANCE * expected,
        "converged interval {interval} s vs √(2·{SAVE}·{PERIOD}) = {expected:.2} s\n{log}"
    );
    let first = log
        .lines()
        .find(|l| l.contains("checkpoint interval ") && l.contains("(C = "))
        .and_then(last_interval)
        .unwrap();
    assert!(
        first.0 > 2.0 * interval,
        "the prior's interval ({}) moved to the measured one ({interval})",
        first.0
    );
    assert!(
        log.matches("the re-form lost ").count() >= KILLS as usize,
        "the lost work of every re-form is logged:\n{log}"
    );

    // Every rank saved and committed at the same steps each time (a save, or the record of a
    // commit, that the kill cut short aside: a rank killed after its commit was answered but
    // before it wrote the record).
    let evs = events(&d);
    let mut saves: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    let mut commits: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    for e in &evs {
        let key = (e["gen"].as_u64().unwrap(), e["rank"].as_u64().unwrap());
        let step = e["step"].as_u64();
        match (e["event"].as_str(), step) {
            (Some("save"), Some(s)) => saves.entry(key).or_default().push(s),
            (Some("committed"), Some(s)) => commits.entry(key).or_default().push(s),
            _ => {}
        }
    }
    for (i, &g) in gens.iter().enumerate() {
        let c0 = commits.get(&(g, 0)).cloned().unwrap_or_default();
        let c1 = commits.get(&(g, 1)).cloned().unwrap_or_default();
        let n = c0.len().min(c1.len());
        assert_eq!(
            c0[..n],
            c1[..n],
            "generation {g}: commits at the same steps"
        );
        assert!(
            c0.len().abs_diff(c1.len()) <= 1,
            "generation {g}: commits {c0:?} {c1:?}"
        );
        let (s0, s1) = (
            saves.get(&(g, 0)).cloned().unwrap_or_default(),
            saves.get(&(g, 1)).cloned().unwrap_or_default(),
        );
        let n = s0.len().min(s1.len());
        assert_eq!(s0[..n], s1[..n], "generation {g}: saves at the same steps");
        assert!(
            s0.len().abs_diff(s1.len()) <= 1,
            "generation {g}: {s0:?} {s1:?}"
        );
        // Once the first failure moved M to the truth, every generation saves on its own.
        assert!(
            i == 0 || !c0.is_empty(),
            "generation {g} sealed no checkpoint:\n{log}"
        );
    }

    if let Some(st) = status {
        let i = &st["ckpt_interval"];
        assert!(
            (i["interval_s"].as_f64().unwrap() - interval).abs() < 0.05 * interval,
            "status shows the interval in force: {st}"
        );
        assert_eq!(
            st["failures"].as_array().unwrap().len(),
            KILLS as usize,
            "{st}"
        );
        assert!(
            st["checkpoints"]["latest"]["save_ms"].as_u64().is_some(),
            "{st}"
        );
    }
}

#[test]
fn the_interval_converges_to_the_optimum_on_the_memory_store() {
    converges(Store::Memory);
}

#[test]
fn the_interval_converges_to_the_optimum_on_etcd() {
    converges(Store::Etcd);
}

/// `--ckpt-interval auto` with `--ckpt-memory` (etcd, one node of 2 stdlib workers whose save
/// takes 0.1 s, a persister slowed to ~1 s a step): C is the training's stall, not the time to
/// disk; the interval line reports the persistence apart, and `status` shows the node's steps in
/// memory and the interval's two numbers.
#[test]
fn in_memory_the_interval_uses_the_stall_and_status_shows_the_disk() {
    let run = "ckpt-interval-memory";
    let r = rdzv(Store::Etcd, run, "1");
    let d = dirs();
    let stage = d.out.parent().unwrap().join("shm");
    std::fs::create_dir_all(&stage).unwrap();
    let mut c: Command = drun();
    c.args(&r.args)
        .nproc(2)
        .node(0)
        .args(["--shutdown-timeout", "30", "--ckpt-interval", "auto"])
        .args([
            "--expected-mtbf",
            "20",
            "--ckpt-memory",
            "64M",
            "--ckpt-dir",
        ])
        .arg(&d.ckpt)
        .arg(worker("interval_worker.py"))
        .env("CKPT_OUT", &d.out)
        .env("SAVE_SECONDS", "0.1")
        .env("DRUN_CKPT_STAGE_PARENT", &stage)
        // 2 KiB a step at 2000 B/s: about a second to disk.
        .env("DRUN_CKPT_PERSIST_RATE", "2000");
    let agent = Agent::start(c);
    let mut line = String::new();
    wait_for(
        "an interval line with the stall and the persistence",
        Duration::from_secs(90),
        || {
            let log = agent.stderr_so_far();
            line = log
                .lines()
                .rev()
                .find(|l| l.contains("checkpoint interval ") && l.contains("persisted in"))
                .unwrap_or_default()
                .to_string();
            !line.is_empty()
        },
    );
    let (_, cost, _, _) = last_interval(&line).unwrap();
    let persist: f64 = line
        .split("persisted in ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    eprintln!("C = {cost} s (stall), persisted in {persist} s: {line}");
    assert!(
        line.contains("the training's stall"),
        "C is named the stall: {line}"
    );
    assert!(
        (0.1..0.6).contains(&cost),
        "C is the 0.1 s save plus the commit, not the disk: {line}"
    );
    assert!(
        persist >= 0.8,
        "the disk took about a second a step: {line}"
    );
    let status = |json: bool| {
        let mut c = Command::new(crate::harness::cluster::rendezvous_bin());
        c.args(["status", run]).args(&r.status);
        if json {
            c.arg("--json");
        }
        String::from_utf8(c.output().unwrap().stdout).unwrap()
    };
    let mut text = String::new();
    wait_for(
        "status shows the node's steps in memory",
        Duration::from_secs(30),
        || {
            text = status(false);
            text.contains("memory ") && text.contains(" in memory, ")
        },
    );
    assert!(text.contains(" s stall, "), "{text}");
    let memory = text
        .lines()
        .find(|l| l.starts_with("memory"))
        .unwrap()
        .to_string();
    assert!(
        memory.contains("persisted") || memory.contains("staged") || memory.contains("persisting"),
        "{memory}"
    );
    let json: Value = serde_json::from_str(&status(true)).expect("status JSON");
    let steps = json["reports"]["staging"]
        .as_object()
        .and_then(|m| m.values().next())
        .map(|r| r["steps"].clone())
        .unwrap_or_else(|| panic!("{json}"));
    assert!(!steps.as_array().unwrap().is_empty(), "{json}");
    agent.signal(Signal::SIGTERM);
    let (code, _, log) = agent.wait(Duration::from_secs(60));
    assert_eq!(code, 128 + 15, "{log}");
}
