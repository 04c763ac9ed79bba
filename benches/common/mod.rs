//! Helpers shared by the benchmarks.
#![allow(dead_code)] // each bench uses a different part

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// torchrun from `$DRUN_TORCH_PYTHON`'s directory or `~/.cache/drun/venv/bin/torchrun`.
pub fn torchrun() -> Option<PathBuf> {
    std::env::var_os("DRUN_TORCH_PYTHON")
        .map(|p| PathBuf::from(p).with_file_name("torchrun"))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/drun/venv/bin/torchrun"))
        })
        .filter(|p| p.is_file())
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An etcd process, its data directory (removed on drop) and its client endpoint.
pub struct Etcd(Child, #[allow(dead_code)] tempfile::TempDir, pub String);

impl Etcd {
    /// A single-member etcd on free loopback ports, healthy when this returns.
    pub fn start() -> Etcd {
        let (client, peer) = (free_port(), free_port());
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(dir.path())
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
            ])
            .args([
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args([
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{peer}"),
            ])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd on PATH (apt-get install etcd-server)");
        let endpoint = format!("127.0.0.1:{client}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let healthy = TcpStream::connect(&endpoint).ok().and_then(|mut s| {
                write!(s, "GET /health HTTP/1.0\r\n\r\n").ok()?;
                let mut b = String::new();
                s.read_to_string(&mut b).ok()?;
                Some(b.contains("\"health\":\"true\""))
            });
            if healthy == Some(true) {
                break;
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        Etcd(child, dir, endpoint)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
