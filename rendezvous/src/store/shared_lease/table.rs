//! The table of agent leases a server holds on shared carriers: deadlines, the keys attached to
//! each lease and their revisions. Pure: every call takes `now`; the store wrapper around it
//! does the I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::LeaseId;

/// A lease that ended (expired or revoked): the keys to delete, each guarded by the revision
/// this server last wrote it at, so a key another writer has since overwritten (an agent's
/// lease taken over by another replica) stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The agent lease.
    pub lease: LeaseId,
    /// `(key, mod_revision)` of every key last written under it by this server.
    pub keys: Vec<(String, i64)>,
}

#[derive(Debug)]
struct Entry {
    ttl: Duration,
    deadline: Instant,
    carrier: LeaseId,
    /// Keys that may be attached: confirmed writes and writes in flight.
    keys: BTreeSet<String>,
}

/// Agent leases and their keys. A key belongs to the lease of its last write, as in etcd.
#[derive(Debug, Default)]
pub struct LeaseTable {
    leases: HashMap<LeaseId, Entry>,
    deadlines: BTreeSet<(Instant, LeaseId)>,
    /// Confirmed writes: key → (lease, mod_revision).
    owner: BTreeMap<String, (LeaseId, i64)>,
}

impl LeaseTable {
    /// Number of live leases.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Adds `lease` living `ttl` from `now` on `carrier` (replaces an entry of the same id).
    pub fn grant(&mut self, lease: LeaseId, ttl: Duration, carrier: LeaseId, now: Instant) {
        if let Some(old) = self.leases.remove(&lease) {
            self.deadlines.remove(&(old.deadline, lease));
        }
        let deadline = now + ttl;
        self.deadlines.insert((deadline, lease));
        self.leases.insert(
            lease,
            Entry {
                ttl,
                deadline,
                carrier,
                keys: BTreeSet::new(),
            },
        );
    }

    /// Renews `lease` to its full TTL; `None` if it is unknown or already past its deadline.
    pub fn renew(&mut self, lease: LeaseId, now: Instant) -> Option<Duration> {
        let e = self.leases.get_mut(&lease)?;
        if e.deadline <= now {
            return None;
        }
        self.deadlines.remove(&(e.deadline, lease));
        e.deadline = now + e.ttl;
        self.deadlines.insert((e.deadline, lease));
        Some(e.ttl)
    }

    /// The carrier of a live `lease`.
    pub fn carrier(&self, lease: LeaseId, now: Instant) -> Option<LeaseId> {
        self.leases
            .get(&lease)
            .filter(|e| e.deadline > now)
            .map(|e| e.carrier)
    }

    /// The TTL of a known `lease`.
    pub fn ttl(&self, lease: LeaseId) -> Option<Duration> {
        self.leases.get(&lease).map(|e| e.ttl)
    }

    /// A write of `key` under `lease` is about to go out: returns every key that may be
    /// attached to the lease afterwards (for its registry record).
    pub fn writing(&mut self, lease: LeaseId, key: &str) -> Vec<String> {
        let Some(e) = self.leases.get_mut(&lease) else {
            return vec![];
        };
        e.keys.insert(key.to_string());
        e.keys.iter().cloned().collect()
    }

    /// A write of `key` landed at `revision`, under `lease` (`None`: no agent lease). Returns
    /// `false` when that lease ended while the write was in flight: the caller deletes the key.
    pub fn wrote(&mut self, key: &str, lease: Option<LeaseId>, revision: i64) -> bool {
        self.forget_key(key);
        let Some(lease) = lease else { return true };
        let Some(e) = self.leases.get_mut(&lease) else {
            return false;
        };
        e.keys.insert(key.to_string());
        self.owner.insert(key.to_string(), (lease, revision));
        true
    }

    /// Whether the last confirmed write of `key` was under `lease`.
    pub fn holds(&self, lease: LeaseId, key: &str) -> bool {
        self.owner.get(key).is_some_and(|(l, _)| *l == lease)
    }

    /// `key` was deleted.
    pub fn deleted(&mut self, key: &str) {
        self.forget_key(key);
    }

    /// Every key under `prefix` was deleted.
    pub fn deleted_prefix(&mut self, prefix: &str) {
        let gone: Vec<String> = self
            .owner
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.forget_key(&k);
        }
    }

    fn forget_key(&mut self, key: &str) {
        if let Some((lease, _)) = self.owner.remove(key) {
            if let Some(e) = self.leases.get_mut(&lease) {
                e.keys.remove(key);
            }
        }
    }

    /// The earliest deadline, if any lease is held.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Removes and returns every lease whose deadline is at or before `now`.
    pub fn take_expired(&mut self, now: Instant) -> Vec<Ended> {
        let due: Vec<LeaseId> = self
            .deadlines
            .iter()
            .take_while(|(d, _)| *d <= now)
            .map(|(_, l)| *l)
            .collect();
        due.into_iter().filter_map(|l| self.end(l)).collect()
    }

    /// Removes `lease` now (a revoke); `None` if unknown.
    pub fn end(&mut self, lease: LeaseId) -> Option<Ended> {
        let e = self.leases.remove(&lease)?;
        self.deadlines.remove(&(e.deadline, lease));
        let mut keys = Vec::new();
        for k in e.keys {
            if let Some((owner, rev)) = self.owner.get(&k).copied() {
                if owner == lease {
                    self.owner.remove(&k);
                    keys.push((k, rev));
                }
            }
        }
        Some(Ended { lease, keys })
    }

    /// `carrier` is gone from the store (its keys with it): drops every lease on it and returns
    /// their ids.
    pub fn carrier_lost(&mut self, carrier: LeaseId) -> Vec<LeaseId> {
        let on: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, e)| e.carrier == carrier)
            .map(|(l, _)| *l)
            .collect();
        for l in &on {
            self.end(*l);
        }
        on
    }

    /// The process did not run for `gap` (stopped, or starved): nobody could renew meanwhile,
    /// so every deadline moves by it — the same rule as the embedded store's leases.
    pub fn shift(&mut self, gap: Duration) {
        self.deadlines = self.deadlines.iter().map(|(d, l)| (*d + gap, *l)).collect();
        for e in self.leases.values_mut() {
            e.deadline += gap;
        }
    }
}
