//! What a `drun-rendezvous` server accepts from an agent: every field of a session's Hello and
//! of each request, checked before anything reaches the session or the store. Pure functions
//! returning one line that names the field, the limit and the fix; the server answers a bad
//! Hello with `InvalidArgument` and a bad request mid-stream with an `Error` event, then ends
//! the session (a well-behaved agent never sends either).

use crate::ledger::NodeCommit;
use crate::session::Request;
use crate::Candidate;
use drun_proto::v1 as pb;

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
pub fn id(what: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if v.len() > MAX_ID {
        return Err(format!(
            "{what} is {} bytes long; at most {MAX_ID}",
            v.len()
        ));
    }
    if v == "." || v == ".." {
        return Err(format!(
            "{what} '{v}' is not a name (ids also name directories); use letters, digits and -_.:@[]"
        ));
    }
    if v.contains('/') || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{what} '{}' holds '/', whitespace or control characters; use letters, digits and -_.:@[]",
            v.escape_debug()
        ));
    }
    Ok(())
}

/// An advertised address: empty (the server fills in the peer's), or a host name, IPv4 or
/// IPv6 address (brackets and a `%zone` allowed) of at most [`MAX_ADDR`] bytes.
///
/// # Errors
/// One line naming the address.
pub fn addr(v: &str) -> Result<(), String> {
    if v.len() > MAX_ADDR {
        return Err(format!(
            "advertise address is {} bytes long; at most {MAX_ADDR}",
            v.len()
        ));
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || "-._:[]%".contains(c);
    if !v.chars().all(ok) {
        return Err(format!(
            "advertise address '{}' is not a host name or IP address",
            v.escape_debug()
        ));
    }
    Ok(())
}

fn text(what: &str, v: &str, max: usize) -> Result<(), String> {
    if v.len() > max {
        return Err(format!("{what} is {} bytes long; at most {max}", v.len()));
    }
    Ok(())
}

/// A session's first message (besides the protocol version, checked first).
///
/// # Errors
/// One line naming the field.
pub fn hello(h: &pb::Hello) -> Result<(), String> {
    id("run id", &h.run_id)?;
    id("node id", &h.node_id)?;
    if h.max_nodes > MAX_NODES || h.min_nodes > MAX_NODES {
        return Err(format!(
            "nnodes {}:{} is past the limit of {MAX_NODES} nodes",
            h.min_nodes, h.max_nodes
        ));
    }
    if h.lease_ttl_ms > MAX_LEASE_TTL_MS {
        return Err(format!(
            "lease TTL {} ms is past the limit of {MAX_LEASE_TTL_MS} ms",
            h.lease_ttl_ms
        ));
    }
    Ok(())
}

/// Who asks to join.
///
/// # Errors
/// One line naming the field.
pub fn candidate(c: &Candidate) -> Result<(), String> {
    id("node id", &c.node_id)?;
    addr(&c.advertise_addr)?;
    if c.slots == 0 || c.slots > MAX_SLOTS {
        return Err(format!(
            "{} worker slots offered; a node offers 1 to {MAX_SLOTS}",
            c.slots
        ));
    }
    if c.requested_node_rank.is_some_and(|r| r >= MAX_NODES) {
        return Err(format!(
            "node rank {} requested; node ranks are below {MAX_NODES}",
            c.requested_node_rank.unwrap_or_default()
        ));
    }
    Ok(())
}

fn commit(c: &NodeCommit, node: &str) -> Result<(), String> {
    if c.node_id != node {
        return Err(format!(
            "a commit in the name of node '{}' on node '{node}''s session",
            c.node_id.escape_debug()
        ));
    }
    if c.files.len() > MAX_FILES {
        return Err(format!(
            "{} shard files in one commit; at most {MAX_FILES}",
            c.files.len()
        ));
    }
    for f in &c.files {
        text("shard path", &f.path, 4096)?;
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "shard {} has no SHA-256 (64 hex digits)",
                f.path.escape_debug()
            ));
        }
    }
    Ok(())
}

/// One request of `node`'s session.
///
/// # Errors
/// One line naming the request and the field.
pub fn request(r: &Request, node: &str) -> Result<(), String> {
    match r {
        Request::Join(j, _) => {
            candidate(&j.candidate)?;
            if j.candidate.node_id != node {
                return Err(format!(
                    "a join in the name of node '{}' on node '{node}''s session",
                    j.candidate.node_id.escape_debug()
                ));
            }
            let fp: usize = j.fingerprint.iter().map(|(k, v)| k.len() + v.len()).sum();
            if fp > MAX_REPORT {
                return Err(format!(
                    "environment fingerprint is {fp} bytes; at most {MAX_REPORT}"
                ));
            }
            Ok(())
        }
        Request::Failed { description, .. } => text("failure description", description, MAX_TEXT),
        Request::Preempt { reason, .. } => text("preemption reason", reason, MAX_TEXT),
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
