//! The recovery benchmark's launch rows: launch overhead, a torch script's first all_reduce,
//! spawning many local workers, rendezvous time for N agents.

use std::fs::File;
use std::path::Path;
use std::process::Command;

use super::common::procs::Procs;
use super::common::{
    free_port, now_ns, rendezvous_drun, rendezvous_time, rendezvous_torchrun, time_once, Etcd,
    RdzvServer, LAUNCH_ARGS, STAMP_WORKER,
};
use super::records::{group_phases, group_ready, log_tails, poll, records};
use super::table::{fmt, Cell, Row, Unit};
use super::{clear_job_env, launchers, selected, show_phases, Bench, Launcher};

/// Row 4: launch overhead and rendezvous time.
pub(super) fn launch_rows(b: &Bench, rows: &mut Vec<Row>) {
    if selected("launch") {
        let mut row = Row::new(
            "launch, `--standalone`, 2 trivial workers (`--no-python true`)",
            Unit::Seconds,
        );
        for _ in 0..b.runs {
            for l in launchers(b) {
                let mut c = match l {
                    Launcher::Drun => Command::new(env!("CARGO_BIN_EXE_drun")),
                    Launcher::Torchrun => Command::new(b.torchrun.as_ref().unwrap()),
                };
                c.args(LAUNCH_ARGS);
                let took = time_once(l.name(), c).as_secs_f64();
                row.cell(l).values.push(took);
            }
        }
        eprintln!("[launch] done");
        rows.push(row);
    }
    if selected("launch-torch") {
        rows.extend(torch_launch_rows(b));
    }
    if selected("spawn") {
        rows.push(spawn_row(b, 128));
    }
    if !selected("rdzv") {
        return;
    }
    let sizes: Vec<usize> = std::env::var("DRUN_BENCH_RDZV_N")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![2, 4, 8]);
    for n in sizes {
        let mut row = Row::new(
            format!("rendezvous, {n} agents: last agent started → last worker started (drun: server on etcd; torchrun: c10d)"),
            Unit::Seconds,
        );
        let etcd = Etcd::start();
        let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
        for run in 0..b.runs {
            for l in launchers(b) {
                let dir = tempfile::tempdir().unwrap();
                let id = format!("rv{n}-{run}");
                let took = match l {
                    Launcher::Drun => rendezvous_time(n, dir.path(), |i| {
                        rendezvous_drun(n, i, &server.1, &id, dir.path())
                    }),
                    Launcher::Torchrun => {
                        let port = free_port();
                        let t = b.torchrun.as_ref().unwrap();
                        rendezvous_time(n, dir.path(), |_| {
                            rendezvous_torchrun(t, n, port, &id, dir.path())
                        })
                    }
                };
                row.cell(l).values.push(took);
            }
        }
        eprintln!("[rdzv] N={n} done");
        rows.push(row);
    }
}

/// `--standalone --nproc-per-node n`, each worker stamping its start: from the launcher's start
/// to the last worker's first statement.
fn spawn_row(b: &Bench, n: usize) -> Row {
    let mut row = Row::new(
        format!("spawn, `--standalone`, {n} local workers: launcher start → last worker started"),
        Unit::Seconds,
    );
    for _ in 0..b.runs {
        for l in launchers(b) {
            let dir = tempfile::tempdir().unwrap();
            let mut c = match l {
                Launcher::Drun => Command::new(env!("CARGO_BIN_EXE_drun")),
                Launcher::Torchrun => Command::new(b.torchrun.as_ref().unwrap()),
            };
            c.args([
                "--standalone",
                "--nproc-per-node",
                &n.to_string(),
                "--no-python",
            ])
            .args(["sh", "-c", STAMP_WORKER])
            .arg(dir.path());
            let t0 = now_ns();
            time_once(l.name(), c);
            let last = (0..n)
                .filter_map(|r| std::fs::read_to_string(dir.path().join(r.to_string())).ok())
                .filter_map(|t| t.trim().parse::<u128>().ok())
                .max();
            match last {
                Some(t) if t > t0 => row.cell(l).values.push((t - t0) as f64 / 1e9),
                _ => row.cell(l).setup_failed += 1,
            }
        }
    }
    eprintln!("[spawn] done");
    row
}

