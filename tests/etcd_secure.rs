//! A secured etcd (issue 15): client TLS with client certificates, auth enabled with a `drun`
//! user whose role may read and write `/drun/` only. A real job runs through
//! `drun-rendezvous serve --store etcd` and through `--rdzv-backend etcd`, both with TLS and the
//! password; a wrong password and a missing CA are refused with one line naming the fix and
//! exit 3; the password is in no agent output, worker environment or command line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rcgen::ExtendedKeyUsagePurpose;

use crate::harness::cluster::{rendezvous_bin, Etcd, RdzvServer};
use crate::harness::{node_cmd, run, worker, Agent};
use crate::tls::{ca, leaf};

const PASSWORD: &str = "pw-7f3e9c-drun";

/// The files of the secured etcd and of its clients.
struct Secured {
    etcd: Etcd,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    password_file: PathBuf,
}

impl Secured {
    /// `--etcd-*` flags: TLS with the client certificate, user `drun`, password from `pw`.
    fn flags(&self, pw: &Path) -> Vec<String> {
        let s = |p: &Path| p.to_str().unwrap().to_string();
        vec![
            "--etcd-cacert".into(),
            s(&self.ca),
            "--etcd-cert".into(),
            s(&self.cert),
            "--etcd-key".into(),
            s(&self.key),
            "--etcd-user".into(),
            "drun".into(),
            "--etcd-password-file".into(),
            s(pw),
        ]
    }
}

/// Starts a TLS etcd with client-certificate auth, adds users `root` and `drun` (role: read
/// and write under `/drun/`) and enables auth.
fn secured_etcd(d: &Path) -> Secured {
    let ca = ca(d, "etcd-ca");
    let (scert, skey) = leaf(d, "etcd-server", &ca, ExtendedKeyUsagePurpose::ServerAuth);
    // Not named like an etcd user, so that the certificate alone authenticates no one.
    let (cert, key) = leaf(d, "drun-node", &ca, ExtendedKeyUsagePurpose::ClientAuth);
    let etcd = Etcd::start_tls(&scert, &skey, &ca.pem);
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(
            std::fs::read(&ca.pem).unwrap(),
        ))
        .identity(etcd_client::Identity::from_pem(
            std::fs::read(&cert).unwrap(),
            std::fs::read(&key).unwrap(),
        ));
    let url = format!("https://{}", etcd.endpoint);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let opts = etcd_client::ConnectOptions::new().with_tls(tls);
        let mut c = etcd_client::Client::connect([url.as_str()], Some(opts))
            .await
            .expect("connect to the TLS etcd");
        c.user_add("root", "root-pw", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.role_add("drun").await.unwrap();
        c.role_grant_permission(
            "drun",
            etcd_client::Permission::read_write("/drun/").with_prefix(),
        )
        .await
        .unwrap();
        c.user_add("drun", PASSWORD, None).await.unwrap();
        c.user_grant_role("drun", "drun").await.unwrap();
        // A user with no role: may authenticate, may read nothing.
        c.user_add("norole", PASSWORD, None).await.unwrap();
        c.auth_enable().await.unwrap();
    });
    let password_file = d.join("etcd-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    Secured {
        etcd,
        ca: ca.pem,
        cert,
        key,
        password_file,
    }
}

/// Node `i` of the 2-node run `run` with the rendezvous flags `rdzv` (join timeout 20 s unless
/// they set one), workers `envdump.py out`.
fn node(i: usize, run: &str, rdzv: &[String], out: &Path) -> Command {
    let mut c = node_cmd(i, run, "2", rdzv);
    if !rdzv.iter().any(|a| a == "--rdzv-conf") {
        c.args(["--rdzv-conf", "join_timeout=20"]);
    }
    c.args(["--max-restarts", "0"])
        .arg(worker("envdump.py"))
        .arg(out);
    c
}

/// Runs nodes 0 and 1 of `run` together; both must succeed, and no output, worker
/// environment or agent command line may hold the password.
fn run_job(run: &str, rdzv: &[String], out: &Path) {
    let agents: Vec<Agent> = (0..2)
        .map(|i| Agent::start(node(i, run, rdzv, out)))
        .collect();
    for a in &agents {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", a.pid())).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmdline).contains(PASSWORD));
    }
    for a in agents {
        let (code, so, se) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{run}: stdout {so}\nstderr {se}");
        assert!(!so.contains(PASSWORD) && !se.contains(PASSWORD), "{se}");
    }
    for rank in 0..4 {
        let env = std::fs::read_to_string(out.join(format!("env_{rank}.json")))
            .unwrap_or_else(|e| panic!("{run}: rank {rank} wrote no env: {e}"));
        assert!(
            !env.contains(PASSWORD),
            "the password leaked to rank {rank}"
        );
        assert!(!env.contains("DRUN_ETCD_PASSWORD"), "rank {rank}: {env}");
    }
}

