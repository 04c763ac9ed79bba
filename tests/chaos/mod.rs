//! Chaos testing (issue 18): seeded random fault schedules against real agents, servers, etcd
//! and workers; a history of every step; a checker of the data and ledger invariants.

mod check;
#[cfg(test)]
mod check_tests;
mod history;
mod run;
mod schedule;
mod torch;

use run::Worker;
use schedule::{generate, with_corruption, with_preemption, Event, Schedule, StoreKind, Timed};

/// One CI schedule: `seed` on `store`, 2 to 4 faults and corrupted shards; panics with the
/// checker's report.
fn ci(seed: u64, store: StoreKind) {
    let s = with_corruption(generate(seed, store, 2, 4));
    eprintln!("{s}");
    match run::run(&s, &Worker::Stdlib, &[]) {
        Ok(stats) => eprintln!("passed: {stats:?}"),
        Err(report) => panic!("{report}"),
    }
}

#[test]
fn chaos_ci_seed_1_memory() {
    ci(1, StoreKind::Memory);
}

#[test]
fn chaos_ci_seed_2_memory() {
    ci(2, StoreKind::Memory);
}

#[test]
fn chaos_ci_seed_3_memory() {
    ci(3, StoreKind::Memory);
}

#[test]
fn chaos_ci_seed_1_etcd() {
    ci(1, StoreKind::Etcd);
}

#[test]
fn chaos_ci_seed_2_etcd() {
    ci(2, StoreKind::Etcd);
}

#[test]
fn chaos_ci_seed_3_etcd() {
    ci(3, StoreKind::Etcd);
}

/// The test-only switch `CHAOS_BREAK_OFFSET=1` makes a resumed worker start one world size
/// past drun's cursor; after a sealed checkpoint and a killed worker the checker must say so.
#[test]
fn chaos_checker_catches_a_broken_sampler_offset() {
    let s = Schedule {
        seed: 0,
        store: StoreKind::Memory,
        agents: 2,
        nproc: 1,
        events: vec![
            Timed {
                delay_ms: 0,
                event: Event::WaitSealed,
            },
            Timed {
                delay_ms: 0,
                event: Event::KillWorker { pick: 0 },
            },
        ],
    };
    let report = run::run(&s, &Worker::Stdlib, &[("CHAOS_BREAK_OFFSET", "1")])
        .expect_err("the checker must fail");
    assert!(
        report.contains("invariant (a) violated: kept step"),
        "{report}"
    );
    assert!(
        report.contains("seed 0 on Memory") && report.contains("line "),
        "{report}"
    );
    // The runner keeps a failed run's logs; this failure is the expected one.
    let kept = report.rsplit("logs kept in ").next().unwrap().trim();
    std::fs::remove_dir_all(kept).unwrap();
}

/// The torch worker's interpreter, or None (the test is skipped, with a note; CI requires it).
fn torch_worker() -> Option<Worker> {
    crate::harness::torch_python().map(Worker::Torch)
}

/// A short torch schedule: 2 agents x 1 worker (world size 2); after a sealed checkpoint agent 1
/// leaves and world size 1 resumes it; after the next seal the worker is killed and world size 1
/// resumes again (one worker per agent: each generation pays torch's import on few cores). Passes when the checker holds and the final model is within `torch::TOL` of a
/// fault-free run's at the same global batch.
fn torch_ci_schedule() -> Schedule {
    let at = |event| Timed { delay_ms: 0, event };
    Schedule {
        seed: 0,
        store: StoreKind::Memory,
        agents: 2,
        nproc: 1,
        events: vec![
            at(Event::WaitSealed),
            at(Event::Leave(1)),
            at(Event::WaitSealed),
            at(Event::KillWorker { pick: 1 }),
        ],
    }
}

#[test]
fn chaos_ci_torch_leave_and_kill_memory() {
    let Some(w) = torch_worker() else { return };
    let s = torch_ci_schedule();
    eprintln!("{s}");
    match run::run(&s, &w, &[]) {
        Ok(stats) => {
            eprintln!("passed: {stats:?}");
            assert_eq!(stats.applied, 2, "both faults hit the running job");
            assert!(stats.generations >= 3, "{stats:?}");
            assert!(stats.max_delta.is_some_and(|d| d <= torch::TOL));
        }
        Err(report) => panic!("{report}"),
    }
}

