//! `MemoryStore`: the embedded, in-process [`Store`] (the default for one machine).
//!
//! It keeps etcd's semantics (see [`crate::store`]) in a mutex: a global revision, leases that
//! expire on a deadline, atomic transactions and prefix watches with a bounded replay history.
//! Lease expiry is checked on every call and by a background task (every 100 ms) when created
//! inside a tokio runtime. State is lost with the process: it is a product feature for
//! single-machine runs and the embedded server, not a stand-in for etcd's durability.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::store::{Compare, KeyValue, LeaseId, Op, Store, Txn, TxnResponse, WatchEvent};
use crate::StoreError;

/// Events kept for watches that start from a past revision.
const HISTORY_LIMIT: usize = 10_000;

/// How often the expiry task runs.
const TICK: Duration = Duration::from_millis(100);

/// A gap this long between two runs of the expiry task means the store itself did not run (its
/// process was stopped — Ctrl-Z on the agent that embeds it — or starved): nobody could renew a
/// lease meanwhile, so that time does not count against the leases.
const PAUSE_GAP: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
    /// The keys attached to this lease, so that revoking it touches only them (not every key
    /// of every run the store holds).
    keys: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct State {
    revision: i64,
    next_lease: LeaseId,
    kv: BTreeMap<String, KeyValue>,
    leases: HashMap<LeaseId, Lease>,
    /// The last [`HISTORY_LIMIT`] events, oldest first (a ring: dropping the oldest is O(1)).
    history: VecDeque<(i64, WatchEvent)>,
    watchers: Vec<(String, mpsc::UnboundedSender<WatchEvent>)>,
    /// When the expiry task last ran (None without one: outside a tokio runtime).
    last_tick: Option<Instant>,
}

impl State {
    fn emit(&mut self, event: WatchEvent) {
        let key = match &event {
            WatchEvent::Put(kv) => kv.key.clone(),
            WatchEvent::Delete(k, _) => k.clone(),
        };
        // A watcher whose receiver is gone (its session ended) is dropped here even when the
        // event is not under its prefix: a finished run's watchers must not pile up.
        self.watchers.retain(|(prefix, tx)| {
            !tx.is_closed() && (!key.starts_with(prefix.as_str()) || tx.send(event.clone()).is_ok())
        });
        self.history.push_back((self.revision, event));
        while self.history.len() > HISTORY_LIMIT {
            self.history.pop_front();
        }
    }

    fn delete_key(&mut self, key: &str) {
        if let Some(kv) = self.kv.remove(key) {
            self.detach(kv.lease, key);
            self.emit(WatchEvent::Delete(key.to_string(), self.revision));
        }
    }

    /// Takes `key` off the key set of `lease`.
    fn detach(&mut self, lease: Option<LeaseId>, key: &str) {
        if let Some(l) = lease.and_then(|id| self.leases.get_mut(&id)) {
            l.keys.remove(key);
        }
    }

    /// The expiry task's run at `now`: a gap of [`PAUSE_GAP`] or more since its last run (the
    /// store was not running) moves every lease's deadline on by the gap; then expires.
    fn tick(&mut self, now: Instant) {
        if let Some(last) = self.last_tick {
            let gap = now.saturating_duration_since(last);
            if gap >= PAUSE_GAP {
                for l in self.leases.values_mut() {
                    l.deadline += gap - TICK;
                }
            }
        }
        self.last_tick = Some(now);
        self.expire(now);
    }

    /// Drops expired leases and their keys; one revision for all of them.
    fn expire(&mut self, now: Instant) {
        let dead: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.revoke(id);
        }
    }

    fn revoke(&mut self, id: LeaseId) {
        let Some(lease) = self.leases.remove(&id) else {
            return;
        };
        let keys = lease.keys;
        if keys.is_empty() {
            return;
        }
        self.revision += 1;
        for k in keys {
            self.delete_key(&k);
        }
    }

    fn holds(&self, c: &Compare) -> bool {
        match c {
            Compare::ValueEquals(k, v) => self.kv.get(k).is_some_and(|kv| kv.value == v),
            Compare::ModRevisionEquals(k, rev) => {
                self.kv.get(k).map_or(0, |kv| kv.mod_revision) == *rev
            }
            Compare::Exists(k) => self.kv.contains_key(k),
            Compare::Missing(k) => !self.kv.contains_key(k),
        }
    }

    fn apply(&mut self, op: Op) -> Result<(), StoreError> {
        match op {
            Op::Put { key, value, lease } => {
                if let Some(id) = lease {
                    if !self.leases.contains_key(&id) {
                        return Err(StoreError::LeaseLost(id));
                    }
                }
                // A put replaces the key's lease, as etcd's does (none: detached from any).
                let old = self.kv.get(&key).map(|kv| (kv.lease, kv.create_revision));
                let create_revision = match old {
                    Some((old_lease, created)) => {
                        self.detach(old_lease, &key);
                        created
                    }
                    None => self.revision,
                };
                if let Some(l) = lease.and_then(|id| self.leases.get_mut(&id)) {
                    l.keys.insert(key.clone());
                }
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.into(),
                    create_revision,
                    mod_revision: self.revision,
                    lease,
                };
                self.kv.insert(key, kv.clone());
                self.emit(WatchEvent::Put(kv));
            }
            Op::Delete(key) => self.delete_key(&key),
            Op::DeletePrefix(prefix) => {
                let keys: Vec<String> = self
                    .kv
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(prefix.as_str()))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in keys {
                    self.delete_key(&k);
                }
            }
        }
        Ok(())
    }
}

