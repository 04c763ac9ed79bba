//! Control-plane scale: many simulated agents speaking drun.v1 to one real `drun-rendezvous`
//! server on one real etcd.
//!
//! `cargo bench --bench scale` (needs `etcd` on PATH). One process holds every simulated agent:
//! a tokio task per agent with its own session stream (Hello, Join, a keep-alive every
//! `lease_ttl / 3` — the agent's default — and a new Join after each re-form), spread over one
//! HTTP/2 connection per 64 agents. Nothing of drun's own code runs in this process: the server
//! sees exactly what real agents send.
//!
//! For each size N it prints
//! 1. **formation**: from the first Hello to the last agent holding the plan, and the etcd
//!    requests that cost (gRPC messages the etcd server received, from its `/metrics`), per agent,
//!    the CPU the server, etcd and the simulated agents spent on it, how many progress lines
//!    the waiting agents were sent, and its phases (every session open; the first plan, just
//!    after the decider formed the generation; the last plan);
//! 2. **steady state**: server and etcd CPU (cores), server RSS per agent and the keep-alive
//!    latency (agent's KeepAlive → the server's `kept_alive` answer; p50, p99, max) over a
//!    window of keep-alives at the default interval;
//! 3. **re-form after 1 % of the agents crash** (their streams dropped without a Leave): the
//!    detection (from the crash to the first survivor told to re-form: the reconnect grace and
//!    the loss noticed), the re-form (from there to the last survivor holding the new plan), its
//!    etcd requests and CPU, and its phases (the first survivor told, the first plan, the last);
//!
//! and at the end the **series**: formation and re-formation against N, with the time per agent,
//! so a super-linear step shows.
//!
//! `DRUN_SCALE_SIZES` (comma-separated, default `256,1024`) picks the sizes;
//! `DRUN_SCALE_WINDOW` the steady-state window in seconds (default 10);
//! `DRUN_BENCH_SERVER_LOG` the server's log filter (default `warn`);
//! `DRUN_BENCH_RDZV_BIN` another build's `drun-rendezvous` (to compare two builds under the same
//! load).

mod common;
use common::{Etcd, RdzvServer};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use drun_proto::v1 as pb;
use drun_proto::v1::rendezvous_client::RendezvousClient;
use drun_proto::PROTOCOL_VERSION;
use pb::agent_message::Kind as Out;
use pb::server_event::Kind as In;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

/// The agent's default lease TTL; keep-alives go every third of it.
const LEASE_TTL: Duration = Duration::from_secs(10);
/// Agents sharing one HTTP/2 connection.
const PER_CONNECTION: usize = 64;

/// What a simulated agent reports.
#[derive(Debug)]
enum Report {
    /// Its session is open (the server granted its lease).
    Opened { at: Instant },
    /// It holds the plan of this generation.
    Formed { generation: u64, at: Instant },
    /// It was told that its generation re-forms.
    Reform { at: Instant },
    /// The server ended its session with an error.
    Error(String),
    /// The server answered a keep-alive this long after it was sent.
    KeptAlive(Duration),
    /// It was sent a progress line of the round it waits in.
    Progress,
}

fn hello(run: &str, node: &str, n: usize) -> pb::AgentMessage {
    pb::AgentMessage {
        kind: Some(Out::Hello(pb::Hello {
            protocol_version: PROTOCOL_VERSION,
            run_id: run.to_string(),
            node_id: node.to_string(),
            min_nodes: 1,
            max_nodes: n as u32,
            last_call_ms: 30_000,
            join_timeout_ms: 900_000,
            lease_ttl_ms: LEASE_TTL.as_millis() as u64,
            max_restarts: 0,
            resume: None,
            scale_up_save_timeout_ms: 0,
            reform_settle_ms: Some(1_000),
            ckpt_interval: String::new(),
            expected_mtbf_ms: 0,
        })),
    }
}

