//! A garbage flood, bounded and on loopback only, against a running 2-node job: 200 TCP
//! connections of random bytes, truncated HTTP/2 prefaces and oversized frames to the
//! `drun-rendezvous` server, garbage, oversized and invalid lines to each agent's worker API
//! socket, and 50 connections of broken TCPStore framing to the agent-hosted c10d store. The
//! server must still answer `status`, every worker API line must get exactly one answer, the
//! store must still answer the workers, and the job must still finish with exit 0.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::cluster::{pinned_node, rendezvous_bin, RdzvServer};
use crate::harness::wait_for;

/// TCP connections opened against the server.
const SERVER_CONNECTIONS: usize = 200;
/// Garbage connections per worker API socket.
const SOCKET_CONNECTIONS: usize = 20;
/// HTTP/2's client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A fixed-seed xorshift generator: the same flood on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// An HTTP/2 frame header: 24-bit length, type, flags, stream id.
fn frame(len: u32, kind: u8, flags: u8, stream: u32) -> Vec<u8> {
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f
}

/// What connection `i` sends to the server.
fn server_garbage(i: usize, rng: &mut Rng) -> Vec<u8> {
    match i % 6 {
        0 => {
            let n = rng.below(4096);
            rng.bytes(n)
        }
        1 => PREFACE[..rng.below(PREFACE.len())].to_vec(),
        2 => [PREFACE, &frame(0xFF_FFFF, 4, 0, 0), &rng.bytes(512)].concat(),
        3 => {
            let mut b = PREFACE.to_vec();
            for _ in 0..8 {
                let len = rng.below(2048);
                let (kind, flags, stream) = (rng.below(10) as u8, rng.next() as u8, rng.next());
                b.extend(frame(len as u32, kind, flags, stream as u32 >> 1));
                b.extend(rng.bytes(len));
            }
            b
        }
        4 => [PREFACE, &frame(64, 1, 4, 1), &rng.bytes(64)].concat(),
        _ => format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
            "a".repeat(65_536)
        )
        .into_bytes(),
    }
}

/// Opens every connection and writes its garbage, 50 open at once; the last 50 stay open
/// (returned) while the test asks the server for its status.
fn flood_server(endpoint: &str, rng: &mut Rng) -> Vec<TcpStream> {
    let addr = endpoint.parse().expect("a loopback address");
    let mut open = Vec::new();
    for i in 0..SERVER_CONNECTIONS {
        if i % 50 == 0 {
            open.clear();
        }
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connection {i}: the server stopped accepting: {e}"));
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        // The server may close first: a refused write is its right.
        let _ = s.write_all(&server_garbage(i, rng));
        open.push(s);
    }
    open
}

/// Garbage connections to the agent-hosted c10d store.
const STORE_CONNECTIONS: usize = 50;

/// What connection `i` sends to the worker store: torch's TCPStore framing gone wrong.
fn store_garbage(i: usize, rng: &mut Rng) -> Vec<u8> {
    let validate = [&[0u8][..], &0x3C85_F7CEu32.to_le_bytes()].concat();
    match i % 6 {
        0 => {
            let n = rng.below(4096);
            rng.bytes(n)
        }
        // An unknown command after the handshake.
        1 => [&validate[..], &[0xEE]].concat(),
        // A key "of" 2^63 bytes; a check of u64::MAX keys.
        2 => [&validate[..], &[3], &(1u64 << 63).to_le_bytes()].concat(),
        3 => [&validate[..], &[5], &u64::MAX.to_le_bytes()].concat(),
        // A set announcing 8 MiB of value, then only a little of it (left open).
        4 => [
            &validate[..],
            &[1],
            &1u64.to_le_bytes(),
            b"k",
            &(8u64 << 20).to_le_bytes(),
            b"xy",
        ]
        .concat(),
        // No handshake at all: a get.
        _ => [&[3u8][..], &1u64.to_le_bytes(), b"k"].concat(),
    }
}

/// Floods the worker store at `addr`; every connection stays open until the test ends.
fn flood_store(addr: &str, rng: &mut Rng) -> Vec<TcpStream> {
    let addr = addr.parse().expect("MASTER_ADDR:MASTER_PORT");
    (0..STORE_CONNECTIONS)
        .map(|i| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("store connection {i}: {e}"));
            s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = s.write_all(&store_garbage(i, rng));
            s
        })
        .collect()
}

