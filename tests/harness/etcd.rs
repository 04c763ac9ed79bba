//! etcd for tests and benchmarks: a single member or an n-member cluster on free loopback
//! ports, healthy when started, killed on drop. Self-contained (std, nix, tempfile) so the
//! benchmarks include this same file (`benches/common`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A free TCP port on 127.0.0.1 (bound and released; tests tolerate the tiny race).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One etcd member started by the test.
pub struct Etcd {
    child: Child,
    /// `127.0.0.1:PORT` for clients.
    pub endpoint: String,
    /// `127.0.0.1:PORT` serving `/health` and `/metrics` over plain HTTP.
    health: String,
    data: tempfile::TempDir,
    args: Vec<String>,
}

/// `GET path` over HTTP/1.0 from `endpoint` (`host:port`); the raw response, or None.
pub fn http_get(endpoint: &str, path: &str) -> Option<String> {
    let mut s =
        TcpStream::connect_timeout(&endpoint.parse().ok()?, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {endpoint}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

impl Etcd {
    /// A single-member etcd on free loopback ports, healthy when this returns.
    pub fn start() -> Etcd {
        Self::cluster(1).pop().unwrap()
    }

    /// An `n`-member cluster, every member healthy when this returns. A member that exits
    /// before it is healthy lost one of its ports to another process between [`free_port`] and
    /// its bind: the cluster starts again on new ports (at most 3 tries).
    pub fn cluster(n: usize) -> Vec<Etcd> {
        for _ in 0..2 {
            let mut members = Self::try_cluster(n);
            if members
                .iter_mut()
                .all(|m| m.healthy_within("etcd to become healthy").is_ok())
            {
                return members;
            }
        }
        let mut members = Self::try_cluster(n);
        for m in &mut members {
            m.wait_healthy("etcd to become healthy");
        }
        members
    }

    fn try_cluster(n: usize) -> Vec<Etcd> {
        let token = format!("drun-test-{}", std::process::id());
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
            .collect();
        let members: Vec<Etcd> = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let data = tempfile::tempdir().unwrap();
                let args: Vec<String> = [
                    "--name".to_string(),
                    format!("e{i}"),
                    "--listen-client-urls".into(),
                    format!("http://127.0.0.1:{client}"),
                    "--advertise-client-urls".into(),
                    format!("http://127.0.0.1:{client}"),
                    "--listen-peer-urls".into(),
                    format!("http://127.0.0.1:{peer}"),
                    "--initial-advertise-peer-urls".into(),
                    format!("http://127.0.0.1:{peer}"),
                    "--initial-cluster".into(),
                    initial.join(","),
                    "--initial-cluster-token".into(),
                    token.clone(),
                    "--initial-cluster-state".into(),
                    "new".into(),
                    "--logger".into(),
                    "zap".into(),
                    "--log-level".into(),
                    "error".into(),
                ]
                .into();
                Etcd {
                    child: spawn_etcd(&args, data.path()),
                    endpoint: format!("127.0.0.1:{client}"),
                    health: format!("127.0.0.1:{client}"),
                    data,
                    args,
                }
            })
            .collect();
        members
    }

    /// A single-member etcd serving clients over TLS only (`https://`, certificate `cert` and
    /// key `key`, PEM), requiring client certificates signed by `ca`; `/health` on a separate
    /// plaintext port. Healthy when this returns.
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path) -> Etcd {
        let (client, peer, metrics) = (free_port(), free_port(), free_port());
        let data = tempfile::tempdir().unwrap();
        let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
        let args: Vec<String> = vec![
            "--name".into(),
            "tls".into(),
            "--listen-client-urls".into(),
            format!("https://127.0.0.1:{client}"),
            "--advertise-client-urls".into(),
            format!("https://127.0.0.1:{client}"),
            "--listen-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls".into(),
            format!("http://127.0.0.1:{peer}"),
            "--initial-cluster".into(),
            format!("tls=http://127.0.0.1:{peer}"),
            "--listen-metrics-urls".into(),
            format!("http://127.0.0.1:{metrics}"),
            "--cert-file".into(),
            path(cert),
            "--key-file".into(),
            path(key),
            "--trusted-ca-file".into(),
            path(ca),
            "--client-cert-auth".into(),
            "--logger".into(),
            "zap".into(),
            "--log-level".into(),
            "error".into(),
        ];
        let mut e = Etcd {
            child: spawn_etcd(&args, data.path()),
            endpoint: format!("127.0.0.1:{client}"),
            health: format!("127.0.0.1:{metrics}"),
            data,
            args,
        };
        e.wait_healthy("TLS etcd to become healthy");
        e
    }

    /// Kills this (single-member) etcd, wipes its data directory and starts it again on the same
    /// ports: a store that lost all its state.
    pub fn restart_wiped(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for e in std::fs::read_dir(self.data.path()).unwrap().flatten() {
            std::fs::remove_dir_all(e.path()).unwrap();
        }
        self.child = spawn_etcd(&self.args, self.data.path());
        self.wait_healthy("etcd to come back");
    }

    /// Kills this member (SIGKILL) and starts it again on the same ports and data directory
    /// after `down`: a member stop/start. Returns once it is healthy again.
    pub fn restart_after(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        self.child = spawn_etcd(&self.args, self.data.path());
        self.wait_healthy("etcd member to come back");
    }

    /// Polls `/health` until it reports healthy; panics with `what` after 30 s or when the
    /// member exits first.
    fn wait_healthy(&mut self, what: &str) {
        if let Err(why) = self.healthy_within(what) {
            panic!("{why}");
        }
    }

    /// Polls `/health` until it reports healthy (at most 30 s); why not, if the member exited
    /// or the time ran out.
    fn healthy_within(&mut self, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !http_get(&self.health, "/health").is_some_and(|b| b.contains("\"health\":\"true\""))
        {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("etcd exited ({status}) while waiting for {what}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Whether this member is the raft leader (from its /metrics).
    pub fn is_leader(&self) -> bool {
        http_get(&self.health, "/metrics")
            .is_some_and(|b| b.lines().any(|l| l.trim() == "etcd_server_is_leader 1"))
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, sig: Signal) {
        kill(self.pid(), sig).unwrap();
    }
}

fn spawn_etcd(args: &[String], data: &std::path::Path) -> Child {
    Command::new("etcd")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd (apt-get install etcd-server)")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
