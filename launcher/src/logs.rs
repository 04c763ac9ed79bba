//! Worker output: whole prefixed lines on the console, exact bytes in per-rank files.
//!
//! Each worker stream is read on its own thread (a slow reader never blocks supervision or
//! teardown; the agent waits for readers only up to a deadline). Log files receive the bytes
//! exactly as the worker wrote them. The console receives lines: each complete line is written in
//! a single locked write of `prefix + line + '\n'`, so lines of different ranks never interleave
//! mid-line. Two exceptions keep interactive output alive: a partial line that sits for
//! [`IDLE_FLUSH`] (a `\r` progress bar, a `(Pdb) ` prompt) is shown as it is and its
//! continuation follows without a new prefix; and a line longer than [`MAX_LINE`] bytes is
//! written in pieces the same way. Another rank's write never lands inside such an open line:
//! it ends it first, and the rest of the line comes later with its prefix again ([`open_line`]).
//! A final partial line is completed with a newline at end of stream. If the console
//! is gone (EPIPE, e.g. `drun ... | head`), console output stops, and when nothing else consumes
//! the stream the pipe is closed so the worker sees EPIPE too, as it would without drun.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

mod open_line;

/// Longest piece of a line written to the console in one write, in bytes: a longer line is
/// written in pieces of this size, each continuing the last (no prefix, no newline between).
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// Longest line kept for the failure summary, in bytes (the rest is cut).
pub const TAIL_LINE_MAX: usize = 4096;
/// Lines of each stream kept for the failure summary.
pub const TAIL_LINES: usize = 50;
/// How long a partial line may wait for its end before it is shown anyway.
pub const IDLE_FLUSH: Duration = Duration::from_millis(100);

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
    /// Adds a line, or with `continuation` the rest of the last one (a partial line that was
    /// shown early is still one line). Keeps what a terminal would show: text after the last
    /// `\r` (a progress bar redrawn in place).
    fn push(&mut self, piece: &[u8], continuation: bool) {
        let piece = String::from_utf8_lossy(piece);
        match self.lines.back_mut() {
            Some(last) if continuation => last.push_str(&piece),
            _ => {
                if self.lines.len() == TAIL_LINES {
                    self.lines.pop_front();
                }
                self.lines.push_back(piece.into_owned());
            }
        }
        if let Some(last) = self.lines.back_mut() {
            if let Some(cr) = last.trim_end_matches('\r').rfind('\r') {
                last.drain(..=cr);
            }
            if last.len() > TAIL_LINE_MAX {
                let mut end = TAIL_LINE_MAX;
                while !last.is_char_boundary(end) {
                    end -= 1;
                }
                last.truncate(end);
            }
        }
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
    /// Log file (exact bytes, no prefix), if selected by --redirects/--tee.
    pub file: Option<File>,
    /// Ring buffer of the last lines.
    pub tail: Arc<Mutex<Tail>>,
    /// Bytes this stream's reader moved (read from the worker, written to the console), shared
    /// by a group's readers: a reader whose count still grows is draining, not stuck.
    pub moved: Arc<AtomicU64>,
}

/// Console bytes written between two updates of [`Sink::moved`]: a long write to a slow
/// console shows progress as it goes.
const PROGRESS_CHUNK: usize = 64 * 1024;

/// What the agent does about its output readers after the workers are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Every reader reached end of file.
    Done,
    /// Some reader still moves bytes (a slow console, a long last burst) or went quiet less
    /// than the quiet limit ago: wait.
    Wait,
    /// No byte moved for the quiet limit: whatever still holds a reader (a leaked descendant
    /// keeping the pipe open, a console nobody reads) is left behind.
    LeaveBlocked,
}

/// The drain rule (pure): wait while output still moves; give up on readers only after
/// `quiet_for` without a byte moved reaches `quiet_limit`. A consumer that reads slowly
/// (`drun ... | tee`, a log shipper) gets every byte however long it takes.
pub fn drain(all_done: bool, quiet_for: Duration, quiet_limit: Duration) -> Drain {
    if all_done {
        Drain::Done
    } else if quiet_for >= quiet_limit {
        Drain::LeaveBlocked
    } else {
        Drain::Wait
    }
}

impl Sink {
    /// Writes `bytes` of stream `id` to the console: with the prefix unless `continuation`,
    /// and with a newline when `complete`. Returns false once the console is gone.
    fn console(&mut self, id: u64, bytes: &[u8], continuation: bool, complete: bool) -> bool {
        let Some((_, prefix)) = &self.console else {
            return false;
        };
        let buf = console_bytes(prefix, bytes, continuation, complete);
        self.write_console(
            id,
            &Batch {
                bytes: buf,
                continues: continuation,
            },
        )
    }

