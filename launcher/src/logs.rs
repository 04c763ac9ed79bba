//! Worker output: whole lines, prefixed, to the console and/or per-rank files.
//!
//! Each worker stream is read on its own thread (a slow reader never blocks supervision or
//! teardown; the agent waits for readers only up to a deadline). Bytes are split into lines; a
//! line is written to the console in a single locked write of `prefix + line + '\n'`, so lines of
//! different ranks never interleave mid-line. A final partial line is flushed at end of stream
//! with a newline added; a line longer than [`MAX_LINE`] bytes is cut into pieces of that size.
//! The last [`TAIL_LINES`] lines of each stream are kept for the failure summary.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Longest line written in one piece, in bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// Lines of each stream kept for the failure summary.
pub const TAIL_LINES: usize = 50;

/// Which console stream a worker stream goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Console {
    /// The agent's stdout.
    Stdout,
    /// The agent's stderr.
    Stderr,
}

/// The last lines of a stream.
#[derive(Debug, Default)]
pub struct Tail {
    lines: VecDeque<String>,
}

impl Tail {
    fn push(&mut self, line: &[u8]) {
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines
            .push_back(String::from_utf8_lossy(line).into_owned());
    }

    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }
}

/// Where one worker stream goes.
#[derive(Debug)]
pub struct Sink {
    /// Console target and prefix, or `None` when redirected/filtered.
    pub console: Option<(Console, String)>,
    /// Log file (no prefix), if selected by --redirects/--tee.
    pub file: Option<File>,
    /// Ring buffer of the last lines.
    pub tail: Arc<Mutex<Tail>>,
}

impl Sink {
    fn line(&mut self, line: &[u8]) {
        if let Some((console, prefix)) = &self.console {
            let mut buf = Vec::with_capacity(prefix.len() + line.len() + 1);
            buf.extend_from_slice(prefix.as_bytes());
            buf.extend_from_slice(line);
            buf.push(b'\n');
            // One locked write per line: no interleaving between ranks.
            let _ = match console {
                Console::Stdout => std::io::stdout().lock().write_all(&buf),
                Console::Stderr => std::io::stderr().lock().write_all(&buf),
            };
        }
        if let Some(f) = &mut self.file {
            let _ = f.write_all(line).and_then(|_| f.write_all(b"\n"));
        }
        self.tail.lock().expect("tail mutex poisoned").push(line);
    }
}

/// Reads `fd` to end of file on a new thread, writing whole lines to `sink`.
pub fn pump(fd: OwnedFd, mut sink: Sink, name: String) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        let mut reader = File::from(fd);
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            pending.extend_from_slice(&buf[..n]);
            let mut start = 0;
            loop {
                let rest = &pending[start..];
                match rest.iter().position(|b| *b == b'\n') {
                    Some(pos) if pos <= MAX_LINE => {
                        sink.line(&rest[..pos]);
                        start += pos + 1;
                    }
                    _ if rest.len() >= MAX_LINE => {
                        sink.line(&rest[..MAX_LINE]);
                        start += MAX_LINE;
                    }
                    _ => break,
                }
            }
            pending.drain(..start);
        }
        if !pending.is_empty() {
            sink.line(&pending);
        }
        if let Some(f) = &mut sink.file {
            let _ = f.flush();
        }
    })
}

/// Expands a `--log-line-prefix-template` (`${role_name}`, `${local_rank}`, `${rank}`,
/// `${hostname}`; torchrun's macros). `None` gives drun's default `[rank<RANK>]:`.
pub fn prefix(
    template: Option<&str>,
    role: &str,
    local_rank: u32,
    rank: u32,
    hostname: &str,
) -> String {
    match template {
        None => format!("[rank{rank}]:"),
        Some(t) => t
            .replace("${role_name}", role)
            .replace("${local_rank}", &local_rank.to_string())
            .replace("${rank}", &rank.to_string())
            .replace("${hostname}", hostname),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_macros() {
        assert_eq!(prefix(None, "default", 1, 5, "h"), "[rank5]:");
        assert_eq!(
            prefix(
                Some("[${role_name}${local_rank}|${rank}@${hostname}]:"),
                "trainer",
                1,
                5,
                "box"
            ),
            "[trainer1|5@box]:"
        );
    }

    #[test]
    fn pump_splits_lines_flushes_partial_tail_and_cuts_long_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let (r, w) = nix::unistd::pipe().unwrap();
        let tail = Arc::new(Mutex::new(Tail::default()));
        let sink = Sink {
            console: None,
            file: Some(File::create(&path).unwrap()),
            tail: tail.clone(),
        };
        let h = pump(r, sink, "test-pump".into()).unwrap();
        let mut w = File::from(w);
        w.write_all(b"one\ntw").unwrap();
        w.write_all(b"o\n").unwrap();
        w.write_all(&vec![b'x'; MAX_LINE + 10]).unwrap();
        w.write_all(b"\nlast-without-newline").unwrap();
        drop(w);
        h.join().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "one");
        assert_eq!(lines[1], "two");
        assert_eq!(lines[2].len(), MAX_LINE);
        assert_eq!(lines[3].len(), 10);
        assert_eq!(lines[4], "last-without-newline");
        assert!(text.ends_with("last-without-newline\n"));
        assert_eq!(
            tail.lock().unwrap().lines().last().unwrap(),
            "last-without-newline"
        );
    }
}
