//! What the peer probes cost a node: `cargo bench --bench probes`.
//!
//! For each group size N (`DRUN_BENCH_PROBE_NODES`, default 8,32: 32 is the largest group whose
//! nodes probe every pair; beyond, each probes four ring neighbours), N agents' probers
//! (`drun_launcher::peers::Prober`, exactly as an agent runs it) are started in this one process
//! on 127.0.0.1 and follow one generation of N members. After a 2 s warm-up, for
//! `DRUN_BENCH_SECS` (10) seconds: the process's CPU time (utime + stime, `/proc/self/stat`)
//! divided by N, and the UDP datagrams sent in this network namespace (`/proc/net/snmp`
//! `OutDatagrams`, so other UDP traffic of the machine in that namespace counts too) divided by N,
//! as bytes at 30 B each. At the end every prober must judge its peers all answering (else the
//! bench fails: a starved prober would measure less than the real cost). One Markdown table on
//! stdout.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use drun_launcher::peers::{Prober, Verdict, PROBE_BYTES};
use drun_rendezvous::{assign, Candidate};

fn env_list(key: &str, default: &str) -> Vec<usize> {
    std::env::var(key)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// This process's CPU time (user + system), in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks / hz
}

/// UDP datagrams sent in this network namespace so far.
fn udp_out() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").expect("/proc/net/snmp");
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "OutDatagrams")
        .expect("OutDatagrams");
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

struct Cost {
    cpu_share: f64,
    bytes_per_s: f64,
    datagrams_per_s: f64,
}

async fn measure(n: usize, secs: u64) -> Cost {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let mut probers = Vec::new();
    for i in 0..n {
        probers.push(
            Prober::start(ip, "probe-bench", &format!("node{i:03}"))
                .await
                .expect("bind a probe socket"),
        );
    }
    let cands: Vec<Candidate> = probers
        .iter()
        .enumerate()
        .map(|(i, p)| Candidate {
            node_id: format!("node{i:03}"),
            advertise_addr: "127.0.0.1".into(),
            slots: 1,
            requested_node_rank: None,
            master_port: 1,
            probe_port: p.port(),
        })
        .collect();
    let plan = assign("probe-bench", 1, &cands, 0, 0).expect("a plan");
    for p in &probers {
        p.follow(&plan);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu0, udp0, t0) = (cpu_seconds(), udp_out(), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (cpu1, udp1, wall) = (cpu_seconds(), udp_out(), t0.elapsed().as_secs_f64());
    for (i, p) in probers.iter().enumerate() {
        let v = p.health().verdict(tokio::time::Instant::now());
        assert_eq!(v, Verdict::AllAnswer, "prober {i} of {n}: {v:?}");
    }
    let per = |x: f64| x / n as f64 / wall;
    let datagrams = (udp1 - udp0) as f64;
    Cost {
        cpu_share: per(cpu1 - cpu0),
        bytes_per_s: per(datagrams * PROBE_BYTES as f64),
        datagrams_per_s: per(datagrams),
    }
}

fn main() {
    let secs = std::env::var("DRUN_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!("| nodes | peers probed per node | datagrams sent per node per s | bytes sent per node per s | CPU per node (% of one core) |");
    println!("|---|---|---|---|---|");
    for n in env_list("DRUN_BENCH_PROBE_NODES", "8,32") {
        let c = rt.block_on(measure(n, secs));
        println!(
            "| {n} | {} | {:.0} | {:.0} | {:.3} % |",
            n - 1,
            c.datagrams_per_s,
            c.bytes_per_s,
            c.cpu_share * 100.0
        );
    }
}
