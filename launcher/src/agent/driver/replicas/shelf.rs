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

/// What the loop hears about replicas.
#[derive(Debug)]
pub(crate) enum Note {
    /// This node's step `key` was sent to `to`: verified there (how long it took, and each
    /// file's SHA-256 as sent, by its final path), or why not.
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
    pub(super) copies: BTreeMap<Key, Copy>,
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
}
