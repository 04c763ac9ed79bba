//! What a user reads on the agent's stderr: node names on multi-node lines, rounded durations,
//! one progress line per state change, no warning on an ordinary start, and every byte of the
//! workers' output however slowly the console is read.

use std::time::Duration;

use crate::harness::cluster::free_port;
use crate::harness::{node_cmd, Agent};

/// The c10d backend on a free loopback port, plus `conf` (`--rdzv-conf`) if not empty.
fn c10d(conf: &str) -> Vec<String> {
    let mut v = vec![
        "--rdzv-backend".to_string(),
        "c10d".into(),
        "--rdzv-endpoint".into(),
        format!("127.0.0.1:{}", free_port()),
    ];
    if !conf.is_empty() {
        v.extend(["--rdzv-conf".to_string(), conf.to_string()]);
    }
    v
}

#[test]
fn a_multi_node_start_reads_cleanly() {
    let rdzv = c10d("");
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let mut c = node_cmd(i, "clean", "2", &rdzv);
            c.args(["--no-python", "true"]);
            Agent::start(c)
        })
        .collect();
    for a in agents {
        let (code, out, err) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
        assert!(
            !err.contains("WARN"),
            "no warning on an ordinary start:\n{err}"
        );
        let formed = err
            .lines()
            .find(|l| l.contains("world formed"))
            .unwrap_or_else(|| panic!("world formed line:\n{err}"));
        assert!(
            formed.contains("node="),
            "agent lines name the node: {formed}"
        );
        let rdzv_line = err
            .lines()
            .find(|l| l.contains("join_timeout"))
            .unwrap_or_else(|| panic!("rendezvous line:\n{err}"));
        assert!(
            rdzv_line.contains("join_timeout 600 s")
                && rdzv_line.contains("last_call 0 s")
                && rdzv_line.contains("keep_alive 3.3 s"),
            "durations are rounded: {rdzv_line}"
        );
        for bad in ["ns,", "333333", "Some("] {
            assert!(!err.contains(bad), "{bad:?} in:\n{err}");
        }
    }
}

#[test]
fn the_last_call_countdown_is_one_line() {
    let rdzv = c10d("last_call_timeout=3");
    let mut c = node_cmd(0, "countdown", "1:2", &rdzv);
    c.args(["--no-python", "true"]);
    let (code, out, err) = Agent::start(c).wait(Duration::from_secs(60));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let progress = err
        .lines()
        .filter(|l| l.contains("nodes joined (min 1)"))
        .count();
    assert_eq!(
        progress, 1,
        "one line per state change, not one per second:\n{err}"
    );
}

#[test]
fn a_line_longer_than_one_console_write_stays_one_prefixed_line() {
    let mut c = crate::harness::drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "1",
        "--no-python",
        "python3",
        "-c",
    ])
    .arg("import sys; sys.stdout.write('x' * 2_500_000 + '\\ndone\\n')");
    let (code, out, err) = crate::harness::run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "stderr:\n{err}");
    let xs: Vec<&str> = out.lines().filter(|l| l.contains("xxx")).collect();
    assert_eq!(xs.len(), 1, "one console line, not pieces");
    assert_eq!(xs[0], format!("[rank0]:{}", "x".repeat(2_500_000)));
    assert!(
        out.lines().any(|l| l == "[rank0]:done"),
        "{}",
        &out[out.len().saturating_sub(200)..]
    );
}

/// A console read slowly (`drun ... | tee` on a slow disk, a log shipper): the worker writes a
/// 3 MB line and exits at once, the agent holding the line until its end; the console takes
/// about 4 s to read it, longer than the agent waits for quiet readers. The agent exits only once
/// every byte was written.
#[test]
fn a_slow_console_gets_every_byte_before_the_agent_exits() {
    use std::io::Read;
    use std::process::Stdio;
    let mut c = crate::harness::drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "1",
        "--no-python",
        "python3",
        "-c",
    ])
    .arg("import sys; sys.stdout.write('y' * 3_000_000 + '\\ndone\\n')")
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
        assert!(std::time::Instant::now() < deadline, "no end of output");
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(
        text.len(),
        "[rank0]:".len() * 2 + 3_000_000 + "\ndone\n".len(),
        "every byte reached the console"
    );
    assert!(
        text.ends_with("[rank0]:done\n"),
        "{}",
        &text[text.len() - 100..]
    );
}
