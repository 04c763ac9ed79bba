//! The door to a run's keys: the one typed accessor that reads and writes them, with the
//! records of [`crate::store::records`] and their one encoding each.
//!
//! [`crate::Round`], the session, `status` and the reports read and write a run's keys only
//! through [`RunState`]: its reads here, its transactions in [`round`] (joining, deciding and
//! forming a generation, a failed round's verdict) and [`session`] (entering, closing and
//! ending a generation, spending a restart, save requests, losses, accusations, reports) and
//! [`ledger`] (the checkpoint ledger's commits, seals, retention and bad marks). A
//! value that does not decode is [`StoreError::Corrupt`] everywhere, never a silent default.
//! The door decides nothing: every guard it writes with is the caller's, named by the method.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::decisions::loss;
use crate::store::keys::RunKeys;
use crate::store::records::Join;
pub use crate::store::records::{decode, decode_generation, encode, encode_generation};
use crate::store::records::{
    FailureRecord, Formation, Interval, Restarts, RootCause, RoundFailure, RunEnd,
};
use crate::store::{Compare, KeyValue, LeaseId, Op, Store, Txn, WatchEvent};
use crate::{Plan, StoreError};

/// Plans decoded lately, newest last: (key, the stored bytes as buffers met, plan).
type PlanCache = Vec<(String, Vec<bytes::Bytes>, Plan)>;

/// How many decoded plans [`decode_plan`] keeps.
const PLANS_KEPT: usize = 8;

/// How many buffers of one plan's bytes (one per read) the cache remembers.
const BUFFERS_KEPT: usize = 4;

/// Decodes the plan stored at `key` as `value`, or returns the copy decoded earlier from the
/// very same bytes (a clone of a [`Plan`] shares its member list). A server's sessions all read
/// one plan at a formation; decoding a 1,024-member plan a thousand times was most of a
/// formation's CPU.
pub fn decode_plan(key: &str, value: &bytes::Bytes) -> Result<Plan, StoreError> {
    static PLANS: std::sync::Mutex<PlanCache> = std::sync::Mutex::new(Vec::new());
    {
        let mut plans = PLANS.lock().expect("plan cache poisoned");
        let same_buffer = |v: &bytes::Bytes| v.as_ptr() == value.as_ptr() && v.len() == value.len();
        // The same buffer (a read shared by many sessions) needs no byte comparison.
        if let Some((_, _, plan)) = plans
            .iter()
            .find(|(k, vs, _)| k == key && vs.iter().any(same_buffer))
        {
            return Ok(plan.clone());
        }
        // Equal bytes from another read: remembered, so the other sessions of that read find
        // them by pointer. Comparing a 10,000-member plan (about a megabyte) byte by byte in
        // every session was a tenth of a formation's CPU.
        if let Some((_, vs, plan)) = plans
            .iter_mut()
            .find(|(k, vs, _)| k == key && vs[0] == value)
        {
            if vs.len() >= BUFFERS_KEPT {
                vs.remove(1);
            }
            vs.push(value.clone());
            return Ok(plan.clone());
        }
    }
    let plan: Plan = decode(key, value)?;
    let mut plans = PLANS.lock().expect("plan cache poisoned");
    if plans.len() >= PLANS_KEPT {
        plans.remove(0);
    }
    plans.push((key.to_string(), vec![value.clone()], plan.clone()));
    Ok(plan)
}

/// The typed keys of one run on a store. Cheap to clone.
#[derive(Clone)]
pub struct RunState {
    store: Arc<dyn Store>,
    keys: RunKeys,
}

impl RunState {
    /// The keys of run `run_id` on `store`.
    pub fn new(store: Arc<dyn Store>, run_id: &str) -> Self {
        Self {
            store,
            keys: RunKeys::new(run_id),
        }
    }

    /// The run's key layout.
    pub fn keys(&self) -> &RunKeys {
        &self.keys
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.store.get(key).await
    }

