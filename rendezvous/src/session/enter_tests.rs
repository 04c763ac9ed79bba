//! Entering a generation when the store fails once on the way: the agent hears its plan
//! exactly once, whether the failure came before it was told (the membership key's write) or
//! after (a read that checks what happened before the watch began).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::test_support::{config, join, next};
use super::*;
use crate::store::{KeyValue, LeaseId, Op, Txn, TxnResponse, WatchEvent};
use crate::{MemoryStore, StoreError};

/// A memory store that fails one call as a store that did not answer: the first write of a
/// membership key (`members`), or the first read of `finished` after one was written
/// (`finished`).
struct FailsOnce {
    inner: MemoryStore,
    members: AtomicBool,
    finished: AtomicBool,
    entered: AtomicBool,
}

impl FailsOnce {
    fn new(members: bool, finished: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            members: AtomicBool::new(members),
            finished: AtomicBool::new(finished),
            entered: AtomicBool::new(false),
        })
    }

    fn down() -> StoreError {
        StoreError::Unavailable {
            endpoint: "test".into(),
            reason: "no leader (the test's)".into(),
        }
    }
}

#[async_trait]
impl Store for FailsOnce {
    fn name(&self) -> String {
        "fails-once".into()
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        if key.ends_with("/finished")
            && self.entered.load(Ordering::SeqCst)
            && self.finished.swap(false, Ordering::SeqCst)
        {
            return Err(Self::down());
        }
        self.inner.get(key).await
    }
    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.get_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        let member = txn
            .success
            .iter()
            .any(|op| matches!(op, Op::Put { key, .. } if key.contains("/members/")));
        if member && self.members.swap(false, Ordering::SeqCst) {
            return Err(Self::down());
        }
        let r = self.inner.txn(txn).await;
        if member {
            self.entered.store(true, Ordering::SeqCst);
        }
        r
    }
    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.inner.lease_grant(ttl).await
    }
    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.inner.lease_keep_alive(lease).await
    }
    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.inner.lease_revoke(lease).await
    }
    async fn watch_prefix(
        &self,
        prefix: &str,
        after: i64,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.inner.watch_prefix(prefix, after).await
    }
}

/// Node `a` of a one-node run joins on `store`: the plans it was told (the first within 5 s,
/// then whatever else came within 5 s more), and what else it heard.
async fn told(store: Arc<FailsOnce>) -> (Vec<u64>, Vec<String>) {
    let (tx, mut rx) = spawn_session(store, config("enter", "a", 1, 1), None);
    tx.send(Request::Join(join("a", 1), 0)).unwrap();
    let mut seen = Vec::new();
    let mut plans = Vec::new();
    let formed = |e: &Event| match e {
        Event::Formed(p) => Some(p.generation),
        _ => None,
    };
    while let Some(g) = next(&mut rx, &mut seen, formed).await {
        plans.push(g);
    }
    (plans, seen)
}

#[tokio::test(start_paused = true)]
async fn a_membership_write_the_store_did_not_answer_still_tells_the_agent_its_plan() {
    let store = FailsOnce::new(true, false);
    let (plans, seen) = told(store.clone()).await;
    assert!(
        !store.members.load(Ordering::SeqCst),
        "the failure happened"
    );
    assert_eq!(plans, vec![1], "told once; heard instead: {seen:?}");
}

#[tokio::test(start_paused = true)]
async fn a_read_that_fails_after_the_agent_heard_its_plan_does_not_tell_it_twice() {
    let store = FailsOnce::new(false, true);
    let (plans, seen) = told(store.clone()).await;
    assert!(
        !store.finished.load(Ordering::SeqCst),
        "the failure happened"
    );
    assert_eq!(plans, vec![1], "told once; heard instead: {seen:?}");
}
