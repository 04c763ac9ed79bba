//! What a `drun-rendezvous` server accepts from an agent: every field of a session's Hello and
//! of each request, checked before anything reaches the session or the store. Pure functions
//! returning one line that names the field, the limit and the fix; the server answers a bad
//! Hello with `InvalidArgument` and a bad request mid-stream with an `Error` event, then ends
//! the session (a well-behaved agent never sends either).

use crate::ledger::{DigestKind, NodeCommit};
use crate::session::Request;
use crate::Candidate;
use drun_proto::v1 as pb;

/// What the server refuses in an agent's Hello or request: each variant's message is one line
/// naming the field, the limit and, where there is one, the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// An id with no characters.
    #[error("{what} is empty")]
    Empty { what: String },
    /// A field past its length limit, in bytes.
    #[error("{what} is {len} bytes long; at most {max}")]
    TooLong {
        what: String,
        len: usize,
        max: usize,
    },
    /// `.` or `..` as an id.
    #[error("{what} '{value}' is not a name (ids also name directories); use letters, digits and -_.:@[]")]
    NotAName { what: String, value: String },
    /// An id with `/`, whitespace or control characters (shown escaped).
    #[error("{what} '{value}' holds '/', whitespace or control characters; use letters, digits and -_.:@[]")]
    BadCharacters { what: String, value: String },
    /// An advertised address that is neither a host name nor an IP address (shown escaped).
    #[error("advertise address '{0}' is not a host name or IP address")]
    NotAnAddress(String),
    /// `--nnodes` past [`MAX_NODES`].
    #[error("nnodes {min}:{max} is past the limit of {MAX_NODES} nodes")]
    TooManyNodes { min: u32, max: u32 },
    /// A lease TTL past [`MAX_LEASE_TTL_MS`].
    #[error("lease TTL {0} ms is past the limit of {MAX_LEASE_TTL_MS} ms")]
    LeaseTooLong(u64),
    /// Worker slots outside 1..=[`MAX_SLOTS`].
    #[error("{0} worker slots offered; a node offers 1 to {MAX_SLOTS}")]
    Slots(u32),
    /// A requested node rank at or past [`MAX_NODES`].
    #[error("node rank {0} requested; node ranks are below {MAX_NODES}")]
    NodeRank(u32),
    /// A join or a commit in another node's name (the name shown escaped).
    #[error("a {what} in the name of node '{claimed}' on node '{node}''s session")]
    NotItsOwn {
        what: &'static str,
        claimed: String,
        node: String,
    },
    /// More shard files in one commit than [`MAX_FILES`].
    #[error("{0} shard files in one commit; at most {MAX_FILES}")]
    TooManyFiles(usize),
    /// A shard whose digest is neither a SHA-256 nor a BLAKE3 spelled as a manifest spells
    /// them (its path shown escaped).
    #[error("shard {0} has no digest (64 hex digits, or blake3: and 64 hex digits)")]
    NoDigest(String),
    /// A fingerprint past [`MAX_REPORT`] bytes.
    #[error("environment fingerprint is {0} bytes; at most {MAX_REPORT}")]
    FingerprintTooLarge(usize),
}

/// Longest run id or node id, in bytes (they name keys in the store).
pub const MAX_ID: usize = 253;
/// Longest advertised address, in bytes (a DNS name is at most 253).
pub const MAX_ADDR: usize = 253;
/// Most worker slots one node may offer (`--nproc-per-node`).
pub const MAX_SLOTS: u32 = 4096;
/// Most nodes a run may admit (`--nnodes` MAX).
pub const MAX_NODES: u32 = 100_000;
/// Longest free-text field (a failure description, a reason), in bytes.
pub const MAX_TEXT: usize = 64 * 1024;
/// Largest node report or fingerprint, in bytes of JSON.
pub const MAX_REPORT: usize = 256 * 1024;
/// Most shard files in one node's commit of a step.
pub const MAX_FILES: usize = 100_000;
/// Longest lease TTL an agent may ask for (1 hour): a lease past that would keep a dead node a
/// member for longer than any job waits.
pub const MAX_LEASE_TTL_MS: u64 = 3_600_000;

pub use crate::human::MAX_SECONDS;

