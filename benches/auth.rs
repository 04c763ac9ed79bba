//! Cost of authentication and TLS, open vs token vs TLS vs token + TLS, each measured in
//! interleaved rounds (every round measures all four settings in turn, so a machine that gets
//! busier or quieter during the run weighs on all four alike). The CA and server certificate are
//! generated here (`rcgen`, ECDSA P-256).
//!
//! Each round starts one setting later than the last, so no setting always runs first.
//!
//! 1. **Per-RPC latency**: the round trip of a `Status` RPC, as an agent makes it (a 2-worker
//!    runtime, an established connection), to a `drun-rendezvous serve` process (memory store,
//!    loopback) per setting: median and p99 of `DRUN_BENCH_RPCS` calls (default 40,000) in
//!    `DRUN_BENCH_ROUNDS` rounds (default 20), each round with fresh server processes and 200
//!    warm-up calls each; and the CPU time per call, client and server together. Measured twice:
//!    first with the client and the servers on two disjoint halves of the machine's CPUs, as an
//!    agent and its server are on separate hosts in a deployment; then with both sharing every
//!    CPU, where on a small machine each call also pays for the two waking each other on the
//!    same cores.
//! 2. **Formation of N = `DRUN_BENCH_NODES` (16) real agents**, what a user waits for: N `drun`
//!    processes (one `sh` worker each, as `cargo bench --bench rendezvous` runs them) through a
//!    `drun-rendezvous serve` process, from the last agent started to the last worker started;
//!    median of `DRUN_BENCH_FORMS` rounds (default 201: with 21, the median still moved by
//!    ±5 % between runs on a 2-core machine, where all N agents' handshakes share the cores),
//!    with fresh server processes every 10 rounds.
//! 3. **Protocol-only formation** at the same N: N sessions in this process, each on its own
//!    connection (its own TLS handshake), send Hello and Join for a run of exactly N nodes; from
//!    the first connect until every session has its plan. No process starts, so this isolates
//!    the handshakes; median of `DRUN_BENCH_FORMS` rounds.
//!
//! `cargo bench --bench auth`.

mod common;
use common::procs::{cpu_time, own_cpu_time, waited_children_cpu_time};
use common::{cpus, rendezvous_drun, rendezvous_time, RdzvServer};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drun_proto::v1 as pb;
use drun_proto::v1::rendezvous_client::RendezvousClient;
use drun_proto::v1::StatusRequest;
use drun_rendezvous::server::auth::{attach, Auth, Secret};
use drun_rendezvous::server::service::{serve_with_tls, RendezvousService};
use drun_rendezvous::server::tls::{endpoint, ClientTls, ServerTlsFiles};
use drun_rendezvous::{MemoryStore, Store};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use tonic::transport::Channel;

/// CA file, server cert file, server key file in `dir`.
fn certificates(dir: &std::path::Path) -> (std::path::PathBuf, ServerTlsFiles) {
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = p.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let w = |name: &str, text: String| {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        f
    };
    let files = ServerTlsFiles {
        cert: w("server.crt", cert.pem()),
        key: w("server.key", key.serialize_pem()),
        client_ca: None,
    };
    (w("ca.pem", ca.pem()), files)
}