    async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.get(key).await?.is_some())
    }

    /// The key suffixes under `prefix`, in key order.
    async fn names(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .store
            .get_prefix(prefix)
            .await?
            .iter()
            .map(|kv| kv.key[prefix.len()..].to_string())
            .collect())
    }

    /// One transaction of `ops` guarded by `compares`; whether the guards held.
    async fn txn(&self, compares: Vec<Compare>, success: Vec<Op>) -> Result<bool, StoreError> {
        let r = self
            .store
            .txn(Txn {
                compares,
                success,
                failure: vec![],
            })
            .await?;
        Ok(r.succeeded)
    }

    /// Every change under `prefix` from now on (a key of this run; see [`RunKeys`]). The channel
    /// closes when the watch breaks.
    pub async fn watch(
        &self,
        prefix: &str,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.store.watch_prefix(prefix, 0).await
    }

    /// Every change under each of `prefixes` (keys of this run) from now on, in one channel;
    /// `None` when one of the watches broke ([`Store::watch_prefixes`]).
    pub async fn watch_all(
        &self,
        prefixes: &[String],
    ) -> Result<mpsc::UnboundedReceiver<Option<WatchEvent>>, StoreError> {
        self.store.watch_prefixes(prefixes).await
    }

    /// Whether the run has ended (`finished` exists; not decoded).
    pub async fn has_finished(&self) -> Result<bool, StoreError> {
        self.exists(&self.keys.finished()).await
    }

    /// The round decider's latest progress line (`gen/current.progress`), if any.
    pub async fn progress(&self) -> Result<Option<String>, StoreError> {
        Ok(self
            .get(&self.keys.progress())
            .await?
            .map(|kv| kv.value_str()))
    }

    /// The `(mod_revision, create_revision)` of `node`'s join (`waiting/<node>`), if it waits.
    pub async fn join_revisions(&self, node: &str) -> Result<Option<(i64, i64)>, StoreError> {
        Ok(self
            .get(&self.keys.waiting(node))
            .await?
            .map(|kv| (kv.mod_revision, kv.create_revision)))
    }

    /// The joins waiting for the next generation, oldest first (by creation), each with the
    /// `mod_revision` of its key.
    pub async fn waiting(&self) -> Result<Vec<(Join, i64)>, StoreError> {
        let mut kvs = self.store.get_prefix(&self.keys.waiting_prefix()).await?;
        kvs.sort_by_key(|kv| kv.create_revision);
        kvs.iter()
            .map(|kv| Ok((decode(&kv.key, &kv.value)?, kv.mod_revision)))
            .collect()
    }

    /// The node ids waiting for the next generation, in key order (not decoded).
    pub async fn waiting_nodes(&self) -> Result<Vec<String>, StoreError> {
        self.names(&self.keys.waiting_prefix()).await
    }

    /// The waiting joins as JSON, in key order, those that do not parse left out (`status`
    /// shows what it can of a store written by another drun).
    pub async fn waiting_json(&self) -> Result<Vec<serde_json::Value>, StoreError> {
        Ok(self
            .store
            .get_prefix(&self.keys.waiting_prefix())
            .await?
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect())
    }

    /// Node ids whose membership key of generation `g` exists (their lease holds and they
    /// have not joined again).
    pub async fn live_members(&self, g: u64) -> Result<Vec<String>, StoreError> {
        self.names(&self.keys.members_prefix(g)).await
    }

    /// The lease on `node`'s membership key of generation `g` (`None`: no such key). Under a
    /// server's shared leases this is the carrier's id, not the agent's (`shared_lease.rs`).
    pub async fn member_lease(&self, g: u64, node: &str) -> Result<Option<LeaseId>, StoreError> {
        Ok(self
            .get(&self.keys.member(g, node))
            .await?
            .and_then(|kv| kv.lease))
    }

    /// Whether `node`'s membership key of generation `g` exists.
    pub async fn is_member(&self, g: u64, node: &str) -> Result<bool, StoreError> {
        self.exists(&self.keys.member(g, node)).await
    }

    /// The nodes that recorded their success in generation `g` (`done/<g>/<node>`).
    pub async fn done_nodes(&self, g: u64) -> Result<Vec<String>, StoreError> {
        self.names(&self.keys.done_prefix(g)).await
    }

    /// Every `lost/<node>` record: node → why it was dropped.
    pub async fn lost_all(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let prefix = format!("{}lost/", self.keys.prefix());
        Ok(self
            .store
            .get_prefix(&prefix)
            .await?
            .iter()
            .map(|kv| (kv.key[prefix.len()..].to_string(), kv.value_str()))
            .collect())
    }

    /// The round decider's key (`gen/current.leader`): the deciding node's id, if any.
    pub async fn leader(&self) -> Result<Option<bytes::Bytes>, StoreError> {
        Ok(self.get(&self.keys.leader()).await?.map(|kv| kv.value))
    }

    /// `ckpt/latest` (the newest sealed manifest's id) and the `mod_revision` of its key.
    pub async fn ckpt_latest(&self) -> Result<Option<(String, i64)>, StoreError> {
        Ok(self
            .get(&self.keys.ckpt_latest())
            .await?
            .map(|kv| (kv.value_str(), kv.mod_revision)))
    }

    /// The raw value of generation `g`'s preemption save request (`gen/<g>/preempt`, or
    /// `gen/<g>/scale-up-save` when `scale_up`): decoded leniently by the session, as the same
    /// value arriving through its watch.
    pub async fn save_request(
        &self,
        g: u64,
        scale_up: bool,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        let key = if scale_up {
            self.keys.scale_up_save(g)
        } else {
            self.keys.preempt(g)
        };
        Ok(self.get(&key).await?.map(|kv| kv.value))
    }

    /// The raw value of generation `g`'s interval save request made after manifest `latest`
    /// (`gen/<g>/save-due/<latest>`), as [`Self::save_request`].
    pub async fn interval_save_request(
        &self,
        g: u64,
        latest: &str,
    ) -> Result<Option<bytes::Bytes>, StoreError> {
        Ok(self
            .get(&self.keys.save_due(g, latest))
            .await?
            .map(|kv| kv.value))
    }

    /// Whether the session with `token` still speaks for `node`'s lease `lease`: no session
    /// resumed the lease after it (`sessions/<node>/<lease>` absent, or its own token).
    pub async fn speaks_for(
        &self,
        node: &str,
        lease: LeaseId,
        token: &str,
    ) -> Result<bool, StoreError> {
        Ok(self
            .get(&self.keys.session_owner(node, lease))
            .await?
            .is_none_or(|kv| kv.value == token.as_bytes()))
    }

    /// A failed round's verdict (`gen/current.failed`) and the `mod_revision` of its key.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when it does not decode; the store's.
    pub async fn round_failure(&self) -> Result<Option<(RoundFailure, i64)>, StoreError> {
        let key = self.keys.round_failed();
        self.get(&key)
            .await?
            .map(|kv| Ok((decode(&key, &kv.value)?, kv.mod_revision)))
            .transpose()
    }

    /// A failed round's verdict as JSON, `None` when it does not parse (`status` shows what it
    /// can of a store written by another drun).
    pub async fn round_failure_json(&self) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(self
            .get(&self.keys.round_failed())
            .await?
            .and_then(|kv| serde_json::from_slice(&kv.value).ok()))
    }

    /// [`Self::round_failure`], a record that does not decode read as `None` beside its
    /// revision (a verdict being replaced keeps nothing of an unreadable one).
    pub async fn round_failure_lenient(
        &self,
    ) -> Result<Option<(Option<RoundFailure>, i64)>, StoreError> {
        Ok(self
            .get(&self.keys.round_failed())
            .await?
            .map(|kv| (serde_json::from_slice(&kv.value).ok(), kv.mod_revision)))
    }

    /// Current generation (0 before the first formation) and the `mod_revision` of its key.
    pub async fn current_generation(&self) -> Result<(u64, i64), StoreError> {
        let key = self.keys.gen_current();
        match self.get(&key).await? {
            None => Ok((0, 0)),
            Some(kv) => Ok((decode_generation(&key, &kv.value)?, kv.mod_revision)),
        }
    }

    /// The plan of generation `g`, if written. Decoded once per process: the thousand sessions
    /// of a server that read the same plan share one decoded copy ([`decode_plan`]).
    pub async fn plan(&self, g: u64) -> Result<Option<Plan>, StoreError> {
        let key = self.keys.plan(g);
        self.get(&key)
            .await?
            .map(|kv| decode_plan(&key, &kv.value))
            .transpose()
    }

    /// When generation `g` formed ([`Formation`]); `None` before it did, or
    /// when an older drun formed it.
    pub async fn formation(&self, g: u64) -> Result<Option<Formation>, StoreError> {
        let key = self.keys.formation(g);
        self.get(&key)
            .await?
            .map(|kv| decode(&key, &kv.value))
            .transpose()
    }

    /// Restart counters and the `mod_revision` of their key (0: never written).
    pub async fn restarts(&self) -> Result<(Restarts, i64), StoreError> {
        let key = self.keys.restarts();
        match self.get(&key).await? {
            None => Ok((Restarts::default(), 0)),
            Some(kv) => Ok((decode(&key, &kv.value)?, kv.mod_revision)),
        }
    }

    /// How the run ended, if it did.
    pub async fn finished(&self) -> Result<Option<RunEnd>, StoreError> {
        let key = self.keys.finished();
        self.get(&key)
            .await?
            .map(|kv| decode(&key, &kv.value))
            .transpose()
    }

    /// The run's recorded root causes, one per generation a worker failure ended, oldest first.
    pub async fn root_causes(&self) -> Result<Vec<RootCause>, StoreError> {
        let mut all = self
            .store
            .get_prefix(&self.keys.root_cause_prefix())
            .await?
            .iter()
            .map(|kv| decode::<RootCause>(&kv.key, &kv.value))
            .collect::<Result<Vec<_>, _>>()?;
        all.sort_by_key(|c| c.generation);
        Ok(all)
    }

    /// The job-wide failure history, oldest first (keys `failure/<g>`).
    pub async fn failures(&self) -> Result<Vec<FailureRecord>, StoreError> {
        self.store
            .get_prefix(&self.keys.failures_prefix())
            .await?
            .iter()
            .map(|kv| decode(&kv.key, &kv.value))
            .collect()
    }

    /// The checkpoint interval in force (`ckpt/interval`), if `--ckpt-interval` set one.
    pub async fn ckpt_interval(&self) -> Result<Option<Interval>, StoreError> {
        let key = self.keys.ckpt_interval();
        self.get(&key)
            .await?
            .map(|kv| decode(&key, &kv.value))
            .transpose()
    }

    /// Why generation `g` must re-form, if it must.
    pub async fn closed(&self, g: u64) -> Result<Option<String>, StoreError> {
        Ok(self
            .get(&self.keys.closed(g))
            .await?
            .map(|kv| kv.value_str()))
    }

    /// Why `node` was dropped ([`loss::LEASE_EXPIRED`] when nobody said).
    pub async fn lost(&self, node: &str) -> Result<String, StoreError> {
        Ok(self
            .get(&self.keys.lost(node))
            .await?
            .map_or_else(|| loss::LEASE_EXPIRED.to_string(), |kv| kv.value_str()))
    }

    /// Ends the run as `end` unless it has ended already (one transaction on `finished`, as
    /// the session's own verdicts write it); true if this call ended it. Every session of the
    /// run sees the end through its watch and reports it to its agent.
    ///
    /// # Errors
    /// The store's.
    pub async fn end(&self, end: &RunEnd) -> Result<bool, StoreError> {
        let key = self.keys.finished();
        let r = self
            .store
            .txn(Txn {
                compares: vec![Compare::Missing(key.clone())],
                success: vec![Op::put(key, encode(end))],
                failure: vec![],
            })
            .await?;
        Ok(r.succeeded)
    }
}