/// One launch of `benches/workers/recovery.py` under `--standalone --nproc-per-node 2`: the
/// seconds from the launcher's start until both ranks did their first all_reduce, with the
/// phases of [`group_phases`]; `None` when it did not within the bound.
fn torch_launch(b: &Bench, l: Launcher, cold: bool, run: usize) -> Option<(f64, [f64; 4])> {
    let dir = tempfile::tempdir().unwrap();
    let (recs, logs) = (dir.path().join("rec"), dir.path().join("log"));
    std::fs::create_dir_all(&recs).unwrap();
    std::fs::create_dir_all(&logs).unwrap();
    let worker = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/workers/recovery.py");
    let mut c = match l {
        Launcher::Drun => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_drun"));
            c.arg("--python").arg(&b.python);
            c
        }
        Launcher::Torchrun => Command::new(b.torchrun.as_ref().unwrap()),
    };
    c.args(["--standalone", "--nproc-per-node", "2"])
        .arg(&worker)
        .arg(&recs);
    clear_job_env(&mut c);
    if cold {
        c.env("DRUN_WARM_WORKERS", "off");
    }
    let log = File::create(logs.join("agent0.log")).unwrap();
    c.stdout(log.try_clone().unwrap()).stderr(log);
    let mut procs = Procs::new(&format!("{}-launch{run}", l.name()));
    let t0 = now_ns();
    procs.spawn(c, 0).expect("start launcher");
    let ready = poll(b.bound, || group_ready(&records(&recs), t0, 2));
    let phases = group_phases(&records(&recs), t0, 2);
    procs.kill_all();
    if ready.is_none() {
        log_tails(&logs, 1);
    }
    Some((ready?.1 as f64 / 1e9, phases?))
}

/// Rows `launch-torch`: a torch script's start, drun (warm interpreters started before the
/// rendezvous) beside torchrun, and drun with `--warm-workers off`.
fn torch_launch_rows(b: &Bench) -> [Row; 2] {
    let what = "launch, `--standalone --nproc-per-node 2`, a torch script → its first all_reduce";
    let mut warm = Row::new(what, Unit::Seconds);
    let mut cold = Row::new(
        format!("{what}, drun with `--warm-workers off`"),
        Unit::Seconds,
    );
    let mut phases: Vec<Vec<[f64; 4]>> = vec![Vec::new(); 3];
    for run in 0..b.runs {
        let mut one = |row: &mut Row, l: Launcher, is_cold: bool, slot: usize| match torch_launch(
            b, l, is_cold, run,
        ) {
            Some((secs, p)) => {
                eprintln!(
                    "[launch-torch] run {}/{} {}{}: first all_reduce after {} ({})",
                    run + 1,
                    b.runs,
                    l.name(),
                    if is_cold { " cold" } else { "" },
                    fmt(secs, Unit::Seconds),
                    show_phases(&p)
                );
                row.cell(l).values.push(secs);
                phases[slot].push(p);
            }
            None => row.cell(l).values.push(f64::INFINITY),
        };
        for l in launchers(b) {
            one(&mut warm, l, false, l as usize);
        }
        one(&mut cold, Launcher::Drun, true, 2);
    }
    let median = |runs: &[[f64; 4]]| -> Option<String> {
        if runs.is_empty() {
            return None;
        }
        let m = |i: usize| {
            let mut v: Vec<f64> = runs.iter().map(|p| p[i]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Some(format!(
            "medians: {}",
            show_phases(&[m(0), m(1), m(2), m(3)])
        ))
    };
    for l in launchers(b) {
        warm.cell(l).note = median(&phases[l as usize]);
    }
    cold.drun.note = median(&phases[2]);
    cold.torchrun = Cell::absent("— (drun's cold start; see above)");
    eprintln!("[launch-torch] done");
    [warm, cold]
}