fn join(node: &str, i: usize, after: u64) -> pb::AgentMessage {
    pb::AgentMessage {
        kind: Some(Out::Join(pb::Join {
            candidate: Some(pb::Candidate {
                node_id: node.to_string(),
                advertise_addr: "127.0.0.1".into(),
                slots: 1,
                requested_node_rank: -1,
                master_port: 20_000 + (i % 40_000) as u32,
                resume_hint_json: String::new(),
                ..Default::default()
            }),
            after_generation: after,
        })),
    }
}

/// One simulated agent: joins, keeps alive, rejoins after every re-form, until `crash` turns
/// true (its stream is dropped without a Leave, as when the process dies).
async fn agent(
    ch: Channel,
    run: String,
    i: usize,
    n: usize,
    reports: mpsc::UnboundedSender<Report>,
    mut crash: watch::Receiver<bool>,
) {
    let node = format!("sim-{i:05}");
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(hello(&run, &node, n));
    let _ = tx.send(join(&node, i, 0));
    let mut client = RendezvousClient::new(ch);
    let mut inbound = match client.session(UnboundedReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            let _ = reports.send(Report::Error(s.to_string()));
            return;
        }
    };
    let mut tick = tokio::time::interval(LEASE_TTL / 3);
    // Agents start their keep-alives spread over the interval, as real ones do.
    tick.reset_after(LEASE_TTL / 3 * (i % 1000) as u32 / 1000);
    let mut sent = std::collections::VecDeque::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                sent.push_back(Instant::now());
                let _ = tx.send(pb::AgentMessage { kind: Some(Out::KeepAlive(true)) });
            }
            _ = crash.changed() => return,
            msg = inbound.message() => match msg {
                Ok(Some(ev)) => match ev.kind {
                    Some(In::OpenedLease(_)) => {
                        let _ = reports.send(Report::Opened { at: Instant::now() });
                    }
                    Some(In::Formed(p)) => {
                        let _ = reports.send(Report::Formed { generation: p.generation, at: Instant::now() });
                    }
                    Some(In::Reform(r)) => {
                        let _ = reports.send(Report::Reform { at: Instant::now() });
                        let _ = tx.send(join(&node, i, r.generation));
                    }
                    Some(In::Waiting(_)) => {
                        let _ = reports.send(Report::Progress);
                    }
                    Some(In::KeptAlive(_)) => {
                        if let Some(at) = sent.pop_front() {
                            let _ = reports.send(Report::KeptAlive(at.elapsed()));
                        }
                    }
                    Some(In::Error(e)) | Some(In::Fenced(e)) => {
                        let _ = reports.send(Report::Error(e));
                        return;
                    }
                    _ => {}
                },
                Ok(None) => return,
                Err(s) => {
                    let _ = reports.send(Report::Error(s.to_string()));
                    return;
                }
            },
        }
    }
}

/// etcd's storage counters read beside the requests: what the requests did inside etcd
/// (a batched transaction is one request and many puts).
const STORAGE_WORK: [(&str, &str); 5] = [
    ("etcd_mvcc_put_total ", "puts"),
    ("etcd_mvcc_range_total ", "ranges"),
    ("etcd_mvcc_delete_total ", "deletes"),
    ("etcd_debugging_mvcc_events_total ", "watch events"),
    ("etcd_debugging_mvcc_total_put_size_in_bytes ", "bytes put"),
];

/// Sum of the gRPC messages etcd's server received, by method, from its `/metrics`, and its
/// storage counters ([`STORAGE_WORK`], keyed `=name`).
fn etcd_requests(endpoint: &str) -> BTreeMap<String, f64> {
    let body = common::etcd_http_get(endpoint, "/metrics").unwrap_or_default();
    let mut by = BTreeMap::new();
    for l in body.lines() {
        if let Some((_, name)) = STORAGE_WORK.iter().find(|(p, _)| l.starts_with(p)) {
            let v: f64 = l
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            by.insert(format!("={name}"), v);
            continue;
        }
        let Some(rest) = l.strip_prefix("grpc_server_msg_received_total{") else {
            continue;
        };
        let method = rest
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or("?");
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *by.entry(method.to_string()).or_insert(0.0) += v;
    }
    by
}

