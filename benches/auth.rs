//! Cost of authentication and TLS per RPC: the round trip of a `Status` RPC to an in-process
//! `drun-rendezvous` service (memory store, loopback), open vs token vs TLS vs token + TLS,
//! side by side (median and p99 of `DRUN_BENCH_RPCS` calls, default 2,000, after 200 warm-up
//! calls on one connection). The CA and server certificate are generated here (`rcgen`).
//!
//! Then **formation time** at N = `DRUN_BENCH_NODES` (16): that many agent sessions, each on its
//! own connection (its own TLS handshake), send Hello and Join for a run of exactly N nodes;
//! the time from the first connect until every session has its plan (median of
//! `DRUN_BENCH_FORMS` formations, default 7), open vs token vs TLS vs token + TLS.
//!
//! `cargo bench --bench auth`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drun_proto::v1 as pb;
use drun_proto::v1::rendezvous_client::RendezvousClient;
use drun_proto::v1::StatusRequest;
use drun_rendezvous::auth::{attach, Auth, Secret};
use drun_rendezvous::service::{serve_with_tls, RendezvousService};
use drun_rendezvous::tls::{endpoint, ClientTls, ServerTlsFiles};
use drun_rendezvous::{MemoryStore, Store};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

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

/// One agent's session of run `run` (of exactly `n` nodes) until its plan arrives.
async fn agent(
    addr: String,
    ca: Option<std::path::PathBuf>,
    token: bool,
    run: String,
    node: usize,
    n: u32,
) {
    let client_tls = ca.map(|ca| ClientTls::from_files(&ca, None, None).unwrap());
    let channel = endpoint(&addr, client_tls.as_ref(), None)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RendezvousClient::new(channel);
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
        attach(&mut req, Some(&Secret::new("bench-token-0123456789")));
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

/// Median time for `n` agents, each on its own connection, to form one run's first
/// generation (`forms` runs on one server).
async fn formation(
    n: u32,
    forms: usize,
    token: bool,
    tls: Option<(&std::path::Path, &ServerTlsFiles)>,
    token_file: &std::path::Path,
) -> Duration {
    let (addr, stop) = server(token, tls, token_file).await;
    let mut times = Vec::new();
    for f in 0..forms + 1 {
        let run = format!("form{f}");
        let t = Instant::now();
        let agents: Vec<_> = (0..n as usize)
            .map(|i| {
                tokio::spawn(agent(
                    addr.clone(),
                    tls.map(|(ca, _)| ca.to_path_buf()),
                    token,
                    run.clone(),
                    i,
                    n,
                ))
            })
            .collect();
        for a in agents {
            a.await.unwrap();
        }
        // The first formation warms the server up.
        if f > 0 {
            times.push(t.elapsed());
        }
    }
    let _ = stop.send(());
    times.sort();
    times[times.len() / 2]
}

/// Median and p99 of `n` Status round trips against a server with `token` and `tls`.
async fn measure(
    n: usize,
    token: bool,
    tls: Option<(&std::path::Path, &ServerTlsFiles)>,
    token_file: &std::path::Path,
) -> (Duration, Duration) {
    let (addr, stop) = server(token, tls, token_file).await;
    let client_tls = tls.map(|(ca, _)| ClientTls::from_files(ca, None, None).unwrap());
    let channel = endpoint(&addr, client_tls.as_ref(), None)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RendezvousClient::new(channel);
    let secret = Secret::new("bench-token-0123456789");
    let mut times = Vec::with_capacity(n);
    for i in 0..(n + 200) {
        let mut req = tonic::Request::new(StatusRequest {
            run_id: "bench".into(),
        });
        if token {
            attach(&mut req, Some(&secret));
        }
        let t = Instant::now();
        let r = client.status(req).await;
        let d = t.elapsed();
        assert!(
            !matches!(&r, Err(s) if s.code() == tonic::Code::Unauthenticated),
            "{r:?}"
        );
        if i >= 200 {
            times.push(d);
        }
    }
    let _ = stop.send(());
    times.sort();
    (times[n / 2], times[n * 99 / 100])
}

/// The settings compared: name, token, TLS.
const SETTINGS: [(&str, bool, bool); 4] = [
    ("open", false, false),
    ("token", true, false),
    ("tls", false, true),
    ("token + tls", true, true),
];

/// `key` parsed from the environment, else `default`.
fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n: usize = env_or("DRUN_BENCH_RPCS", 2000);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens");
    std::fs::write(&token_file, "bench-token-0123456789\n").unwrap();
    let (ca, files) = certificates(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!("Status RPC round trip, loopback, {n} calls on one connection");
    println!("{:<14} {:>12} {:>12}", "setting", "median (us)", "p99 (us)");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (name, token, tls) in SETTINGS {
        let tls = tls.then_some((ca.as_path(), &files));
        let (med, p99) = rt.block_on(measure(n, token, tls, &token_file));
        println!("{name:<14} {:>12.1} {:>12.1}", us(med), us(p99));
    }
    let nodes: u32 = env_or("DRUN_BENCH_NODES", 16);
    let forms: usize = env_or("DRUN_BENCH_FORMS", 7);
    println!();
    println!(
        "formation of {nodes} agents (each its own connection): first connect -> every plan, median of {forms}"
    );
    println!("{:<14} {:>12} {:>10}", "setting", "median (ms)", "vs open");
    let mut open = None;
    for (name, token, tls) in SETTINGS {
        let tls = tls.then_some((ca.as_path(), &files));
        let med = rt.block_on(formation(nodes, forms, token, tls, &token_file));
        let base = *open.get_or_insert(med);
        println!(
            "{name:<14} {:>12.1} {:>+9.1}%",
            med.as_secs_f64() * 1e3,
            (med.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0
        );
    }
}
