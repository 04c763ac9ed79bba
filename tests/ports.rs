//! MASTER_PORT choice: jobs started at the same moment on one host never share a port.

use std::io::{Read, Write};
use std::time::Duration;

use crate::harness::{drun, read_json, worker, Agent};

#[test]
fn concurrent_jobs_get_distinct_working_master_ports() {
    for round in 0..10 {
        let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
        let agents: Vec<Agent> = dirs
            .iter()
            .map(|d| {
                let mut c = drun();
                // Worker rank 0 binds MASTER_PORT itself here, as it does with
                // --worker-store rank0 (with the default, the agent listens there).
                c.args(["--standalone", "--nproc-per-node", "2"])
                    .args(["--worker-store", "rank0"])
                    .arg(worker("portcheck.py"))
                    .arg(d.path());
                Agent::start(c)
            })
            .collect();
        let mut ports = Vec::new();
        for (a, d) in agents.into_iter().zip(&dirs) {
            let (code, _, err) = a.wait(Duration::from_secs(60));
            assert_eq!(code, 0, "round {round}: {err}");
            let p0 = read_json(&d.path().join("port_0.json"));
            let p1 = read_json(&d.path().join("port_1.json"));
            assert_eq!(
                p1["run_id_seen"], p1["own_run_id"],
                "rank 1 reached its own job's rank 0"
            );
            assert!(p0["bind_error"].is_null(), "{p0}");
            ports.push(p0["port"].clone());
        }
        assert_ne!(ports[0], ports[1], "round {round}");
    }
}

#[test]
fn a_rendezvous_port_held_by_another_program_ends_the_wait_with_the_fix() {
    // An HTTP/1 server holds the c10d port: the agent cannot host there, and what answers is
    // not a rendezvous. Waiting the join timeout (600 s) would change nothing.
    let port = http1_listener();
    let mut c = drun();
    c.args(["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--no-python", "true"]);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(60));
    assert_eq!(code, 3, "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("is not a drun rendezvous server")
            && last.contains("HTTP/1.1 400 Bad Request")
            && last.contains("--rdzv-endpoint HOST:PORT with a free port"),
        "{err}"
    );
}

#[test]
fn doctor_and_status_name_a_program_holding_the_rendezvous_servers_port() {
    let port = http1_listener();
    let ep = format!("127.0.0.1:{port}");
    let flags = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &ep,
        "--rdzv-id",
        "held",
    ];
    let mut c = drun();
    c.arg("doctor")
        .args(["--nnodes", "2"])
        .args(flags)
        .arg("t.py");
    let (code, out, err) = crate::harness::run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "warning: what listens on {ep} is not a drun rendezvous server: it answered the gRPC handshake with \"HTTP/1.1 400 Bad Request\""
        )),
        "{out}"
    );
    let mut c = drun();
    c.arg("--status").args(flags);
    let (code, _, err) = crate::harness::run(c, Duration::from_secs(60));
    assert_eq!(code, 3, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "what listens on {ep} is not a drun rendezvous server"
        )) && err.contains("another program holds the port"),
        "{err}"
    );
}

/// A port on 127.0.0.1 held by an HTTP/1 server that answers anything with a 400.
fn http1_listener() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 64];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    port
}

/// The default backend given etcd's address (the backend flag forgotten): doctor names it, and
/// a drun server at the same kind of address is no trap.
#[test]
fn doctor_names_an_etcd_given_to_the_drun_backend_and_passes_a_drun_server() {
    let etcd = crate::harness::etcd::Etcd::start();
    let server = crate::harness::cluster::RdzvServer::start(&["--store", "memory"]);
    for (ep, warned) in [(&etcd.endpoint, true), (&server.endpoint, false)] {
        let mut c = drun();
        c.arg("doctor")
            .args(["--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-id", "d"])
            .arg("t.py");
        let (code, out, err) = crate::harness::run(c, Duration::from_secs(60));
        assert_eq!(code, 0, "{out}{err}");
        let said = out.contains(&format!(
            "warning: the rendezvous {ep} answered, but not as a drun-rendezvous server"
        )) && out.contains("--rdzv-backend etcd");
        assert_eq!(said, warned, "{ep}:\n{out}");
    }
}