/// The in-process store. Cheap to clone (shared state).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl MemoryStore {
    /// A new empty store at revision 0. Inside a tokio runtime it also starts the lease-expiry
    /// task, which ends when the last clone is dropped.
    pub fn new() -> Self {
        let store = Self::default();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let weak: Weak<Mutex<State>> = Arc::downgrade(&store.state);
            handle.spawn(async move {
                let mut tick = tokio::time::interval(TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(state) = weak.upgrade() else { return };
                    state
                        .lock()
                        .expect("memory store mutex poisoned")
                        .tick(Instant::now());
                }
            });
        }
        store
    }

    /// The state, after a run of the expiry task's pause check and expiry (an operation that
    /// comes first after a pause sees the leases moved on, not expired).
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.lock_raw();
        let now = Instant::now();
        if st.last_tick.is_some() {
            st.tick(now);
        } else {
            st.expire(now);
        }
        st
    }

    fn lock_raw(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("memory store mutex poisoned")
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn name(&self) -> String {
        "memory".to_string()
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        Ok(self.lock().kv.get(key).cloned())
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        let st = self.lock();
        Ok(st
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect())
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        let mut st = self.lock();
        let succeeded = txn.compares.iter().all(|c| st.holds(c));
        let ops = if succeeded { txn.success } else { txn.failure };
        // Validate leases first so a failing put leaves nothing half-applied (etcd is atomic too).
        for op in &ops {
            if let Op::Put {
                lease: Some(id), ..
            } = op
            {
                if !st.leases.contains_key(id) {
                    return Err(StoreError::LeaseLost(*id));
                }
            }
        }
        if !ops.is_empty() {
            st.revision += 1;
            for op in ops {
                st.apply(op)?;
            }
        }
        Ok(TxnResponse {
            succeeded,
            revision: st.revision,
        })
    }

    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let ttl = Duration::from_secs(ttl.as_secs_f64().ceil().max(1.0) as u64);
        let mut st = self.lock();
        st.next_lease += 1;
        let id = 0x6472_0000 + st.next_lease;
        st.leases.insert(
            id,
            Lease {
                ttl,
                deadline: Instant::now() + ttl,
                keys: BTreeSet::new(),
            },
        );
        Ok(id)
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        let mut st = self.lock();
        let l = st
            .leases
            .get_mut(&lease)
            .ok_or(StoreError::LeaseLost(lease))?;
        l.deadline = Instant::now() + l.ttl;
        Ok(l.ttl)
    }

    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.lock().revoke(lease);
        Ok(())
    }

    async fn watch_prefix(
        &self,
        prefix: &str,
        after: i64,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.lock();
        if after > 0 {
            for (_, ev) in st.history.iter().filter(|(rev, _)| *rev > after) {
                let key = match ev {
                    WatchEvent::Put(kv) => &kv.key,
                    WatchEvent::Delete(k, _) => k,
                };
                if key.starts_with(prefix) {
                    let _ = tx.send(ev.clone());
                }
            }
        }
        st.watchers.push((prefix.to_string(), tx));
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn revisions_and_txn_compares_follow_etcd() {
        let s = MemoryStore::new();
        let r1 = s.put("/a", b"1".to_vec(), None).await.unwrap();
        let r2 = s.put("/a", b"2".to_vec(), None).await.unwrap();
        assert_eq!((r1, r2), (1, 2));
        let kv = s.get("/a").await.unwrap().unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision), (1, 2));

        let lost = s
            .txn(Txn {
                compares: vec![Compare::ModRevisionEquals("/a".into(), 1)],
                success: vec![Op::put("/a", "3")],
                failure: vec![Op::put("/b", "x")],
            })
            .await
            .unwrap();
        assert!(!lost.succeeded);
        assert_eq!(&s.get("/a").await.unwrap().unwrap().value[..], b"2");
        assert_eq!(&s.get("/b").await.unwrap().unwrap().value[..], b"x");

        let won = s
            .txn(Txn {
                compares: vec![Compare::ModRevisionEquals("/missing".into(), 0)],
                success: vec![Op::DeletePrefix("/".into())],
                failure: vec![],
            })
            .await
            .unwrap();
        assert!(won.succeeded);
        assert!(s.get_prefix("/").await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn lease_expiry_deletes_keys_and_notifies_watchers() {
        let s = MemoryStore::new();
        let lease = s.lease_grant(Duration::from_millis(1500)).await.unwrap();
        s.put("/run/waiting/n1", b"{}".to_vec(), Some(lease))
            .await
            .unwrap();
        let mut w = s.watch_prefix("/run/", 0).await.unwrap();

        tokio::time::advance(Duration::from_millis(1900)).await;
        assert_eq!(
            s.lease_keep_alive(lease).await.unwrap(),
            Duration::from_secs(2)
        );
        tokio::time::advance(Duration::from_millis(1900)).await;
        assert!(
            s.get("/run/waiting/n1").await.unwrap().is_some(),
            "kept alive"
        );

        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(
            s.get("/run/waiting/n1").await.unwrap().is_none(),
            "expired after TTL"
        );
        assert!(matches!(
            s.lease_keep_alive(lease).await,
            Err(StoreError::LeaseLost(id)) if id == lease
        ));
        match w.recv().await.unwrap() {
            WatchEvent::Delete(k, _) => assert_eq!(k, "/run/waiting/n1"),
            other => panic!("expected delete, got {other:?}"),
        }
        let err = s.put("/x", vec![], Some(lease)).await.unwrap_err();
        assert!(matches!(err, StoreError::LeaseLost(_)));
    }

    #[tokio::test]
    async fn watch_replays_history_after_revision() {
        let s = MemoryStore::new();
        let r = s.put("/p/1", b"a".to_vec(), None).await.unwrap();
        s.put("/p/2", b"b".to_vec(), None).await.unwrap();
        s.put("/q/3", b"c".to_vec(), None).await.unwrap();
        let mut w = s.watch_prefix("/p/", r).await.unwrap();
        match w.recv().await.unwrap() {
            WatchEvent::Put(kv) => assert_eq!(kv.key, "/p/2"),
            other => panic!("unexpected {other:?}"),
        }
        s.lease_revoke(12345).await.unwrap();
        s.put("/p/4", b"d".to_vec(), None).await.unwrap();
        match w.recv().await.unwrap() {
            WatchEvent::Put(kv) => assert_eq!(kv.key, "/p/4"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoke_deletes_exactly_the_keys_its_lease_holds_now() {
        let s = MemoryStore::new();
        let a = s.lease_grant(Duration::from_secs(10)).await.unwrap();
        let b = s.lease_grant(Duration::from_secs(10)).await.unwrap();
        for k in ["/k1", "/k2", "/k3", "/k4"] {
            s.put(k, b"a".to_vec(), Some(a)).await.unwrap();
        }
        // As in etcd, a put sets the key's lease anew: moved to `b`, or detached from any.
        s.put("/k2", b"b".to_vec(), Some(b)).await.unwrap();
        s.put("/k3", b"none".to_vec(), None).await.unwrap();
        s.txn(Txn {
            compares: vec![],
            success: vec![Op::Delete("/k4".into())],
            failure: vec![],
        })
        .await
        .unwrap();
        s.put("/k4", b"none".to_vec(), None).await.unwrap();
        s.lease_revoke(a).await.unwrap();
        let keys = |kvs: Vec<KeyValue>| kvs.into_iter().map(|kv| kv.key).collect::<Vec<_>>();
        assert_eq!(
            keys(s.get_prefix("/k").await.unwrap()),
            ["/k2", "/k3", "/k4"]
        );
        s.lease_revoke(b).await.unwrap();
        assert_eq!(keys(s.get_prefix("/k").await.unwrap()), ["/k3", "/k4"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchers_of_ended_sessions_do_not_pile_up() {
        let s = MemoryStore::new();
        let mut live = s.watch_prefix("/live/", 0).await.unwrap();
        for run in 0..100 {
            drop(s.watch_prefix(&format!("/run-{run}/"), 0).await.unwrap());
        }
        assert_eq!(s.lock_raw().watchers.len(), 101);
        // An event under no ended watcher's prefix still clears them all.
        s.put("/live/x", b"1".to_vec(), None).await.unwrap();
        assert_eq!(s.lock_raw().watchers.len(), 1);
        match live.recv().await.unwrap() {
            WatchEvent::Put(kv) => assert_eq!(kv.key, "/live/x"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_store_itself_did_not_run_does_not_count_against_leases() {
        let s = MemoryStore::new();
        let lease = s.lease_grant(Duration::from_secs(3)).await.unwrap();
        s.put("/run/members/1/n", b"{}".to_vec(), Some(lease))
            .await
            .unwrap();
        // Let the expiry task run once, then the whole process stops for 20 s (Ctrl-Z on the
        // agent that embeds the store): no tick, no keep-alive, time goes on.
        tokio::time::sleep(Duration::from_millis(150)).await;
        tokio::time::advance(Duration::from_secs(20)).await;
        assert!(
            s.get("/run/members/1/n").await.unwrap().is_some(),
            "not expired by the pause"
        );
        // Running again, the lease expires as usual without keep-alives.
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            s.get("/run/members/1/n").await.unwrap().is_none(),
            "expired after its TTL"
        );
    }
}