/// The test-only switch `CHAOS_BREAK_MOMENTUM=1` makes a resumed torch worker drop the optimizer
/// state it loaded: the history is still right, so only the model comparison can tell.
#[test]
fn chaos_checker_catches_a_lost_optimizer_state() {
    let Some(w) = torch_worker() else { return };
    let s = Schedule {
        seed: 0,
        store: StoreKind::Memory,
        agents: 1,
        nproc: 1,
        events: vec![
            Timed {
                delay_ms: 0,
                event: Event::WaitSealed,
            },
            Timed {
                delay_ms: 0,
                event: Event::KillWorker { pick: 0 },
            },
        ],
    };
    let report = run::run(&s, &w, &[("CHAOS_BREAK_MOMENTUM", "1")])
        .expect_err("the model comparison must fail");
    eprintln!("{report}");
    assert!(
        report.contains("invariant (m) violated: the final model differs"),
        "{report}"
    );
    assert!(!report.contains("invariant (a)"), "{report}");
    let kept = report.rsplit("logs kept in ").next().unwrap().trim();
    std::fs::remove_dir_all(kept).unwrap();
}

/// A preemption warning (SIGUSR1, `--on-preempt checkpoint`) to one of 2 agents x 2 workers
/// after a seal: the coordinated checkpoint is sealed, both agents exit 5, the runner starts them
/// again under the same run id (a requeue) and they resume from it; then a worker is killed.
#[test]
fn chaos_ci_preemption_and_requeue_memory() {
    let at = |event| Timed { delay_ms: 0, event };
    let s = Schedule {
        seed: 0,
        store: StoreKind::Memory,
        agents: 2,
        nproc: 2,
        events: vec![
            at(Event::WaitSealed),
            at(Event::Preempt(1)),
            at(Event::WaitSealed),
            at(Event::KillWorker { pick: 2 }),
        ],
    };
    eprintln!("{s}");
    match run::run(&s, &Worker::Stdlib, &[]) {
        Ok(stats) => {
            eprintln!("passed: {stats:?}");
            assert_eq!(stats.applied, 2, "both faults hit the running job");
            assert!(stats.generations >= 3, "{stats:?}");
        }
        Err(report) => panic!("{report}"),
    }
}

/// Open drun bug 1, found by the campaign (not fixed here): a worker is SIGKILLed and, a second
/// or two later, the rendezvous server restarts (over etcd). The agent of that worker never logs
/// the worker's death ("was killed by SIGKILL ... restarting the worker group" never comes),
/// reconnects to the new server ("reconnected to the rendezvous") and then does nothing more: it
/// neither rejoins, nor is fenced, nor exits; the others form the next generation without it, or
/// wait for it forever at the exit barrier ("local workers succeeded; waiting for the other
/// nodes"). Seeds (etcd): 1006 (agent 0 hangs), 1022 (the last agent hangs), 2000 (agents 0 and
/// 2 hang), 2002 (agent 1 hangs, agents 2 and 3 wait for it). Timing-dependent: a replay may
/// pass. Ignored until fixed; run with `--ignored`.
///
/// Open drun bug 2: a lone agent SIGSTOPped past its lease TTL is fenced on SIGCONT ("lease ...
/// expired while reconnecting; killing workers and joining again") and forms its next world
/// under the same generation number as the one it was fenced from ("world formed ... gen=4"
/// twice, same master port), so two worlds share a generation and the second's ranks run the
/// same steps again under it (invariant (e)). Seeds: 1044 (memory), 2003 (etcd).
fn regression(seed: u64, store: StoreKind) {
    let s = generate(seed, store, 3, 8);
    if let Err(report) = run::run(&s, &Worker::Stdlib, &[]) {
        panic!("{report}");
    }
}

#[test]
#[ignore = "open drun bug 1: an agent whose worker died just before a server restart hangs"]
fn chaos_regression_seed_1006_etcd() {
    regression(1006, StoreKind::Etcd);
}

