//! TLS of the rendezvous (issue 15): a CA generated in the test (`rcgen`), a real
//! `drun-rendezvous` serving over TLS, real agents. Agents trusting the CA join; a plaintext
//! agent, or one trusting another CA, is refused with a line that says why; with mTLS an agent
//! without a client certificate is refused and one with it joins.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

use crate::harness::cluster::RdzvServer;
use crate::harness::{node_cmd, run, worker};

/// A CA: its certificate (PEM file) and what signs with it.
pub struct Ca {
    pub pem: PathBuf,
    cert: rcgen::Certificate,
    key: KeyPair,
}

pub fn ca(dir: &Path, name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, format!("drun test {name}"));
    let cert = p.self_signed(&key).unwrap();
    let pem = dir.join(format!("{name}.pem"));
    std::fs::write(&pem, cert.pem()).unwrap();
    Ca { pem, cert, key }
}

/// A certificate for 127.0.0.1 signed by `ca`, for `usage`: (cert file, key file).
pub fn leaf(dir: &Path, name: &str, ca: &Ca, usage: ExtendedKeyUsagePurpose) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// A one-node agent of `run` on `server` with the extra flags `tls`, workers `envdump.py out`.
fn agent(server: &RdzvServer, run: &str, tls: &[&Path], out: &Path) -> Command {
    let rdzv = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
        "--rdzv-conf",
        "join_timeout=6",
    ];
    let mut c = node_cmd(0, run, "1", &rdzv);
    c.args(tls).arg(worker("envdump.py")).arg(out);
    c
}

fn p(s: &str) -> &Path {
    Path::new(s)
}

/// (exit code, stderr) of `cmd`, which must end within a minute.
fn outcome(cmd: Command) -> (i32, String) {
    let (code, _, err) = run(cmd, Duration::from_secs(60));
    (code, err)
}

#[test]
fn agents_trusting_the_ca_join_and_plaintext_or_another_ca_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = ca(d, "ca");
    let other = ca(d, "other-ca");
    let (cert, key) = leaf(d, "server", &good, ExtendedKeyUsagePurpose::ServerAuth);
    let server = RdzvServer::start(&[
        "--store",
        "memory",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);

    let out = d.join("ok");
    let (code, err) = outcome(agent(
        &server,
        "tls-ok",
        &[p("--rdzv-tls-ca"), &good.pem],
        &out,
    ));
    assert_eq!(code, 0, "{err}");
    assert!(out.join("env_1.json").exists(), "{err}");

    let (code, err) = outcome(agent(&server, "tls-plain", &[], &d.join("plain")));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("the server speaks TLS: give the agent --rdzv-tls-ca"),
        "{err}"
    );
    assert!(!d.join("plain").exists());

    let (code, err) = outcome(agent(
        &server,
        "tls-wrong",
        &[p("--rdzv-tls-ca"), &other.pem],
        &d.join("wrong"),
    ));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not signed by --rdzv-tls-ca"), "{err}");
    assert!(!d.join("wrong").exists());
}

#[test]
fn mutual_tls_refuses_an_agent_without_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = ca(d, "ca");
    let (cert, key) = leaf(d, "server", &ca, ExtendedKeyUsagePurpose::ServerAuth);
    let (ccert, ckey) = leaf(d, "client", &ca, ExtendedKeyUsagePurpose::ClientAuth);
    let server = RdzvServer::start(&[
        "--store",
        "memory",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-client-ca",
        ca.pem.to_str().unwrap(),
    ]);

    let (code, err) = outcome(agent(
        &server,
        "mtls-anon",
        &[p("--rdzv-tls-ca"), &ca.pem],
        &d.join("anon"),
    ));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("client certificate"), "{err}");
    assert!(!d.join("anon").exists());

    // `status` without a client certificate, and with one of another CA: one line each, with
    // the reason, never a debug dump of the gRPC status.
    let other = self::ca(d, "other-ca");
    let (ocert, okey) = leaf(d, "stranger", &other, ExtendedKeyUsagePurpose::ClientAuth);
    let status = |extra: &[&Path]| {
        let mut c = Command::new(crate::harness::cluster::rendezvous_bin());
        c.args([
            "status",
            "mtls-ok",
            "--endpoint",
            &server.endpoint,
            "--rdzv-tls-ca",
        ])
        .arg(&ca.pem)
        .args(extra);
        outcome(c)
    };
    for (extra, why) in [
        (&[][..], "client certificate"),
        (
            &[p("--rdzv-tls-cert"), &ocert, p("--rdzv-tls-key"), &okey][..],
            "may not accept the client certificate",
        ),
    ] {
        let (code, err) = status(extra);
        assert_eq!(code, 3, "{err}");
        assert!(err.contains(why), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!err.contains("code:") && !err.contains("source:"), "{err}");
    }

    let out = d.join("ok");
    let flags = [
        p("--rdzv-tls-ca"),
        &ca.pem,
        p("--rdzv-tls-cert"),
        &ccert,
        p("--rdzv-tls-key"),
        &ckey,
    ];
    let (code, err) = outcome(agent(&server, "mtls-ok", &flags, &out));
    assert_eq!(code, 0, "{err}");
    assert!(out.join("env_1.json").exists(), "{err}");
}

