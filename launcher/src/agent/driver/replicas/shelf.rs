//! The replicas a node holds and what its driver hears of them (`--ckpt-replicas`): shared by
//! the receiver ([`super::receive`]) and the staging driver ([`super::Replicas`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::error::ReplicaError;
use crate::ckpt::memory::decide::Key;
use crate::ckpt::memory::replica::Held;

/// Copy buffer.
pub(super) const CHUNK: usize = 1 << 20;

/// The longest a transfer may take: this much plus a second per [`SLOWEST`] bytes.
const TRANSFER_BASE: Duration = Duration::from_secs(30);
/// The slowest link a transfer is given time for, bytes per second.
const SLOWEST: u64 = 20 << 20;

/// The longest a transfer of `bytes` may take, on either side.
pub(super) fn transfer_limit(bytes: u64) -> Duration {
    TRANSFER_BASE + Duration::from_secs(bytes / SLOWEST)
}

/// How fast a node sends its staged steps to its ring neighbour, bytes per second, unless
/// `DRUN_CKPT_REPLICA_RATE` says otherwise: a replica shares the node's network with the
/// training's collectives, which it must not starve (8 Gbit/s, a fraction of a GPU node's
/// links; 2 GiB of a node's step reach the neighbour in about 2 s).
pub(super) const REPLICA_RATE: u64 = 1 << 30;

/// The rate replicas are sent at: `env` (`DRUN_CKPT_REPLICA_RATE`, a size per second such as
/// `500M`; `0`: no limit) or [`REPLICA_RATE`] when unset, never below [`SLOWEST`], the slowest
/// link the receiver gives a transfer time for; with the warning line to print when the value
/// is unreadable (the default is used) or below that (it is raised).
pub(super) fn replica_rate(env: Option<&str>) -> (u64, Option<String>) {
    use crate::ckpt::memory::{human_bytes, parse_size};
    let Some(v) = env.map(str::trim) else {
        return (REPLICA_RATE, None);
    };
    match parse_size(v) {
        _ if v == "0" => (0, None),
        None => (
            REPLICA_RATE,
            Some(format!(
                "drun: warning: DRUN_CKPT_REPLICA_RATE={v:?} is not a rate (a size per second such as 500M, or 0 for no limit); replicas are sent at {}/s",
                human_bytes(REPLICA_RATE)
            )),
        ),
        Some(r) if r < SLOWEST => (
            SLOWEST,
            Some(format!(
                "drun: warning: DRUN_CKPT_REPLICA_RATE={v} is below {}/s, the slowest transfer a receiving agent waits for; replicas are sent at that",
                human_bytes(SLOWEST)
            )),
        ),
        Some(r) => (r, None),
    }
}

/// What the loop hears about replicas.
#[derive(Debug)]
pub(crate) enum Note {
    /// This node's step `key` was sent to `to`: verified there (how long it took, and each
    /// file's digest as sent, by its final path), or why not.
    Sent {
        key: Key,
        to: String,
        result: Result<(Duration, Vec<(String, String)>), ReplicaError>,
    },
    /// A replica of `from`'s step `key` is held here, verified.
    Received { key: Key, from: String },
    /// To take a replica, these persisted own copies go (the replica rule's choice).
    ReleaseOwn(Vec<Key>),
}

/// One replica held here.
#[derive(Debug)]
pub(super) struct Copy {
    pub(super) from: String,
    pub(super) bytes: u64,
    pub(super) files: Vec<PathBuf>,
    /// Every file arrived and was verified.
    pub(super) complete: bool,
    /// Its files with their ranks and verified digests (empty while incomplete, or from an
    /// older sender that names no ranks): what it offers a resume after a node loss.
    pub(super) held: Vec<drun_rendezvous::ShardFile>,
}

#[derive(Debug, Default)]
pub(super) struct ShelfState {
    /// The generation followed and its nodes (id, advertised address) in node-rank order.
    pub(super) generation: Option<(u64, Vec<(String, String)>)>,
    pub(super) budget: u64,
    /// This node's own copies, as the staging table last said.
    pub(super) own: Vec<Held>,
    /// Bytes the staging table holds besides its copies and the replicas (the ranks' spares,
    /// or the room kept for them, and fetched files), as it last said.
    pub(super) outside: u64,
    pub(super) copies: BTreeMap<Key, Copy>,
    /// Replicas released while they arrived whose receipt has not ended yet (their bytes so
    /// far still in memory): the receiving task removes them and the key.
    pub(super) ending: std::collections::BTreeSet<Key>,
}

/// The replicas this node holds, shared by its listener and its staging driver.
#[derive(Debug, Clone, Default)]
pub(super) struct Shelf(Arc<Mutex<ShelfState>>);

impl Shelf {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, ShelfState> {
        self.0.lock().expect("replica shelf lock")
    }
}
/// The fixed part of the exchange.
#[derive(Debug)]
pub(super) struct Ctx {
    pub(super) run_id: String,
    pub(super) me: String,
    pub(super) token: Option<String>,
    pub(super) ckpt_dir: PathBuf,
    /// Where replicas are kept: `<staging dir>/.replicas`, mirroring `--ckpt-dir`.
    pub(super) root: PathBuf,
    /// The rate this node's steps are sent at ([`replica_rate`]; `0`: no limit).
    pub(super) rate: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_rate_is_the_default_a_setting_or_no_limit_never_below_the_slowest_link() {
        assert_eq!(replica_rate(None), (REPLICA_RATE, None));
        assert_eq!(replica_rate(Some("500M")), (500 << 20, None));
        assert_eq!(replica_rate(Some(" 0 ")), (0, None), "no limit");
        let (rate, line) = replica_rate(Some("fast"));
        assert_eq!(rate, REPLICA_RATE);
        let line = line.expect("one line");
        assert!(
            line.contains("\"fast\" is not a rate")
                && line.contains("500M")
                && line.contains("1 GiB/s"),
            "{line}"
        );
        let (rate, line) = replica_rate(Some("1M"));
        assert_eq!(rate, SLOWEST, "the receiver would give up first");
        assert!(line.expect("one line").contains("below 20 MiB/s"));
        // A transfer at the slowest rate allowed ends within the receiver's limit.
        let bytes = 4u64 << 30;
        assert!(Duration::from_secs_f64(bytes as f64 / SLOWEST as f64) < transfer_limit(bytes));
    }
}
