//! Row `arrivals`: newcomers to a running elastic job, at the default settings.
//!
//! Two agents `--nnodes 2:4 --nproc-per-node 1` train (`benches/workers/recovery.py`, a gloo
//! all_reduce every 0.1 s; drun through `drun-rendezvous serve --store memory`, torchrun through
//! its c10d backend hosted by the first agent, `--max-restarts 3`). Once both trained (and 1 s
//! more) a third agent starts, and a fourth [`APART`] later, as pods scheduled one by one do.
//! Measured: the seconds from the third agent's start until all four ranks of a world of 4 did
//! their first all_reduce, and how many times the job re-formed meanwhile (each re-form starts a
//! new rank 0 worker: stop, restart, reload), noted per run.

use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::common::procs::{listening, Procs};
use super::common::{free_port, now_ns, RdzvServer};
use super::records::{group_ready, log_tails, poll, records};
use super::table::{fmt, Row, Unit};
use super::{clear_job_env, launchers, Bench, Launcher};

/// Between the two newcomers.
const APART: Duration = Duration::from_secs(3);

/// One run: (seconds until the world of 4's first all_reduce, re-forms), `None` when the job did
/// not start; infinite seconds when the world of 4 did not come within the bound.
fn run(b: &Bench, l: Launcher, run: usize) -> Option<(f64, usize)> {
    let dir = tempfile::tempdir().unwrap();
    let (recs, logs) = (dir.path().join("rec"), dir.path().join("log"));
    std::fs::create_dir_all(&recs).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/workers/recovery.py");
    let id = format!("arrivals{run}");
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
        c.args(["--nnodes", "2:4", "--nproc-per-node", "1", "--rdzv-id", &id])
            .arg("--local-addr")
            .arg(format!("127.0.0.{}", i + 1))
            .arg(&worker)
            .arg(&recs);
        clear_job_env(&mut c);
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
    let reforms = records(&recs)
        .iter()
        .filter(|r| r.rank == 0 && r.start_ns > t0)
        .count();
    procs.kill_all();
    if four.is_none() {
        log_tails(&logs, 4);
    }
    Some((
        four.map_or(f64::INFINITY, |(_, ready)| ready as f64 / 1e9),
        reforms,
    ))
}

/// The `arrivals` row, both launchers alternating.
pub(super) fn arrivals_row(b: &Bench) -> Row {
    let mut row = Row::new(
        format!(
            "2 newcomers {} s apart join a running `--nnodes 2:4` job, defaults → the world of 4's first all_reduce",
            APART.as_secs()
        ),
        Unit::Seconds,
    );
    let ls = launchers(b);
    let mut reforms: Vec<Vec<usize>> = vec![Vec::new(); 2];
    for n in 0..b.runs {
        for &l in &ls {
            let Some((secs, count)) = run(b, l, n) else {
                row.cell(l).setup_failed += 1;
                continue;
            };
            eprintln!(
                "[arrivals] run {}/{} {}: world of 4 after {}, {count} re-form(s)",
                n + 1,
                b.runs,
                l.name(),
                fmt(secs, Unit::Seconds)
            );
            row.cell(l).values.push(secs);
            reforms[l as usize].push(count);
        }
    }
    for &l in &ls {
        let list: Vec<String> = reforms[l as usize].iter().map(usize::to_string).collect();
        row.cell(l).note = Some(format!("re-forms per run: {}", list.join(", ")));
    }
    row
}