/// A run or node id: 1 to [`MAX_ID`] bytes of printable characters, no `/` (ids name keys:
/// run `a` would otherwise see run `a/waiting`'s keys), no whitespace, not `.` or `..` (ids also
/// name checkpoint and log directories).
///
/// # Errors
/// One line naming `what` and the rule.
pub fn id(what: &str, v: &str) -> Result<(), Invalid> {
    let what = what.to_string();
    if v.is_empty() {
        return Err(Invalid::Empty { what });
    }
    if v.len() > MAX_ID {
        return Err(Invalid::TooLong {
            what,
            len: v.len(),
            max: MAX_ID,
        });
    }
    if v == "." || v == ".." {
        return Err(Invalid::NotAName {
            what,
            value: v.to_string(),
        });
    }
    if v.contains('/') || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Invalid::BadCharacters {
            what,
            value: v.escape_debug().to_string(),
        });
    }
    Ok(())
}

/// An advertised address: empty (the server fills in the peer's), or a host name, IPv4 or
/// IPv6 address (brackets and a `%zone` allowed) of at most [`MAX_ADDR`] bytes.
///
/// # Errors
/// One line naming the address.
pub fn addr(v: &str) -> Result<(), Invalid> {
    text("advertise address", v, MAX_ADDR)?;
    let ok = |c: char| c.is_ascii_alphanumeric() || "-._:[]%".contains(c);
    if !v.chars().all(ok) {
        return Err(Invalid::NotAnAddress(v.escape_debug().to_string()));
    }
    Ok(())
}

fn text(what: &str, v: &str, max: usize) -> Result<(), Invalid> {
    if v.len() > max {
        return Err(Invalid::TooLong {
            what: what.to_string(),
            len: v.len(),
            max,
        });
    }
    Ok(())
}

/// A session's first message (besides the protocol version, checked first).
///
/// # Errors
/// One line naming the field.
pub fn hello(h: &pb::Hello) -> Result<(), Invalid> {
    id("run id", &h.run_id)?;
    id("node id", &h.node_id)?;
    if h.max_nodes > MAX_NODES || h.min_nodes > MAX_NODES {
        return Err(Invalid::TooManyNodes {
            min: h.min_nodes,
            max: h.max_nodes,
        });
    }
    if h.lease_ttl_ms > MAX_LEASE_TTL_MS {
        return Err(Invalid::LeaseTooLong(h.lease_ttl_ms));
    }
    Ok(())
}

/// Who asks to join.
///
/// # Errors
/// One line naming the field.
pub fn candidate(c: &Candidate) -> Result<(), Invalid> {
    id("node id", &c.node_id)?;
    addr(&c.advertise_addr)?;
    if c.slots == 0 || c.slots > MAX_SLOTS {
        return Err(Invalid::Slots(c.slots));
    }
    if let Some(r) = c.requested_node_rank.filter(|&r| r >= MAX_NODES) {
        return Err(Invalid::NodeRank(r));
    }
    Ok(())
}

/// Refuses `what` sent in the name of `claimed` on `node`'s session.
fn own(what: &'static str, claimed: &str, node: &str) -> Result<(), Invalid> {
    if claimed == node {
        return Ok(());
    }
    Err(Invalid::NotItsOwn {
        what,
        claimed: claimed.escape_debug().to_string(),
        node: node.to_string(),
    })
}

fn commit(c: &NodeCommit, node: &str) -> Result<(), Invalid> {
    own("commit", &c.node_id, node)?;
    if c.files.len() > MAX_FILES {
        return Err(Invalid::TooManyFiles(c.files.len()));
    }
    for f in &c.files {
        text("shard path", &f.path, 4096)?;
        if DigestKind::of(&f.digest).is_none() {
            return Err(Invalid::NoDigest(f.path.escape_debug().to_string()));
        }
    }
    Ok(())
}

/// One request of `node`'s session.
///
/// # Errors
/// One line naming the request and the field.
pub fn request(r: &Request, node: &str) -> Result<(), Invalid> {
    match r {
        Request::Join(j, _) => {
            candidate(&j.candidate)?;
            own("join", &j.candidate.node_id, node)?;
            let fp: usize = j.fingerprint.iter().map(|(k, v)| k.len() + v.len()).sum();
            if fp > MAX_REPORT {
                return Err(Invalid::FingerprintTooLarge(fp));
            }
            Ok(())
        }
        Request::Failed { description, .. } => text("failure description", description, MAX_TEXT),
        Request::Preempt { reason, .. } => text("preemption reason", reason, MAX_TEXT),
        Request::Unfit { reason } => text("unfit reason", reason, MAX_TEXT),
        Request::MarkBad { id, reason, .. } => {
            text("manifest id", id, MAX_ID)?;
            text("bad-checkpoint reason", reason, MAX_TEXT)
        }
        Request::Report { json, .. } => text("node report", json, MAX_REPORT),
        Request::Commit { commit: c, .. } => commit(c, node),
        Request::KeepAlive | Request::Succeeded(_) | Request::Leave | Request::StandBy(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests;