fn delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The requests of an [`etcd_requests`] map (its storage counters left out), by method.
fn requests(d: &BTreeMap<String, f64>) -> impl Iterator<Item = (&String, &f64)> {
    d.iter().filter(|(k, _)| !k.starts_with('='))
}

fn show(d: &BTreeMap<String, f64>, n: usize) -> String {
    let total: f64 = requests(d).map(|(_, v)| v).sum();
    let parts: Vec<String> = requests(d).map(|(k, v)| format!("{k} {v:.0}")).collect();
    let work: Vec<String> = STORAGE_WORK
        .iter()
        .map(|(_, name)| {
            let v = d.get(&format!("={name}")).copied().unwrap_or(0.0);
            format!("{name} {:.1}", v / n as f64)
        })
        .collect();
    format!(
        "{total:.0} etcd requests = {:.1} per agent ({}); per agent inside etcd: {}",
        total / n as f64,
        parts.join(", "),
        work.join(", ")
    )
}

/// What [`wait_formed`] saw: the instant the last agent held the plan, its generation, and the
/// first instant an agent was told to re-form (if one was).
struct Formed {
    at: Instant,
    generation: u64,
    first_reform: Option<Instant>,
    /// When the last session opened (a first formation's agents; none in a re-form).
    last_opened: Option<Instant>,
    /// When the first agent held the plan: the decider had formed the generation just before.
    first_plan: Instant,
    /// Progress lines the agents were sent meanwhile.
    progress: usize,
}

/// Waits until every agent in `alive` reported a plan of a generation above `after`; returns
/// the instant of the last one and that generation, or why not within `limit`.
async fn wait_formed(
    reports: &mut mpsc::UnboundedReceiver<Report>,
    alive: usize,
    after: u64,
    limit: Duration,
) -> Result<Formed, String> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    let mut last = Instant::now();
    let mut first_reform: Option<Instant> = None;
    let mut last_opened: Option<Instant> = None;
    let mut first_plan: Option<Instant> = None;
    let mut progress = 0;
    loop {
        match tokio::time::timeout_at(deadline, reports.recv()).await {
            Ok(Some(Report::Formed { generation, at })) if generation > after => {
                let c = count.entry(generation).or_default();
                *c += 1;
                last = last.max(at);
                first_plan = Some(first_plan.map_or(at, |f| f.min(at)));
                if *c == alive {
                    return Ok(Formed {
                        at: last,
                        generation,
                        first_reform,
                        last_opened,
                        first_plan: first_plan.unwrap_or(at),
                        progress,
                    });
                }
            }
            Ok(Some(Report::Reform { at })) => {
                first_reform = Some(first_reform.map_or(at, |f| f.min(at)));
            }
            Ok(Some(Report::Progress)) => progress += 1,
            Ok(Some(Report::Opened { at })) => {
                last_opened = Some(last_opened.map_or(at, |l| l.max(at)));
            }
            Ok(Some(Report::Formed { .. } | Report::KeptAlive(_))) => {}
            Ok(Some(Report::Error(e))) => return Err(format!("an agent's session ended: {e}")),
            Ok(None) => return Err("every agent ended".into()),
            Err(_) => {
                return Err(format!(
                    "not formed within {limit:?} (plans seen: {count:?} of {alive} agents)"
                ))
            }
        }
    }
}

/// CPU time spent by the server, etcd and this process (the simulated agents) since a start:
/// what a formation costs whatever the machine's load, which stretches its wall time.
struct Spent {
    pids: (nix::unistd::Pid, nix::unistd::Pid),
    at: (Duration, Duration, Duration),
}

impl Spent {
    fn start(server: nix::unistd::Pid, etcd: nix::unistd::Pid) -> Self {
        let cpu = |p| common::procs::cpu_time(p).unwrap_or_default();
        Self {
            pids: (server, etcd),
            at: (cpu(server), cpu(etcd), common::procs::own_cpu_time()),
        }
    }

