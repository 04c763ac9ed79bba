//! Which worker stream has a partial line open on each console, so that no rank's output lands
//! inside another rank's line.
//!
//! A partial line is shown when it waits (a `print(..., end="")` before a long step, a `\r`
//! progress bar) or when it is longer than [`super::MAX_LINE`]. Until its end comes, another
//! rank's write would continue it on screen, and the end would follow later without a prefix.
//! So every console write first looks at the console's open line: another stream's is ended
//! with a newline, and a stream whose own open line was ended that way starts its continuation
//! with its prefix again. Log files are untouched: they get each stream's exact bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::Console;

/// Per console (stdout, stderr): the stream whose partial line is open there, if any.
static OPEN: [Mutex<Option<u64>>; 2] = [Mutex::new(None), Mutex::new(None)];

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

/// A fresh identity for one worker stream.
pub(super) fn new_stream() -> u64 {
    NEXT_STREAM.fetch_add(1, Ordering::Relaxed)
}

/// Runs `f` with `console`'s open-line owner locked: the whole write happens under it, so no
/// other stream writes between the decision and the bytes.
pub(super) fn locked<R>(console: Console, f: impl FnOnce(&mut Option<u64>) -> R) -> R {
    let slot = match console {
        Console::Stdout => &OPEN[0],
        Console::Stderr => &OPEN[1],
    };
    let mut open = slot.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut open)
}

/// What a console write of `buf` by stream `me` needs around it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Guarded {
    /// Bytes to write before `buf`: a newline ending another stream's open line, and `me`'s
    /// prefix when `buf` continues a line of `me` that was ended that way.
    pub lead: Vec<u8>,
    /// Leading bytes of `buf` to leave out: the newline that ends a line of `me` that was
    /// already ended by another stream's write (0 or 1).
    pub skip: usize,
    /// The console's open-line owner after the write.
    pub open_after: Option<u64>,
}

/// The decision for one console write (pure). `open`: the stream whose line is open now;
/// `continues`: `buf` continues a partial line `me` showed earlier; `prefix`: `me`'s prefix.
/// Writing `lead` then `buf[skip..]` (nothing when that is empty) keeps every rank's line whole.
pub(super) fn guard(
    open: Option<u64>,
    me: u64,
    buf: &[u8],
    continues: bool,
    prefix: &str,
) -> Guarded {
    let interrupted = continues && open != Some(me);
    let skip = usize::from(interrupted && buf.starts_with(b"\n"));
    if skip == buf.len() {
        return Guarded {
            lead: Vec::new(),
            skip,
            open_after: open,
        };
    }
    let mut lead = Vec::new();
    if open.is_some_and(|o| o != me) {
        lead.push(b'\n');
    }
    if interrupted && skip == 0 {
        lead.extend_from_slice(prefix.as_bytes());
    }
    Guarded {
        lead,
        skip,
        open_after: (!buf.ends_with(b"\n")).then_some(me),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_ranks_write_ends_an_open_line_and_its_rest_gets_the_prefix_again() {
        // rank 0 shows "loading model... " (open), rank 1 writes a whole line.
        let g = guard(Some(0), 1, b"[rank1]:line\n", false, "[rank1]:");
        assert_eq!(g.lead, b"\n");
        assert_eq!(g.open_after, None);
        // rank 0's "done\n" continues a line that was ended: prefixed again.
        let g = guard(None, 0, b"done\n", true, "[rank0]:");
        assert_eq!(g.lead, b"[rank0]:");
        assert_eq!(g.skip, 0);
        // Uninterrupted, a continuation is written as it is.
        let g = guard(Some(0), 0, b"done\n", true, "[rank0]:");
        assert!(g.lead.is_empty() && g.skip == 0 && g.open_after.is_none());
    }

    #[test]
    fn a_partial_line_stays_open_and_the_end_of_a_line_already_ended_writes_nothing() {
        let g = guard(None, 3, b"[rank3]:\rprogress 1", false, "[rank3]:");
        assert_eq!(g.open_after, Some(3));
        // Another rank's piece ends rank 3's line and leaves its own open.
        let g = guard(Some(3), 4, b"[rank4]:\rprogress 1", false, "[rank4]:");
        assert_eq!((g.lead.as_slice(), g.open_after), (&b"\n"[..], Some(4)));
        // Rank 3's stream ends: its line was ended already, and rank 4's stays open.
        let g = guard(Some(4), 3, b"\n", true, "[rank3]:");
        assert!(g.skip == 1 && g.lead.is_empty(), "{g:?}");
        assert_eq!(g.open_after, Some(4));
        // Its line's bare end followed by whole lines: the end is left out, the lines written
        // after ending rank 4's open line.
        let g = guard(Some(4), 3, b"\n[rank3]:next\n", true, "[rank3]:");
        assert_eq!(
            (g.lead.as_slice(), g.skip, g.open_after),
            (&b"\n"[..], 1, None)
        );
    }
}