/// A server on a free loopback port with `token` and `tls`: its address and its stop.
async fn server(
    token: bool,
    tls: Option<(&std::path::Path, &ServerTlsFiles)>,
    token_file: &std::path::Path,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let auth = if token {
        Auth::from_files(&[token_file.to_path_buf()]).unwrap()
    } else {
        Auth::open()
    };
    let server_tls = tls.map(|(_, f)| f.load().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_with_tls(
        listener,
        RendezvousService::new(store).with_auth(auth),
        server_tls,
        async {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

/// A client connected to `addr`, over TLS trusting `ca` when given.
async fn client(addr: &str, ca: Option<&Path>) -> RendezvousClient<Channel> {
    let tls = ca.map(|ca| ClientTls::from_files(ca, None, None).unwrap());
    let channel = endpoint(addr, tls.as_ref(), None)
        .unwrap()
        .connect()
        .await
        .unwrap();
    RendezvousClient::new(channel)
}

/// One agent's session of run `run` (of exactly `n` nodes) until its plan arrives.
async fn agent(
    addr: String,
    ca: Option<std::path::PathBuf>,
    token: bool,
    run: String,
    node: usize,
    n: u32,
) {
    let mut client = client(&addr, ca.as_deref()).await;
    let node_id = format!("node{node}");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let hello = pb::Hello {
        protocol_version: drun_proto::PROTOCOL_VERSION,
        run_id: run,
        node_id: node_id.clone(),
        min_nodes: n,
        max_nodes: n,
        join_timeout_ms: 60_000,
        lease_ttl_ms: 10_000,
        ..Default::default()
    };
    let join = pb::Join {
        candidate: Some(pb::Candidate {
            node_id,
            advertise_addr: "127.0.0.1".into(),
            slots: 1,
            requested_node_rank: -1,
            master_port: 29500,
            ..Default::default()
        }),
        after_generation: 0,
    };
    use pb::agent_message::Kind;
    for k in [Kind::Hello(hello), Kind::Join(join)] {
        tx.send(pb::AgentMessage { kind: Some(k) }).unwrap();
    }
    let mut req = tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    if token {
        attach(&mut req, Some(&Secret::new(TOKEN)));
    }
    let mut events = client.session(req).await.unwrap().into_inner();
    while let Some(ev) = events.message().await.unwrap() {
        if matches!(ev.kind, Some(pb::server_event::Kind::Formed(_))) {
            break;
        }
    }
    let _ = tx.send(pb::AgentMessage {
        kind: Some(Kind::Leave(true)),
    });
}

/// Protocol-only formation: per setting, the median time for `n` sessions, each on its own
/// connection, to form one run's first generation; `rounds` rounds, the settings interleaved.
async fn formation(n: u32, rounds: usize, files: &Files) -> Vec<Duration> {
    let mut servers = Vec::new();
    for (_, token, tls) in SETTINGS {
        servers.push(server(token, files.tls(tls), &files.token).await);
    }
    let mut times = vec![Vec::new(); SETTINGS.len()];
    // Round 0 warms every server up and is not counted.
    for round in 0..=rounds {
        for i in order(round) {
            let (_, token, tls) = SETTINGS[i];
            let run = format!("form{round}");
            let t = Instant::now();
            let agents: Vec<_> = (0..n as usize)
                .map(|a| {
                    tokio::spawn(agent(
                        servers[i].0.clone(),
                        files.tls(tls).map(|(ca, _)| ca.to_path_buf()),
                        token,
                        run.clone(),
                        a,
                        n,
                    ))
                })
                .collect();
            for a in agents {
                a.await.unwrap();
            }
            if round > 0 {
                times[i].push(t.elapsed());
            }
        }
    }
    for (_, stop) in servers {
        let _ = stop.send(());
    }
    times.into_iter().map(median).collect()
}

/// Formation with real agents: per setting, the median over `rounds` rounds (settings
/// interleaved) of the seconds from the last of `n` `drun` processes started to the last of
/// their workers started, through a `drun-rendezvous serve` process with that setting.
///
/// Also the CPU time one formation costs, per setting: all agents together (their handshakes
/// share this machine's cores, where a cluster gives each its own node) and the server.
///
/// The servers are started afresh every [`FRESH_SERVERS_EVERY`] rounds, as in [`rpc_latency`]:
/// with one server process per setting for all rounds, where each happened to be scheduled
/// moved that setting's median by several percent from one run of the benchmark to the next.
fn real_formation(n: usize, rounds: usize, files: &Files) -> Vec<(Duration, Duration, Duration)> {
    let mut times = vec![Vec::new(); SETTINGS.len()];
    let mut agents_cpu = vec![Duration::ZERO; SETTINGS.len()];
    let mut server_cpu = vec![Duration::ZERO; SETTINGS.len()];
    let mut servers = Vec::new();
    for round in 0..=rounds {
        if round % FRESH_SERVERS_EVERY == 0 {
            servers.clear(); // the old ones stop before the new ones start
            servers = real_servers(files, None);
        }
        for i in order(round) {
            let (_, token, tls) = SETTINGS[i];
            let (agents0, server0) = (waited_children_cpu_time(), cpu_time(servers[i].pid()));
            let dir = tempfile::tempdir().unwrap();
            let id = format!("real{round}");
            let secs = rendezvous_time(n, dir.path(), |a| {
                let mut c = rendezvous_drun(n, a, &servers[i].1, &id, dir.path());
                if token {
                    c.env("DRUN_RDZV_TOKEN_FILE", &files.token);
                }
                if tls {
                    c.env("DRUN_RDZV_TLS_CA", &files.ca);
                }
                c
            });
            if round > 0 {
                times[i].push(Duration::from_secs_f64(secs));
                agents_cpu[i] += waited_children_cpu_time() - agents0;
                server_cpu[i] +=
                    cpu_time(servers[i].pid()).unwrap_or_default() - server0.unwrap_or_default();
            }
        }
    }
    let per = |d: Duration| d / rounds as u32;
    (0..SETTINGS.len())
        .map(|i| {
            (
                median(std::mem::take(&mut times[i])),
                per(agents_cpu[i]),
                per(server_cpu[i]),
            )
        })
        .collect()
}

/// How many formation rounds one set of server processes serves.
const FRESH_SERVERS_EVERY: usize = 10;

/// One `drun-rendezvous serve` process (memory store) per setting, in [`SETTINGS`]' order,
/// on `cpus` (every allowed CPU when `None`).
fn real_servers(files: &Files, cpus: Option<&[usize]>) -> Vec<RdzvServer> {
    SETTINGS
        .into_iter()
        .map(|(_, token, tls)| {
            let mut args = vec!["--store".to_string(), "memory".into()];
            if token {
                args.extend(["--token-file".into(), files.path(&files.token)]);
            }
            if tls {
                args.extend(["--tls-cert".into(), files.path(&files.tls.cert)]);
                args.extend(["--tls-key".into(), files.path(&files.tls.key)]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cpus::on(cpus, || RdzvServer::start(&args))
        })
        .collect()
}

/// One `Status` round trip on `client`, with the token when `token`.
async fn status_call(client: &mut RendezvousClient<Channel>, token: bool) -> Duration {
    let mut req = tonic::Request::new(StatusRequest {
        run_id: "bench".into(),
    });
    if token {
        attach(&mut req, Some(&Secret::new(TOKEN)));
    }
    let t = Instant::now();
    let r = client.status(req).await;
    let d = t.elapsed();
    assert!(
        !matches!(&r, Err(s) if s.code() == tonic::Code::Unauthenticated),
        "{r:?}"
    );
    d
}

/// Per setting, the median and p99 of `n` `Status` round trips as an agent makes them: over an
/// established connection to a `drun-rendezvous serve` process with that setting, in `rounds`
/// rounds with the settings interleaved. Every round starts a fresh server per setting, so
/// where the scheduler happens to place one server process (on this machine, a server's
/// latency differs by up to 2x between two starts) weighs on every setting alike. Also the CPU
/// time per call, client and server together. The servers run on `server_cpus` (every allowed
/// CPU when `None`).
async fn rpc_latency(
    n: usize,
    rounds: usize,
    files: &Files,
    server_cpus: Option<&[usize]>,
) -> Vec<(Duration, Duration, Duration)> {
    let mut times = vec![Vec::with_capacity(n); SETTINGS.len()];
    let mut cpu = vec![Duration::ZERO; SETTINGS.len()];
    for round in 0..rounds {
        let servers = real_servers(files, server_cpus);
        let mut clients = Vec::new();
        for ((_, token, tls), server) in SETTINGS.into_iter().zip(&servers) {
            let mut client = client(&server.1, files.tls(tls).map(|(ca, _)| ca)).await;
            for _ in 0..200 {
                status_call(&mut client, token).await;
            }
            clients.push((client, token));
        }
        for i in order(round) {
            let (client, token) = &mut clients[i];
            let before = own_cpu_time() + cpu_time(servers[i].pid()).unwrap_or_default();
            for _ in 0..n / rounds {
                times[i].push(status_call(client, *token).await);
            }
            cpu[i] += own_cpu_time() + cpu_time(servers[i].pid()).unwrap_or_default() - before;
        }
    }
    times
        .into_iter()
        .zip(cpu)
        .map(|(mut t, cpu)| {
            t.sort();
            let calls = t.len() as u32;
            (t[t.len() / 2], t[t.len() * 99 / 100], cpu / calls)
        })
        .collect()
}

/// [`rpc_latency`] from a 2-worker runtime, as `drun` runs its agent, whose threads are on
/// `client_cpus`, with the servers on `server_cpus` (every allowed CPU when `None`).
fn rpc_latency_on(
    n: usize,
    rounds: usize,
    files: &Files,
    client_cpus: Option<&[usize]>,
    server_cpus: Option<&[usize]>,
) -> Vec<(Duration, Duration, Duration)> {
    cpus::on(client_cpus, || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(rpc_latency(n, rounds, files, server_cpus))
    })
}

/// The settings' indices in round `round`'s order: each round starts one setting later, so no
/// setting always follows the same one (or always comes first after a pause).
fn order(round: usize) -> impl Iterator<Item = usize> {
    (0..SETTINGS.len()).map(move |k| (round + k) % SETTINGS.len())
}

fn median(mut t: Vec<Duration>) -> Duration {
    t.sort();
    t[t.len() / 2]
}

/// The settings compared: name, token, TLS.
const SETTINGS: [(&str, bool, bool); 4] = [
    ("open", false, false),
    ("token", true, false),
    ("tls", false, true),
    ("token + tls", true, true),
];

/// The token every setting with a token uses.
const TOKEN: &str = "bench-token-0123456789";

/// The files of the run: the token file, the CA and the server's certificate and key.
struct Files {
    token: PathBuf,
    ca: PathBuf,
    tls: ServerTlsFiles,
}

impl Files {
    fn tls(&self, on: bool) -> Option<(&Path, &ServerTlsFiles)> {
        on.then_some((self.ca.as_path(), &self.tls))
    }

    fn path(&self, p: &Path) -> String {
        p.to_str().expect("a UTF-8 temporary path").to_string()
    }
}

/// `key` parsed from the environment, else `default`.
fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Prints one table row per setting: its values and the first one's change against open.
fn table(rows: &[Vec<f64>]) {
    let open = rows[0][0];
    for ((name, _, _), row) in SETTINGS.iter().zip(rows) {
        let cells: String = row.iter().map(|v| format!(" {v:>12.1}")).collect();
        let vs = (row[0] / open - 1.0) * 100.0;
        println!("{name:<14}{cells} {vs:>+9.1}%");
    }
}

fn main() {
    let n: usize = env_or("DRUN_BENCH_RPCS", 40_000);
    let rounds: usize = env_or("DRUN_BENCH_ROUNDS", 20);
    let nodes: u32 = env_or("DRUN_BENCH_NODES", 16);
    let forms: usize = env_or("DRUN_BENCH_FORMS", 201);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("tokens");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let (ca, tls) = certificates(dir.path());
    let files = Files { token, ca, tls };
    // As `drun` runs its agent.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;

    println!(
        "1. Status RPC round trip to a drun-rendezvous serve process, loopback, {n} calls per setting in {rounds} interleaved rounds (fresh servers each round)"
    );
    let split = cpus::split();
    let placements = [
        split.as_ref().map(|(client, server)| {
            (
                format!("client on CPUs {client:?}, servers on CPUs {server:?}: separate cores, as on separate hosts"),
                Some(client.as_slice()),
                Some(server.as_slice()),
            )
        }),
        Some((
            format!("client and servers sharing CPUs {:?}", cpus::allowed()),
            None,
            None,
        )),
    ];
    for (label, client_cpus, server_cpus) in placements.into_iter().flatten() {
        println!("{label}");
        println!(
            "{:<14} {:>12} {:>12} {:>12} {:>10}",
            "setting", "median (us)", "p99 (us)", "CPU (us)", "vs open"
        );
        let rpc = rpc_latency_on(n, rounds, &files, client_cpus, server_cpus);
        table(
            &rpc.iter()
                .map(|(m, p, c)| vec![us(*m), us(*p), us(*c)])
                .collect::<Vec<_>>(),
        );
    }
    println!("(CPU: us per call, this client and the server together)");

    println!();
    println!("2. formation of {nodes} real agents (drun processes, 1 worker each): last agent started -> last worker started, median of {forms} interleaved rounds");
    println!(
        "{:<14} {:>12} {:>12} {:>12} {:>10}",
        "setting", "median (ms)", "agents CPU", "server CPU", "vs open"
    );
    let real = real_formation(nodes as usize, forms, &files);
    table(
        &real
            .iter()
            .map(|(d, a, s)| vec![ms(*d), ms(*a), ms(*s)])
            .collect::<Vec<_>>(),
    );
    println!("(CPU: ms per formation: all {nodes} agents with their workers / the server)");

    println!();
    println!("3. protocol-only formation of {nodes} sessions (each its own connection and handshake), first connect -> every plan, median of {forms} interleaved rounds");
    println!("{:<14} {:>12} {:>10}", "setting", "median (ms)", "vs open");
    let proto = rt.block_on(formation(nodes, forms, &files));
    table(&proto.iter().map(|d| vec![ms(*d)]).collect::<Vec<_>>());
}