    /// The CPU spent since the start, in seconds and per agent.
    fn show(&self, n: usize) -> String {
        let cpu = |p| common::procs::cpu_time(p).unwrap_or_default();
        let (s, e, a) = (
            cpu(self.pids.0).saturating_sub(self.at.0),
            cpu(self.pids.1).saturating_sub(self.at.1),
            common::procs::own_cpu_time().saturating_sub(self.at.2),
        );
        format!(
            "CPU spent: server {:.2} s ({:.0} µs per agent), etcd {:.2} s, simulated agents {:.2} s",
            s.as_secs_f64(),
            s.as_secs_f64() * 1e6 / n as f64,
            e.as_secs_f64(),
            a.as_secs_f64()
        )
    }
}

/// One size's results for the series.
#[derive(Default, Clone, Copy)]
struct Row {
    n: usize,
    formed_s: Option<f64>,
    detected_s: Option<f64>,
    reformed_s: Option<f64>,
    rss_kib_per_agent: f64,
}

async fn one_size(n: usize, window: Duration) -> Row {
    let mut row = Row {
        n,
        ..Row::default()
    };
    let etcd = Etcd::start();
    let server = RdzvServer::start(&["--store", "etcd", "--etcd-endpoints", &etcd.endpoint]);
    let run = format!("scale{n}");
    let url = format!("http://{}", server.1);
    let mut channels = Vec::new();
    for _ in 0..n.div_ceil(PER_CONNECTION) {
        let ch = tonic::transport::Endpoint::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .expect("connect to drun-rendezvous");
        channels.push(ch);
    }
    let (rep_tx, mut reports) = mpsc::unbounded_channel();
    let mut crash = Vec::new();
    let before = etcd_requests(&etcd.endpoint);
    let spid = server.pid();
    let cpu = |p| common::procs::cpu_time(p).unwrap_or_default();
    let spent = Spent::start(spid, etcd.pid());
    let t0 = Instant::now();
    for i in 0..n {
        let (c_tx, c_rx) = watch::channel(false);
        crash.push(c_tx);
        tokio::spawn(agent(
            channels[i / PER_CONNECTION].clone(),
            run.clone(),
            i,
            n,
            rep_tx.clone(),
            c_rx,
        ));
    }
    let limit = Duration::from_secs(60) + Duration::from_millis(30 * n as u64);
    let (at, g, lines, phases) = match wait_formed(&mut reports, n, 0, limit).await {
        Ok(f) => {
            let phases = format!(
                "every session open at {}, the first plan at {:.3} s (the decider had formed the generation), the last at {:.3} s",
                f.last_opened
                    .map_or("-".to_string(), |o| format!("{:.3} s", (o - t0).as_secs_f64())),
                (f.first_plan - t0).as_secs_f64(),
                (f.at - t0).as_secs_f64()
            );
            (f.at, f.generation, f.progress, phases)
        }
        Err(e) => {
            println!("{n:>6} agents: formation FAILED: {e}");
            return row;
        }
    };
    row.formed_s = Some((at - t0).as_secs_f64());
    let formed = etcd_requests(&etcd.endpoint);
    println!(
        "{n:>6} agents: formed generation {g} in {:.3} s; {}",
        (at - t0).as_secs_f64(),
        show(&delta(&formed, &before), n)
    );
    println!(
        "        {}; {lines} progress lines sent to the agents ({:.1} per agent)",
        spent.show(n),
        lines as f64 / n as f64
    );
    println!("        phases: {phases}");

    let (s0, e0) = (cpu(spid), cpu(etcd.pid()));
    let w0 = Instant::now();
    let mut kept = Vec::new();
    let _ = tokio::time::timeout(window, async {
        while let Some(r) = reports.recv().await {
            if let Report::KeptAlive(d) = r {
                kept.push(d);
            }
        }
    })
    .await;
    let secs = w0.elapsed().as_secs_f64();
    kept.sort();
    let pct = |p: f64| {
        kept.get(((kept.len() as f64 * p) as usize).min(kept.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    let (s1, e1) = (cpu(spid), cpu(etcd.pid()));
    let rss = common::procs::rss_kib(spid).unwrap_or(0);
    row.rss_kib_per_agent = rss as f64 / n as f64;
    let steady = etcd_requests(&etcd.endpoint);
    println!(
        "        steady state over {secs:.0} s: {} keep-alives answered, latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        kept.len(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "        server {:.3} cores, etcd {:.3} cores, server RSS {:.1} MiB = {:.1} KiB per agent; {:.0} etcd requests/s ({})",
        (s1 - s0).as_secs_f64() / secs,
        (e1 - e0).as_secs_f64() / secs,
        rss as f64 / 1024.0,
        rss as f64 / n as f64,
        requests(&delta(&steady, &formed))
            .map(|(_, v)| v)
            .sum::<f64>()
            / secs,
        requests(&delta(&steady, &formed))
            .map(|(k, v)| format!("{k} {:.0}/s", v / secs))
            .collect::<Vec<_>>()
            .join(", "),
    );

    let lost = (n / 100).max(1);
    let before = etcd_requests(&etcd.endpoint);
    let spent = Spent::start(spid, etcd.pid());
    let t_crash = Instant::now();
    for c in crash.iter().take(lost) {
        let _ = c.send(true);
    }
    match wait_formed(&mut reports, n - lost, g, Duration::from_secs(120)).await {
        Ok(f) => {
            let detected = f.first_reform.unwrap_or(t_crash);
            row.detected_s = Some((detected - t_crash).as_secs_f64());
            row.reformed_s = Some((f.at - detected).as_secs_f64());
            println!(
                "        {lost} of {n} crashed: generation {} held by all {} survivors {:.3} s later (detected in {:.3} s, re-formed {:.3} s after that); {}",
                f.generation,
                n - lost,
                (f.at - t_crash).as_secs_f64(),
                (detected - t_crash).as_secs_f64(),
                (f.at - detected).as_secs_f64(),
                show(&delta(&etcd_requests(&etcd.endpoint), &before), n)
            );
            println!(
                "        {}; {} progress lines sent to the agents ({:.1} per agent)",
                spent.show(n),
                f.progress,
                f.progress as f64 / n as f64
            );
            println!(
                "        phases: the first survivor told at {:.3} s, the first plan at {:.3} s (the decider had formed the generation), the last at {:.3} s after the crash",
                (detected - t_crash).as_secs_f64(),
                (f.first_plan - t_crash).as_secs_f64(),
                (f.at - t_crash).as_secs_f64()
            );
        }
        Err(e) => println!("        {lost} of {n} crashed: re-form FAILED: {e}"),
    }
    for c in &crash {
        let _ = c.send(true);
    }
    row
}

/// The series: each size's formation and re-formation, and their time per agent.
fn series(rows: &[Row]) {
    let secs = |v: Option<f64>| v.map_or("failed".to_string(), |s| format!("{s:.3} s"));
    let per = |v: Option<f64>, n: usize| {
        v.map_or("-".to_string(), |s| format!("{:.0} µs", s * 1e6 / n as f64))
    };
    println!();
    println!("series (N: formed, per agent | detected | re-formed after detection, per agent | server RSS per agent)");
    for r in rows {
        println!(
            "{:>6}: {:>9} {:>8} | {:>9} | {:>9} {:>8} | {:>7.1} KiB",
            r.n,
            secs(r.formed_s),
            per(r.formed_s, r.n),
            secs(r.detected_s),
            secs(r.reformed_s),
            per(r.reformed_s, r.n),
            r.rss_kib_per_agent
        );
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::var("DRUN_SCALE_SIZES")
        .unwrap_or_else(|_| "256,1024".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let window = Duration::from_secs(
        std::env::var("DRUN_SCALE_WINDOW")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    println!(
        "simulated drun.v1 agents -> one drun-rendezvous server on one etcd (lease TTL {} s, keep-alive every {:.1} s)",
        LEASE_TTL.as_secs(),
        (LEASE_TTL / 3).as_secs_f64()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rows: Vec<Row> = sizes
        .into_iter()
        .map(|n| rt.block_on(one_size(n, window)))
        .collect();
    series(&rows);
}