#[test]
#[ignore = "open drun bug 1: an agent whose worker died just before a server restart hangs"]
fn chaos_regression_seed_2000_etcd() {
    regression(2000, StoreKind::Etcd);
}

#[test]
#[ignore = "open drun bug 2: a fenced lone agent re-forms under the same generation number"]
fn chaos_regression_seed_1044_memory() {
    regression(1044, StoreKind::Memory);
}

#[test]
#[ignore = "open drun bug 2: a fenced lone agent re-forms under the same generation number"]
fn chaos_regression_seed_2003_etcd() {
    regression(2003, StoreKind::Etcd);
}

/// The long campaign (see README, "Chaos testing"): `DRUN_CHAOS_SCHEDULES` schedules (200) from
/// seed `DRUN_CHAOS_SEED` (1) on `DRUN_CHAOS_STORE` (`memory`, `etcd` or `both`), 3 to 8 faults
/// each; prints every failure's report and the totals, fails if any schedule failed. With
/// `DRUN_CHAOS_DRY` set it only prints the schedules; `DRUN_CHAOS_CORRUPT=0` leaves out the
/// corrupted shards (as the regression seeds were found). `DRUN_CHAOS_TORCH=1` runs the torch
/// worker (gloo, `DRUN_TORCH_PYTHON`) and compares each run's final model with a fault-free run's.
#[test]
#[ignore = "long campaign: cargo test --test tests chaos_campaign -- --ignored --nocapture"]
fn chaos_campaign() {
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let n: u64 = var("DRUN_CHAOS_SCHEDULES", "200")
        .parse()
        .expect("DRUN_CHAOS_SCHEDULES: a count");
    let seed0: u64 = var("DRUN_CHAOS_SEED", "1")
        .parse()
        .expect("DRUN_CHAOS_SEED: a number");
    let stores = match var("DRUN_CHAOS_STORE", "both").as_str() {
        "memory" => vec![StoreKind::Memory],
        "etcd" => vec![StoreKind::Etcd],
        "both" => vec![StoreKind::Memory, StoreKind::Etcd],
        other => panic!("DRUN_CHAOS_STORE={other}: use memory, etcd or both"),
    };
    let worker = if var("DRUN_CHAOS_TORCH", "0") == "1" {
        torch_worker().expect("DRUN_CHAOS_TORCH=1 needs a torch python (DRUN_TORCH_PYTHON)")
    } else {
        Worker::Stdlib
    };
    let t0 = std::time::Instant::now();
    let (mut runs, mut applied, mut skipped, mut failed) = (0, 0, 0, Vec::new());
    for i in 0..n {
        let store = stores[i as usize % stores.len()];
        let s = generate(seed0 + i, store, 3, 8);
        let s = if var("DRUN_CHAOS_PREEMPT", "0") == "1" {
            with_preemption(s)
        } else {
            s
        };
        let s = if var("DRUN_CHAOS_CORRUPT", "1") == "1" {
            with_corruption(s)
        } else {
            s
        };
        if std::env::var_os("DRUN_CHAOS_DRY").is_some() {
            eprint!("{s}");
            continue;
        }
        runs += 1;
        match run::run(&s, &worker, &[]) {
            Ok(st) => {
                applied += st.applied;
                skipped += st.skipped;
                let model = st
                    .max_delta
                    .map(|d| format!(", model max |Δ| {d:e}"))
                    .unwrap_or_default();
                eprintln!(
                    "seed {} {store:?}: ok, {} faults applied ({} skipped), {} generations, \
                     {:?}{model}",
                    s.seed, st.applied, st.skipped, st.generations, st.elapsed
                );
            }
            Err(report) => {
                eprintln!("{report}");
                failed.push((s.seed, store));
            }
        }
    }
    eprintln!(
        "chaos campaign: {runs} schedules, {applied} faults applied ({skipped} skipped: run \
         over), {} failed {failed:?}, {:?}",
        failed.len(),
        t0.elapsed()
    );
    assert!(
        failed.is_empty(),
        "failed schedules (seed, store): {failed:?}"
    );
}
