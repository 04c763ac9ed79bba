//! Cost of authentication and TLS per RPC: the round trip of a `Status` RPC to an in-process
//! `drun-rendezvous` service (memory store, loopback), open vs token vs TLS vs token + TLS,
//! side by side (median and p99 of `DRUN_BENCH_RPCS` calls, default 2,000, after 200 warm-up
//! calls on one connection). The CA and server certificate are generated here (`rcgen`).
//!
//! `cargo bench --bench auth`. Not measured here: formation time at N = 16 with auth + TLS.

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Median and p99 of `n` Status round trips against a server with `token` and `tls`.
async fn measure(
    n: usize,
    token: bool,
    tls: Option<(&std::path::Path, &ServerTlsFiles)>,
    token_file: &std::path::Path,
) -> (Duration, Duration) {
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
    let task = tokio::spawn(serve_with_tls(
        listener,
        RendezvousService::new(store).with_auth(auth),
        server_tls,
        async {
            let _ = stopped.await;
        },
    ));
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
    let _ = task.await;
    times.sort();
    (times[n / 2], times[n * 99 / 100])
}

fn main() {
    let n: usize = std::env::var("DRUN_BENCH_RPCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens");
    std::fs::write(&token_file, "bench-token-0123456789\n").unwrap();
    let (ca, files) = certificates(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!("Status RPC round trip, loopback, {n} calls on one connection");
    println!("{:<14} {:>12} {:>12}", "setting", "median (us)", "p99 (us)");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for (name, token, tls) in [
        ("open", false, false),
        ("token", true, false),
        ("tls", false, true),
        ("token + tls", true, true),
    ] {
        let tls = tls.then_some((ca.as_path(), &files));
        let (med, p99) = rt.block_on(measure(n, token, tls, &token_file));
        println!("{name:<14} {:>12.1} {:>12.1}", us(med), us(p99));
    }
}