    /// Adds `line` (complete) to `batch`, the console bytes of one write, and to the tail.
    fn batch_line(&mut self, batch: &mut Batch, line: &[u8], continuation: bool) {
        if batch.bytes.is_empty() {
            batch.continues = continuation;
        }
        if let Some((_, prefix)) = &self.console {
            append_console_bytes(&mut batch.bytes, prefix, line, continuation, true);
        }
        self.tail
            .lock()
            .expect("tail mutex poisoned")
            .push(line, continuation);
    }

    /// Writes `batch` (whole lines, or one piece of a line) of stream `id` to the console in
    /// one locked write, so lines of different ranks never interleave, after ending another
    /// stream's open line ([`open_line`]). Returns false once the console is gone.
    fn write_console(&mut self, id: u64, batch: &Batch) -> bool {
        let Some((console, prefix)) = &self.console else {
            return false;
        };
        if batch.bytes.is_empty() {
            return true;
        }
        let moved = &self.moved;
        let res = open_line::locked(*console, |open| {
            let g = open_line::guard(*open, id, &batch.bytes, batch.continues, prefix);
            let bytes = &batch.bytes[g.skip..];
            if bytes.is_empty() {
                return Ok(());
            }
            let res = match console {
                Console::Stdout => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&g.lead)
                        .and_then(|_| write_counted(&mut out, bytes, moved))
                        .and_then(|_| out.flush())
                }
                Console::Stderr => {
                    let mut err = std::io::stderr().lock();
                    err.write_all(&g.lead)
                        .and_then(|_| write_counted(&mut err, bytes, moved))
                }
            };
            if res.is_ok() {
                *open = g.open_after;
            }
            res
        });
        if res
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            self.console = None;
            return false;
        }
        true
    }

    /// Nothing consumes the stream any more (console gone, no file).
    fn is_dead(&self) -> bool {
        self.console.is_none() && self.file.is_none()
    }
}