/// `--rdzv-backend c10d` over TLS: whichever agent hosts serves with `--rdzv-host-tls-cert`;
/// agents trusting the CA join, one without `--rdzv-tls-ca` is refused at once (a c10d job with
/// TLS needs both flags on every node, exit 2), and a plaintext client of the host is refused.
#[test]
fn a_c10d_host_serves_tls_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = ca(d, "ca");
    let (cert, key) = leaf(d, "host", &ca, ExtendedKeyUsagePurpose::ServerAuth);
    let endpoint = format!("127.0.0.1:{}", crate::harness::cluster::free_port());
    let rdzv = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        &endpoint,
        "--rdzv-conf",
        "join_timeout=20",
    ];
    let out = d.join("out");
    let tls = [
        p("--rdzv-tls-ca"),
        &ca.pem,
        p("--rdzv-host-tls-cert"),
        &cert,
        p("--rdzv-host-tls-key"),
        &key,
    ];
    let node = |i: usize, flags: &[&Path]| {
        let mut c = node_cmd(i, "c10d-tls", "2", &rdzv);
        c.args(flags).arg(worker("envdump.py")).arg(&out);
        c
    };

    // Without the host's identity a c10d agent with a CA cannot host: refused before anything.
    let (code, err) = outcome(node(1, &[p("--rdzv-tls-ca"), &ca.pem]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--rdzv-host-tls-cert is missing"), "{err}");

    let host = crate::harness::Agent::start(node(0, &tls));
    crate::harness::wait_for("the hosted rendezvous", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&endpoint).is_ok()
    });
    // A plaintext client of the TLS host (here: `status`) is refused with the reason.
    let st = Command::new(crate::harness::cluster::rendezvous_bin())
        .args(["status", "c10d-tls", "--endpoint", &endpoint])
        .output()
        .unwrap();
    let st_err = String::from_utf8_lossy(&st.stderr);
    assert_eq!(st.status.code(), Some(3), "{st_err}");
    assert!(st_err.contains("may require TLS"), "{st_err}");

    let (code, err) = outcome(node(1, &tls));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = host.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!((0..4).all(|r| out.join(format!("env_{r}.json")).exists()));
}

/// A key of another certificate, or a key file where the certificate goes, is refused at start
/// with one line naming the file's flag (exit 2): the server never says it is listening, the
/// agent starts no worker.
#[test]
fn unusable_tls_files_are_refused_at_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = ca(d, "ca");
    let (cert, _) = leaf(d, "server", &good, ExtendedKeyUsagePurpose::ServerAuth);
    let (_, other_key) = leaf(d, "other", &good, ExtendedKeyUsagePurpose::ServerAuth);
    let serve = |cert: &Path, key: &Path| {
        let mut c = Command::new(crate::harness::cluster::rendezvous_bin());
        c.args(["serve", "--store", "memory", "--listen", "127.0.0.1:0"])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key);
        run(c, Duration::from_secs(30))
    };
    let (code, out, err) = serve(&cert, &other_key);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("does not belong to the certificate") && err.contains("(--tls-key)"),
        "{err}"
    );
    assert!(
        !out.contains("listening") && !err.contains("listening"),
        "{out}{err}"
    );
    let (code, _, err) = serve(&other_key, &other_key);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("(--tls-cert) holds no PEM certificate"),
        "{err}"
    );

    // The agent: the server is never reached, so any endpoint does.
    let server = RdzvServer::start(&["--store", "memory"]);
    let (client, _) = leaf(d, "client", &good, ExtendedKeyUsagePurpose::ClientAuth);
    let out = d.join("mismatch");
    let (code, err) = outcome(agent(
        &server,
        "tls-mismatch",
        &[
            p("--rdzv-tls-ca"),
            &good.pem,
            p("--rdzv-tls-cert"),
            &client,
            p("--rdzv-tls-key"),
            &other_key,
        ],
        &out,
    ));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("does not belong") && err.contains("(--rdzv-tls-key)"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!out.exists());
}
