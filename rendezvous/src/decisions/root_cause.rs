//! The root cause of a run's failure: the first worker failure of a generation, as the node that
//! saw it reports it (key `gen/<g>/root-cause`, and in a failed run's end), so that every node's
//! summary names it, not only the failing node's.

use serde::{Deserialize, Serialize};

/// The longest message kept (bytes, cut at a character boundary): one line of a summary.
pub const MESSAGE_MAX: usize = 300;

/// The first failure of a generation, as the agent of the failing worker described it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootCause {
    /// The generation the worker ran in.
    pub generation: u64,
    /// The node id of the failing worker's agent.
    pub node: String,
    /// That node's host name.
    pub host: String,
    /// Global rank.
    pub rank: u32,
    /// Local rank.
    pub local_rank: u32,
    /// Process id.
    pub pid: i32,
    /// The exit code as torch reports it: the status, or minus the signal number.
    pub exitcode: i32,
    /// The signal's name (`SIGKILL`) when a signal killed the worker.
    #[serde(default)]
    pub signal: Option<String>,
    /// The likely reason for that signal, when drun knows one.
    #[serde(default)]
    pub likely: Option<String>,
    /// The error file's message, else the last meaningful line of its output; may be empty.
    #[serde(default)]
    pub message: String,
    /// When it failed, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl RootCause {
    /// One line: `rank 3 (local_rank 1) exited with 3 (pid 42) on node b: ValueError: boom`.
    pub fn line(&self) -> String {
        let how = match &self.signal {
            Some(s) => format!("was killed by {s}"),
            None => format!("exited with {}", self.exitcode),
        };
        let mut line = format!(
            "rank {} (local_rank {}) {how} (pid {}) on node {}",
            self.rank, self.local_rank, self.pid, self.node
        );
        if !self.message.is_empty() {
            line.push_str(": ");
            line.push_str(&self.message);
        }
        line
    }

    /// The block a node prints when the run failed because of this failure elsewhere.
    pub fn block(&self, script: &str, time: &str) -> String {
        let border = "=".repeat(60);
        let rule = "-".repeat(60);
        let mut s = format!(
            "{border}\n{script} FAILED\n{rule}\nRoot Cause (first failure of generation {}, on node {}):\n  time      : {time}\n  node      : {} (host {})\n  rank      : {} (local_rank: {})\n  exitcode  : {} (pid: {})\n",
            self.generation, self.node, self.node, self.host, self.rank, self.local_rank, self.exitcode, self.pid
        );
        if let Some(sig) = &self.signal {
            s.push_str(&format!("  signal    : {sig}"));
            if let Some(why) = &self.likely {
                s.push_str(&format!(": {why}"));
            }
            s.push('\n');
        }
        let message = if self.message.is_empty() {
            "<none: no error file and no output>"
        } else {
            &self.message
        };
        s.push_str(&format!("  message   : {message}\n{border}\n"));
        s
    }
}

/// The last meaningful line of `lines` (trailing blank lines and bare `^^^` markers skipped),
/// trimmed and cut to [`MESSAGE_MAX`] bytes.
pub fn last_meaningful(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| l.trim())
        .rfind(|l| !l.is_empty() && !l.chars().all(|c| matches!(c, '^' | '~' | ' ')))
        .map(cut)
        .unwrap_or_default()
}

/// `s` cut to [`MESSAGE_MAX`] bytes at a character boundary, `…` marking a cut.
pub fn cut(s: &str) -> String {
    if s.len() <= MESSAGE_MAX {
        return s.to_string();
    }
    let mut end = MESSAGE_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause() -> RootCause {
        RootCause {
            generation: 2,
            node: "b".into(),
            host: "hb".into(),
            rank: 3,
            local_rank: 1,
            pid: 42,
            exitcode: 7,
            message: "ValueError: boom".into(),
            at_ms: 1,
            ..RootCause::default()
        }
    }

    #[test]
    fn line_and_block_name_node_rank_exit_code_and_message() {
        let c = cause();
        assert_eq!(
            c.line(),
            "rank 3 (local_rank 1) exited with 7 (pid 42) on node b: ValueError: boom"
        );
        let b = c.block("train.py", "t");
        for want in [
            "train.py FAILED",
            "first failure of generation 2, on node b",
            "node      : b (host hb)",
            "rank      : 3 (local_rank: 1)",
            "exitcode  : 7 (pid: 42)",
            "message   : ValueError: boom",
        ] {
            assert!(b.contains(want), "{want}: {b}");
        }
        assert!(!b.contains("signal"), "{b}");
    }

    #[test]
    fn a_signal_names_itself_and_its_likely_reason() {
        let c = RootCause {
            exitcode: -9,
            signal: Some("SIGKILL".into()),
            likely: Some("the OOM killer".into()),
            message: String::new(),
            ..cause()
        };
        assert_eq!(
            c.line(),
            "rank 3 (local_rank 1) was killed by SIGKILL (pid 42) on node b"
        );
        let b = c.block("w.py", "t");
        assert!(b.contains("signal    : SIGKILL: the OOM killer"), "{b}");
        assert!(b.contains("exitcode  : -9"), "{b}");
        assert!(b.contains("message   : <none"), "{b}");
    }

    #[test]
    fn the_message_is_the_last_meaningful_line_cut_short() {
        let lines: Vec<String> = [
            "Traceback",
            "  x = f()",
            "      ^^^^",
            "ValueError: x",
            "",
            " ",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(last_meaningful(&lines), "ValueError: x");
        assert_eq!(last_meaningful(&[]), "");
        let long = "é".repeat(400);
        let c = cut(&long);
        assert!(c.len() <= MESSAGE_MAX + '…'.len_utf8() && c.ends_with('…'));
    }
}