/// Writes `bytes` to `w` in pieces, counting each in `moved` once written.
fn write_counted(w: &mut impl Write, bytes: &[u8], moved: &AtomicU64) -> std::io::Result<()> {
    for piece in bytes.chunks(PROGRESS_CHUNK) {
        w.write_all(piece)?;
        moved.fetch_add(piece.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// The console bytes of one write, and whether they start by continuing the stream's partial
/// line (then they carry no prefix).
#[derive(Debug, Default)]
struct Batch {
    bytes: Vec<u8>,
    continues: bool,
}

/// What one console write holds: `prefix + bytes (+ '\n')`, without the prefix for a
/// continuation or when the line already starts with it (torch prefixes some lines itself,
/// `[rank1]: Traceback ...`, and the default prefix is the same text).
fn console_bytes(prefix: &str, bytes: &[u8], continuation: bool, complete: bool) -> Vec<u8> {
    let mut buf = Vec::with_capacity(prefix.len() + bytes.len() + 1);
    append_console_bytes(&mut buf, prefix, bytes, continuation, complete);
    buf
}

/// [`console_bytes`] appended to `buf`.
fn append_console_bytes(
    buf: &mut Vec<u8>,
    prefix: &str,
    bytes: &[u8],
    continuation: bool,
    complete: bool,
) {
    if !continuation && !bytes.starts_with(prefix.as_bytes()) {
        buf.extend_from_slice(prefix.as_bytes());
    }
    buf.extend_from_slice(bytes);
    if complete {
        buf.push(b'\n');
    }
}

/// Waits up to `timeout` for `fd` to become readable (or hung up).
fn readable(fd: &File, timeout: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    !matches!(poll(&mut fds, ms), Ok(0))
}

/// Reads `fd` to end of file on a new thread, writing to `sink` as described in the module docs.
/// `had_console` tells whether the stream was meant for the console at all.
pub fn pump(fd: OwnedFd, mut sink: Sink, name: String) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        let had_console = sink.console.is_some();
        let id = open_line::new_stream();
        let mut reader = File::from(fd);
        let mut pending: Vec<u8> = Vec::new();
        // Bytes at the start of `pending` already searched for a newline: each byte is looked
        // at once, so a long line read in many pieces costs linear, not quadratic, time.
        let mut searched: usize = 0;
        // The console already shows the start of the current line (prefix included).
        let mut continuation = false;
        let mut buf = vec![0u8; 16 * 1024];
        let mut batch = Batch::default();
        loop {
            if !pending.is_empty() && !readable(&reader, IDLE_FLUSH) {
                sink.console(id, &pending, continuation, false);
                // Keep the bytes for the tail, but they are on screen now.
                sink.tail
                    .lock()
                    .expect("tail mutex poisoned")
                    .push(&pending, continuation);
                continuation = true;
                pending.clear();
                searched = 0;
                continue;
            }
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            sink.moved.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(f) = &mut sink.file {
                let _ = f.write_all(&buf[..n]);
            }
            pending.extend_from_slice(&buf[..n]);
            // The complete lines of this read go to the console in one write.
            batch.bytes.clear();
            let mut start = 0;
            loop {
                let rest = &pending[start..];
                let from = searched.saturating_sub(start);
                let newline = rest[from..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map(|p| from + p);
                match newline {
                    Some(pos) if pos <= MAX_LINE => {
                        sink.batch_line(&mut batch, &pending[start..start + pos], continuation);
                        continuation = false;
                        start += pos + 1;
                    }
                    _ if rest.len() >= MAX_LINE => {
                        // Shown now, continued by the next piece (as an idle partial line is).
                        sink.write_console(id, &batch);
                        batch.bytes.clear();
                        let piece = rest[..MAX_LINE].to_vec();
                        sink.console(id, &piece, continuation, false);
                        sink.tail
                            .lock()
                            .expect("tail mutex poisoned")
                            .push(&piece, continuation);
                        continuation = true;
                        start += MAX_LINE;
                    }
                    _ => {
                        searched = pending.len();
                        break;
                    }
                }
            }
            sink.write_console(id, &batch);
            pending.drain(..start);
            searched -= start;
            if had_console && sink.is_dead() {
                // `drun ... | head`: close our end so the worker gets EPIPE like it would alone.
                return;
            }
        }
        if !pending.is_empty() {
            batch.bytes.clear();
            sink.batch_line(&mut batch, &pending, continuation);
            sink.write_console(id, &batch);
        } else if continuation {
            sink.console(id, b"", true, true);
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
    fn a_line_torch_already_prefixed_is_not_prefixed_again() {
        let b = |line: &[u8], cont| String::from_utf8(console_bytes("[rank1]:", line, cont, true));
        assert_eq!(
            b(b"[rank1]: Traceback", false).unwrap(),
            "[rank1]: Traceback\n"
        );
        assert_eq!(b(b" Traceback", false).unwrap(), "[rank1]: Traceback\n");
        assert_eq!(b(b"[rank10]: x", false).unwrap(), "[rank1]:[rank10]: x\n");
        assert_eq!(b(b"rest", true).unwrap(), "rest\n");
    }

    #[test]
    fn tail_keeps_lines_as_a_terminal_shows_them() {
        let mut t = Tail::default();
        t.push(b"(Pdb) ", false);
        t.push(b"continue", true);
        t.push(b"\r 10%\r 50%\r100%", false);
        t.push(b"next", false);
        assert_eq!(t.lines(), ["(Pdb) continue", "100%", "next"]);
    }

    #[test]
    fn readers_are_waited_for_while_bytes_move_and_left_only_after_a_quiet_limit() {
        let limit = Duration::from_secs(2);
        assert_eq!(drain(true, Duration::ZERO, limit), Drain::Done);
        assert_eq!(drain(true, Duration::from_secs(9), limit), Drain::Done);
        // A slow console: bytes moved a moment ago, however long the drain has run.
        assert_eq!(drain(false, Duration::from_millis(10), limit), Drain::Wait);
        assert_eq!(
            drain(false, Duration::from_millis(1999), limit),
            Drain::Wait
        );
        assert_eq!(drain(false, limit, limit), Drain::LeaveBlocked);
    }

    #[test]
    fn pump_keeps_file_bytes_exact_and_keeps_a_long_line_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let (r, w) = nix::unistd::pipe().unwrap();
        let tail = Arc::new(Mutex::new(Tail::default()));
        let sink = Sink {
            console: None,
            file: Some(File::create(&path).unwrap()),
            tail: tail.clone(),
            moved: Arc::default(),
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
        let expected = format!(
            "one\ntwo\n{}\nlast-without-newline",
            "x".repeat(MAX_LINE + 10)
        );
        assert_eq!(text, expected, "the file holds exactly the worker's bytes");
        let tail = tail.lock().unwrap().lines();
        assert_eq!(tail[0], "one");
        assert_eq!(tail[1], "two");
        // The line longer than one console write is still one line (cut for the summary).
        assert_eq!(tail[2], "x".repeat(TAIL_LINE_MAX));
        assert_eq!(tail[3], "last-without-newline");
        assert_eq!(tail.len(), 4);
    }
}
