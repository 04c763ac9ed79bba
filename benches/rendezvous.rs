//! Rendezvous time: drun vs torchrun's c10d backend side by side, plus simulated scale.
//!
//! `cargo bench --bench rendezvous` (needs `etcd` on PATH; torchrun from `$DRUN_TORCH_PYTHON`'s
//! directory or `~/.cache/drun/venv/bin/torchrun`):
//!
//! 1. For N = 2, 4, 8, 16 real agents on loopback (1 worker each, `--no-python`), the time from
//!    the moment the last agent process is started until the last worker has started — through a
//!    `drun-rendezvous` server on etcd, and through torchrun's c10d backend in the same run.
//! 2. For N = 256 and 1,024 simulated agents (session actors in this process, each with its own
//!    lease, every decision an etcd transaction), the time from the last join to the last
//!    "group formed". `DRUN_BENCH_SIM` overrides the sizes (comma-separated);
//!    `DRUN_BENCH_REAL=0` skips part 1.

mod common;
use common::{free_port, rendezvous_drun, rendezvous_time, rendezvous_torchrun, torchrun};
use common::{Etcd, RdzvServer};

use std::sync::Arc;
use std::time::{Duration, Instant};

use drun_rendezvous::session::{spawn_session, Event, Request, SessionConfig};
use drun_rendezvous::{Candidate, EtcdStore, RoundConfig, Store};

fn real_agents() {
    let torchrun = torchrun();
    println!("rendezvous time, last agent started -> last worker started (1 worker per agent)");
    println!(
        "{:>4}  {:>12}  {:>14}  {:>8}",
        "N", "drun (s)", "torchrun (s)", "ratio"
    );
    for n in [2usize, 4, 8, 16] {
        let etcd = Etcd::start();
        let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
        let dir = tempfile::tempdir().unwrap();
        let id = format!("bench{n}");
        let d = rendezvous_time(n, dir.path(), |i| {
            rendezvous_drun(n, i, &server.1, &id, dir.path())
        });
        drop(server);
        let t = torchrun.as_ref().map(|t| {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            rendezvous_time(n, dir.path(), |_| {
                rendezvous_torchrun(t, n, port, &id, dir.path())
            })
        });
        match t {
            Some(t) => println!("{n:>4}  {d:>12.3}  {t:>14.3}  {:>8.3}", d / t),
            None => println!("{n:>4}  {d:>12.3}  {:>14}  {:>8}", "-", "-"),
        }
    }
    if torchrun.is_none() {
        println!("(torchrun not found: set DRUN_TORCH_PYTHON to compare)");
    }
}

async fn simulated(n: usize) -> (f64, f64) {
    let etcd = Etcd::start();
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(std::slice::from_ref(&etcd.endpoint))
            .await
            .unwrap(),
    );
    let mut links = Vec::with_capacity(n);
    for i in 0..n {
        let cfg = SessionConfig {
            run_id: format!("sim{n}"),
            node_id: format!("node{i:05}"),
            round: RoundConfig {
                min_nodes: n,
                max_nodes: n,
                last_call: Duration::ZERO,
                join_timeout: Duration::from_secs(600),
                settle: Duration::ZERO,
            },
            lease_ttl: Duration::from_secs(60),
            keep_alive_interval: Duration::from_secs(20),
            max_restarts: 0,
            auto_keep_alive: true,
            scale_up_save: None,
            ckpt_interval: Default::default(),
        };
        links.push(spawn_session(store.clone(), cfg, None));
    }
    let started = Instant::now();
    for (i, (tx, _)) in links.iter().enumerate() {
        let cand = Candidate {
            node_id: format!("node{i:05}"),
            advertise_addr: "127.0.0.1".into(),
            slots: 8,
            requested_node_rank: None,
            master_port: 29500,
            probe_port: 0,
        };
        tx.send(Request::Join(cand.into(), 0)).unwrap();
    }
    let last_join = Instant::now();
    for (_, rx) in links.iter_mut() {
        loop {
            match rx.recv().await.expect("session alive") {
                Event::Formed(p) => {
                    assert_eq!(p.world_size as usize, 8 * n);
                    break;
                }
                Event::Error(e) => panic!("rendezvous failed: {e}"),
                _ => {}
            }
        }
    }
    let done = Instant::now();
    (
        (done - last_join).as_secs_f64(),
        (last_join - started).as_secs_f64(),
    )
}

fn main() {
    if let Ok(f) = std::env::var("DRUN_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .with_writer(std::io::stderr)
            .init();
    }
    if std::env::var("DRUN_BENCH_REAL").as_deref() != Ok("0") {
        real_agents();
    }
    let sizes: Vec<usize> = std::env::var("DRUN_BENCH_SIM")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![256, 1024]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("\nsimulated agents (session actors on one etcd), last join -> all formed");
    for n in sizes {
        let (formed, joining) = rt.block_on(simulated(n));
        println!("{n:>5} agents: {formed:.3} s (issuing the {n} joins took {joining:.3} s)");
    }
}
