//! Rows `arrivals` and `arrivals-window`: newcomers to a running elastic job, at the default
//! settings.
//!
//! Two agents `--nnodes 2:4 --nproc-per-node 1` (`arrivals`: the newcomers make the maximum,
//! which forms at once) or `--nnodes 2:5` (`arrivals-window`: the maximum is not reached, so
//! the group forms when the default 30 s last call after the first newcomer ends) train (`benches/workers/recovery.py`, a gloo
//! all_reduce every 0.1 s; drun through `drun-rendezvous serve --store memory`, torchrun through
//! its c10d backend hosted by the first agent, `--max-restarts 3`). Once both trained (and 1 s
//! more) a third agent starts, and a fourth [`APART`] later, as pods scheduled one by one do.
//! Measured: the seconds from the third agent's start until all four ranks of a world of 4 did
//! their first all_reduce, how many times the job re-formed meanwhile (each re-form starts a
//! new rank 0 worker: stop, restart, reload), and the training time lost: the seconds in which
//! no world trained, from each world's last all_reduce to the next world's first (the workers
//! run with `RECOVERY_STEPS=1` and record their last step), noted per run.

use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::common::procs::{listening, Procs};
use super::common::{free_port, now_ns, RdzvServer};
use super::records::{group_ready, log_tails, poll, records, Rec};
use super::table::{fmt, Row, Unit};
use super::{clear_job_env, launchers, Bench, Launcher};

/// Between the two newcomers.
const APART: Duration = Duration::from_secs(3);

/// What one run measured.
struct Arrived {
    /// Seconds until the world of 4's first all_reduce; infinite when it did not come.
    secs: f64,
    reforms: usize,
    /// Seconds no world trained; infinite when the world of 4 did not come.
    lost: f64,
}

/// The seconds after `t0` that no world trained until the world of 4's first all_reduce: the
/// gaps between one rank 0 worker's last step and the next one's first all_reduce.
fn idle(recs: &[Rec], t0: u128) -> Option<f64> {
    let mut zeros: Vec<&Rec> = recs.iter().filter(|r| r.rank == 0).collect();
    zeros.sort_by_key(|r| r.start_ns);
    let mut lost = 0u128;
    for pair in zeros.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        if after.start_ns <= t0 {
            continue;
        }
        let last = before.last_ns.or(before.ready_ns)?;
        lost += after.ready_ns?.saturating_sub(last);
    }
    Some(lost as f64 / 1e9)
}

/// One run with at most `max` nodes, `None` when the job did not start.
fn run(b: &Bench, l: Launcher, max: usize, run: usize) -> Option<Arrived> {
    let dir = tempfile::tempdir().unwrap();
    let (recs, logs) = (dir.path().join("rec"), dir.path().join("log"));
    std::fs::create_dir_all(&recs).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/workers/recovery.py");
    let id = format!("arrivals{max}-{run}");
    let nnodes = format!("2:{max}");
    let server = (l == Launcher::Drun).then(|| RdzvServer::start(&["--store", "memory"]));
    let port = free_port();
    let make = |i: usize| {
        let mut c = match l {
            Launcher::Drun => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_drun"));
                c.args(["--rdzv-endpoint", &server.as_ref().unwrap().1])
                    .arg("--python")
                    .arg(&b.python);
                c
            }
            Launcher::Torchrun => {
                let mut c = Command::new(b.torchrun.as_ref().unwrap());
                c.args(["--rdzv-backend", "c10d"])
                    .args(["--rdzv-endpoint", &format!("127.0.0.1:{port}")])
                    .args(["--max-restarts", "3"]);
                c
            }
        };
        c.args([
            "--nnodes",
            &nnodes,
            "--nproc-per-node",
            "1",
            "--rdzv-id",
            &id,
        ])
        .arg("--local-addr")
        .arg(format!("127.0.0.{}", i + 1))
        .arg(&worker)
        .arg(&recs);
        clear_job_env(&mut c);
        c.env("RECOVERY_STEPS", "1");
        let log = File::create(logs.join(format!("agent{i}.log"))).unwrap();
        c.stdout(log.try_clone().unwrap()).stderr(log);
        c
    };
    let mut procs = Procs::new(&format!("{}-{}", l.name(), id));
    for i in 0..2 {
        procs.spawn(make(i), i).expect("start launcher");
        if l == Launcher::Torchrun && i == 0 {
            poll(Duration::from_secs(60), || listening(port).then_some(()));
        }
    }
    // At the defaults the first group waits out the 30 s last call for more nodes.
    if poll(Duration::from_secs(180), || {
        group_ready(&records(&recs), 0, 2)
    })
    .is_none()
    {
        eprintln!("  {} did not start its first generation:", l.name());
        log_tails(&logs, 2);
        procs.kill_all();
        return None;
    }
    std::thread::sleep(Duration::from_secs(1));
    let t0 = now_ns();
    procs.spawn(make(2), 2).expect("start launcher");
    // The scenario: the fourth node arrives a fixed time after the third.
    std::thread::sleep(APART);
    procs.spawn(make(3), 3).expect("start launcher");
    let four = poll(b.bound, || group_ready(&records(&recs), t0, 4));
    let recs_now = records(&recs);
    let reforms = recs_now
        .iter()
        .filter(|r| r.rank == 0 && r.start_ns > t0)
        .count();
    let lost = four
        .and_then(|_| idle(&recs_now, t0))
        .unwrap_or(f64::INFINITY);
    procs.kill_all();
    if four.is_none() {
        log_tails(&logs, 4);
    }
    Some(Arrived {
        secs: four.map_or(f64::INFINITY, |(_, ready)| ready as f64 / 1e9),
        reforms,
        lost,
    })
}

/// The `arrivals` row (`max` 4) or the `arrivals-window` row (`max` 5), both launchers
/// alternating; a launcher whose first run did not bring the world of 4 is not run again.
pub(super) fn arrivals_row(b: &Bench, max: usize) -> Row {
    let mut row = Row::new(
        format!(
            "2 newcomers {} s apart join a running `--nnodes 2:{max}` job, defaults → the world of 4's first all_reduce",
            APART.as_secs()
        ),
        Unit::Seconds,
    );
    let ls = launchers(b);
    let mut seen: Vec<Vec<(usize, f64)>> = vec![Vec::new(); 2];
    for n in 0..b.runs {
        for &l in &ls {
            if row.cell(l).gave_up() {
                continue;
            }
            let Some(a) = run(b, l, max, n) else {
                row.cell(l).setup_failed += 1;
                continue;
            };
            eprintln!(
                "[arrivals 2:{max}] run {}/{} {}: world of 4 after {}, {} re-form(s), training lost {}",
                n + 1,
                b.runs,
                l.name(),
                fmt(a.secs, Unit::Seconds),
                a.reforms,
                fmt(a.lost, Unit::Seconds)
            );
            row.cell(l).values.push(a.secs);
            seen[l as usize].push((a.reforms, a.lost));
        }
    }
    for &l in &ls {
        let runs = &seen[l as usize];
        if runs.is_empty() {
            continue;
        }
        let list: Vec<String> = runs.iter().map(|(r, _)| r.to_string()).collect();
        let mut lost: Vec<f64> = runs.iter().map(|(_, s)| *s).collect();
        lost.sort_by(f64::total_cmp);
        row.cell(l).note = Some(format!(
            "re-forms per run: {}; training time lost, median: {}",
            list.join(", "),
            if lost[lost.len() / 2].is_finite() {
                fmt(lost[lost.len() / 2], Unit::Seconds)
            } else {
                "all of it from the scale-up on".into()
            }
        ));
    }
    row
}
