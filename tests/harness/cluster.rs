//! Services for multi-node tests: etcd (single member or a 3-member cluster) and
//! `drun-rendezvous` replicas, all on free loopback ports, killed on drop.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::wait_for;

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
    data: tempfile::TempDir,
    args: Vec<String>,
}

fn http_get(endpoint: &str, path: &str) -> Option<String> {
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

    /// An `n`-member cluster, every member healthy when this returns.
    pub fn cluster(n: usize) -> Vec<Etcd> {
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
                    data,
                    args,
                }
            })
            .collect();
        for m in &members {
            wait_for("etcd to become healthy", Duration::from_secs(30), || {
                http_get(&m.endpoint, "/health").is_some_and(|b| b.contains("\"health\":\"true\""))
            });
        }
        members
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
        wait_for("etcd to come back", Duration::from_secs(30), || {
            http_get(&self.endpoint, "/health").is_some_and(|b| b.contains("\"health\":\"true\""))
        });
    }

    /// Whether this member is the raft leader (from its /metrics).
    pub fn is_leader(&self) -> bool {
        http_get(&self.endpoint, "/metrics")
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

/// A `drun-rendezvous serve` replica.
pub struct RdzvServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub endpoint: String,
}

pub fn rendezvous_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_drun-rendezvous"))
}

impl RdzvServer {
    /// Starts a replica on a free port; `store_args` e.g. `["--store", "memory"]`.
    pub fn start(store_args: &[&str]) -> RdzvServer {
        Self::start_on("127.0.0.1:0", store_args)
    }

    /// Starts a replica listening on `listen`.
    pub fn start_on(listen: &str, store_args: &[&str]) -> RdzvServer {
        let mut child = Command::new(rendezvous_bin())
            .args(["serve", "--listen", listen])
            .args(store_args)
            .env("DRUN_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start drun-rendezvous");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = line
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("drun-rendezvous did not start: {line:?}"))
            .to_string();
        RdzvServer { child, endpoint }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RdzvServer {
    fn drop(&mut self) {
        self.kill();
    }
}