#[test]
fn a_run_on_etcd_with_client_tls_and_a_user_password_works() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = secured_etcd(d);

    // Through a rendezvous server whose store is the secured etcd (password from the file).
    let mut args = vec!["--store", "etcd", "--etcd-endpoints", &s.etcd.endpoint];
    let flags = s.flags(&s.password_file);
    args.extend(flags.iter().map(String::as_str));
    let server = RdzvServer::start(&args);
    let rdzv: Vec<String> = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
    ]
    .map(String::from)
    .to_vec();
    run_job("etcd-tls-server", &rdzv, &d.join("server"));

    // Every agent on the secured etcd directly, the password in DRUN_ETCD_PASSWORD.
    let mut rdzv: Vec<String> = [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        &s.etcd.endpoint,
    ]
    .map(String::from)
    .to_vec();
    let mut flags = s.flags(&s.password_file);
    flags.truncate(flags.len() - 2);
    rdzv.extend(flags);
    let out = d.join("direct");
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = node(i, "etcd-tls-direct", &rdzv, &out);
            c.env("DRUN_ETCD_PASSWORD", PASSWORD);
            Agent::start(c)
        })
        .collect();
    for a in agents {
        let (code, so, se) = a.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "stdout {so}\nstderr {se}");
        assert!(!so.contains(PASSWORD) && !se.contains(PASSWORD), "{se}");
    }
    for rank in 0..4 {
        let env = std::fs::read_to_string(out.join(format!("env_{rank}.json"))).unwrap();
        assert!(
            !env.contains(PASSWORD),
            "the password leaked to rank {rank}"
        );
    }
    // `status` reads the run from the secured etcd with the same flags.
    let mut status = Command::new(rendezvous_bin());
    status
        .args(["status", "etcd-tls-direct", "--json"])
        .args(["--etcd-endpoints", &s.etcd.endpoint])
        .args(s.flags(&s.password_file));
    let (code, so, se) = run(status, Duration::from_secs(30));
    assert_eq!(code, 0, "{se}");
    assert!(
        so.contains("etcd-tls-direct") && !so.contains(PASSWORD),
        "{so}"
    );

    // And one more run with the password file, checked the same way.
    let mut rdzv: Vec<String> = [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        &s.etcd.endpoint,
    ]
    .map(String::from)
    .to_vec();
    rdzv.extend(s.flags(&s.password_file));
    run_job("etcd-tls-direct-file", &rdzv, &d.join("direct-file"));
}

#[test]
fn a_wrong_password_no_user_no_rights_or_a_wrong_or_missing_ca_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = secured_etcd(d);
    let wrong = d.join("wrong-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();

    // The server: exit 3 at once, one line naming the user and where the password comes from.
    let mut serve = Command::new(rendezvous_bin());
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--store", "etcd"])
        .args(["--etcd-endpoints", &s.etcd.endpoint])
        .args(s.flags(&wrong));
    let (code, _, err) = run(serve, Duration::from_secs(30));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("etcd refused the credentials for user drun")
            && err.contains("--etcd-password-file"),
        "{err}"
    );
    assert!(!err.contains("not-the-password"), "{err}");

    // An agent on etcd directly: refused at once (well within its 20 s join timeout).
    let mut rdzv: Vec<String> = [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        &s.etcd.endpoint,
    ]
    .map(String::from)
    .to_vec();
    rdzv.extend(s.flags(&wrong));
    let started = std::time::Instant::now();
    let (code, _, err) = run(
        node(0, "etcd-wrong-pw", &rdzv, &d.join("w")),
        Duration::from_secs(60),
    );
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("etcd refused the credentials for user drun"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(15), "{err}");

    // No CA: a plaintext client of the TLS etcd, told to give --etcd-cacert.
    let rdzv: Vec<String> = [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        &s.etcd.endpoint,
        "--rdzv-conf",
        "join_timeout=3",
        "--etcd-user",
        "drun",
        "--etcd-password-file",
        s.password_file.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let (code, _, err) = run(
        node(0, "etcd-no-ca", &rdzv, &d.join("n")),
        Duration::from_secs(60),
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("--etcd-cacert"), "{err}");
    assert!(!err.contains(PASSWORD), "{err}");

    // No user at all, or a user without rights on /drun/: refused at once, naming the fix.
    let base: Vec<String> = [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        &s.etcd.endpoint,
    ]
    .map(String::from)
    .to_vec();
    let mut no_user = base.clone();
    no_user.extend(s.flags(&s.password_file)[..6].iter().cloned());
    let (code, _, err) = run(
        node(0, "etcd-no-user", &no_user, &d.join("u")),
        Duration::from_secs(60),
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("give --etcd-user NAME"), "{err}");
    let mut norole = base.clone();
    let mut flags = s.flags(&s.password_file);
    flags[7] = "norole".into();
    norole.extend(flags);
    let (code, _, err) = run(
        node(0, "etcd-norole", &norole, &d.join("r")),
        Duration::from_secs(60),
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("readwrite on the prefix /drun/"), "{err}");

    // Another CA: refused at once, naming the wrong CA.
    let other = ca(d, "other-ca");
    let mut rdzv: Vec<String> = [
        "--rdzv-backend",
        "etcd",
        "--rdzv-endpoint",
        &s.etcd.endpoint,
    ]
    .map(String::from)
    .to_vec();
    let mut flags = s.flags(&s.password_file);
    flags[1] = other.pem.to_str().unwrap().to_string();
    rdzv.extend(flags);
    let (code, _, err) = run(
        node(0, "etcd-other-ca", &rdzv, &d.join("o")),
        Duration::from_secs(60),
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not signed by --etcd-cacert"), "{err}");
    assert!(!d.join("n").exists() && !d.join("w").exists() && !d.join("o").exists());
}
