//! The recovery benchmark's launch rows: launch overhead, spawning many local workers,
//! rendezvous time for N agents.

use std::process::Command;

use super::common::{
    free_port, now_ns, rendezvous_drun, rendezvous_time, rendezvous_torchrun, time_once, Etcd,
    RdzvServer, LAUNCH_ARGS, STAMP_WORKER,
};
use super::table::{Row, Unit};
use super::{launchers, selected, Bench, Launcher};

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