/// Lines whose answers the test reads: each gets exactly one answer, in order.
fn answered_lines(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut oversized = vec![b'{'; 9 << 20];
    oversized.retain(|&b| b != b'\n');
    vec![
        b"not json".to_vec(),
        b"{".to_vec(),
        b"{\"op\":\"launch\"}".to_vec(),
        b"\x00\x01\x02".to_vec(),
        rng.bytes(300).into_iter().filter(|&b| b != b'\n').collect(),
        br#"{"op":"progress","rank":99999,"step":1}"#.to_vec(),
        br#"{"op":"should_save","rank":4000000000}"#.to_vec(),
        oversized,
        br#"{"op":"hello","protocol":2}"#.to_vec(),
    ]
}

/// Floods one worker API socket; the conversation whose answers are read must get one JSON
/// answer with `ok` per line and end with `hello`'s protocol.
fn flood_socket(path: &Path, rng: &mut Rng) -> Vec<UnixStream> {
    let mut held = Vec::new();
    for i in 0..SOCKET_CONNECTIONS {
        let mut s = UnixStream::connect(path).expect("connect to the worker API");
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = rng.below(8192);
        let _ = s.write_all(&rng.bytes(n));
        if i % 5 == 0 {
            held.push(s); // half a line, left open
        }
    }
    // A commit for a rank this node does not have: its answer would wait for ranks that never
    // report; the connection stays open, unread, for the rest of the run.
    let mut stuck = UnixStream::connect(path).unwrap();
    stuck
        .write_all(b"{\"op\":\"commit\",\"rank\":77,\"generation\":1,\"step\":5,\"files\":[]}\n")
        .unwrap();
    held.push(stuck);

    let lines = answered_lines(rng);
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut w = s.try_clone().unwrap();
    let out: Vec<u8> = lines
        .iter()
        .flat_map(|l| [l.as_slice(), b"\n"].concat())
        .collect();
    let writer = std::thread::spawn(move || w.write_all(&out));
    let mut answers = BufReader::new(s).lines();
    let mut last = serde_json::Value::Null;
    for (i, _) in lines.iter().enumerate() {
        let a = answers
            .next()
            .expect("an answer per line")
            .expect("read an answer");
        last = serde_json::from_str(&a).unwrap_or_else(|e| panic!("answer {i} {a:?}: {e}"));
        assert!(last["ok"].is_boolean(), "answer {i}: {last}");
    }
    writer.join().unwrap().expect("write the lines");
    assert_eq!(last["protocol"], 2, "the last line is hello: {last}");
    held
}

#[test]
fn a_garbage_flood_leaves_the_server_and_the_worker_api_serving_the_run() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agents: Vec<_> = (0..2)
        .map(|i| pinned_node(&server, "flood", i, "flood.py", &[d]))
        .collect();
    wait_for("4 workers waiting", Duration::from_secs(90), || {
        (0..4).all(|r| d.join(format!("sock_{r}")).exists())
    });
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let held_tcp = flood_server(&server.endpoint, &mut rng);
    let store = std::fs::read_to_string(d.join("store_0")).unwrap();
    let held_store = flood_store(&store, &mut rng);
    let mut sockets: Vec<String> = (0..4)
        .map(|r| std::fs::read_to_string(d.join(format!("sock_{r}"))).unwrap())
        .collect();
    sockets.dedup();
    assert_eq!(
        sockets.len(),
        2,
        "one worker API socket per agent: {sockets:?}"
    );
    let held: Vec<_> = sockets
        .iter()
        .flat_map(|p| flood_socket(Path::new(p), &mut rng))
        .collect();

    let status = Command::new(rendezvous_bin())
        .args(["status", "flood", "--json", "--endpoint", &server.endpoint])
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "status after the flood: {status:?}"
    );
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let running = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["state"] == "running");
    assert_eq!(running.count(), 2, "both agents still run: {s}");

    std::fs::write(d.join("go"), "").unwrap();
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(120));
        assert_eq!(code, 0, "agent {i} after the flood:\n{err}");
    }
    for r in 0..4 {
        assert!(
            d.join(format!("done_{r}")).exists(),
            "rank {r} did not finish"
        );
    }
    drop((held, held_tcp, held_store));
}