pub mod ledger;
mod reports;
pub mod round;
pub mod session;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[tokio::test]
    async fn a_run_ends_once_and_the_first_end_stays() {
        let state = RunState::new(Arc::new(MemoryStore::new()), "r");
        let end = |reason: &str| RunEnd {
            success: false,
            reason: reason.into(),
            at_ms: 1,
            root_cause: None,
            retryable: true,
            unfit: false,
        };
        assert!(state.end(&end("the host stopped")).await.unwrap());
        assert!(!state.end(&end("later")).await.unwrap());
        assert_eq!(
            state.finished().await.unwrap(),
            Some(end("the host stopped"))
        );
    }

    #[tokio::test]
    async fn a_corrupt_generation_is_an_error_not_zero() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let state = RunState::new(store.clone(), "r");
        assert_eq!(state.current_generation().await.unwrap().0, 0);
        let key = RunKeys::new("r").gen_current();
        store.put(&key, encode_generation(7), None).await.unwrap();
        assert_eq!(state.current_generation().await.unwrap().0, 7);
        store.put(&key, b"seven".to_vec(), None).await.unwrap();
        assert!(matches!(
            state.current_generation().await,
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_plan_read_twice_is_decoded_once_and_either_buffer_finds_it() {
        use crate::{assign, Candidate};
        let c: Vec<Candidate> = ["a", "b"]
            .iter()
            .map(|id| Candidate {
                node_id: id.to_string(),
                advertise_addr: id.to_string(),
                slots: 1,
                requested_node_rank: None,
                master_port: 1,
                probe_port: 0,
            })
            .collect();
        // A key of its own: the cache is process-wide and other tests decode plans too.
        let key = RunKeys::new("decode-once").plan(1);
        let bytes = encode(&assign("decode-once", 1, &c, 0, 0).unwrap());
        let (first, second) = (
            bytes::Bytes::from(bytes.clone()),
            bytes::Bytes::from(bytes.clone()),
        );
        assert_ne!(first.as_ptr(), second.as_ptr(), "two reads, two buffers");
        let a = decode_plan(&key, &first).unwrap();
        let b = decode_plan(&key, &second).unwrap();
        let again = decode_plan(&key, &first).unwrap();
        assert_eq!(a, b);
        // One decoded member list shared by all three (a decode would allocate its own).
        assert_eq!(a.members.as_ptr(), b.members.as_ptr());
        assert_eq!(a.members.as_ptr(), again.members.as_ptr());
        let mut other = bytes;
        other.extend_from_slice(b" ");
        let c = decode_plan(&key, &bytes::Bytes::from(other)).unwrap();
        assert_ne!(
            a.members.as_ptr(),
            c.members.as_ptr(),
            "other bytes are decoded anew"
        );
    }

    #[tokio::test]
    async fn corrupt_records_are_errors() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let state = RunState::new(store.clone(), "r");
        let keys = RunKeys::new("r");
        assert_eq!(state.restarts().await.unwrap(), (Restarts::default(), 0));
        assert_eq!(state.lost("n").await.unwrap(), loss::LEASE_EXPIRED);
        for key in [keys.restarts(), keys.finished(), keys.plan(1)] {
            store.put(&key, b"{".to_vec(), None).await.unwrap();
        }
        assert!(state.restarts().await.is_err());
        assert!(state.finished().await.is_err());
        assert!(state.plan(1).await.is_err());
    }

    /// A session speaks for the lease it was granted until another session resumes that
    /// lease; a claim on another lease of the same node (an agent restarted with a fresh
    /// lease) takes nothing from it.
    #[tokio::test]
    async fn only_a_session_that_resumed_the_lease_takes_it_over() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let state = RunState::new(store.clone(), "r");
        let ttl = std::time::Duration::from_secs(10);
        let (first, second) = (
            store.lease_grant(ttl).await.unwrap(),
            store.lease_grant(ttl).await.unwrap(),
        );
        assert!(state.speaks_for("n", first, "granted").await.unwrap());
        state.claim("n", "restarted", second).await.unwrap();
        assert!(state.speaks_for("n", first, "granted").await.unwrap());
        state.claim("n", "resumed", first).await.unwrap();
        assert!(!state.speaks_for("n", first, "granted").await.unwrap());
        assert!(state.speaks_for("n", first, "resumed").await.unwrap());
        store.lease_revoke(first).await.unwrap();
        assert!(
            state.speaks_for("n", first, "granted").await.unwrap(),
            "a lease that ended has no one else speaking for it"
        );
    }
}
