//! A server-side session's claim of its node (`sessions/<node>`): written with its first join,
//! in the same transaction, not in a write of its own before it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::test_support::{config, join, next};
use super::*;
use crate::store::keys::RunKeys;
use crate::store::run_state::RunState;
use crate::store::{KeyValue, LeaseId, Op, Txn, TxnResponse, WatchEvent};
use crate::{MemoryStore, StoreError};

/// A memory store that records the keys each transaction puts.
#[derive(Default)]
struct Recording {
    inner: MemoryStore,
    puts: Mutex<Vec<Vec<String>>>,
}

#[async_trait]
impl Store for Recording {
    fn name(&self) -> String {
        "recording".into()
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.inner.get(key).await
    }
    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.get_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        let keys = txn
            .success
            .iter()
            .filter_map(|op| match op {
                Op::Put { key, .. } => Some(key.clone()),
                _ => None,
            })
            .collect();
        self.puts.lock().unwrap().push(keys);
        self.inner.txn(txn).await
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

#[tokio::test]
async fn a_server_side_session_claims_its_node_with_its_first_join() {
    let store = Arc::new(Recording::default());
    let cfg = SessionConfig {
        auto_keep_alive: false,
        ..config("claim", "a", 1, 1)
    };
    let (tx, mut rx) = spawn_server_session(store.clone(), cfg, None, None);
    tx.send(Request::Join(join("a", 1), 0)).unwrap();
    let mut seen = Vec::new();
    let formed = next(&mut rx, &mut seen, |e| {
        matches!(e, Event::Formed(_)).then_some(())
    });
    assert!(formed.await.is_some(), "no plan; heard {seen:?}");
    let keys = RunKeys::new("claim");
    let (claim, waiting) = (keys.session_owner("a"), keys.waiting("a"));
    let puts = store.puts.lock().unwrap().clone();
    let with_claim: Vec<_> = puts.iter().filter(|t| t.contains(&claim)).collect();
    assert_eq!(with_claim.len(), 1, "claimed once: {puts:?}");
    assert!(with_claim[0].contains(&waiting), "with the join: {puts:?}");
}

#[tokio::test]
async fn no_claim_yet_leaves_a_session_speaking_for_its_node_and_another_claim_does_not() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let state = RunState::new(store.clone(), "claim");
    assert!(state.speaks_for("a", "mine", true).await.unwrap());
    assert!(!state.speaks_for("a", "mine", false).await.unwrap());
    let lease = store.lease_grant(Duration::from_secs(30)).await.unwrap();
    state.claim("a", "theirs", lease).await.unwrap();
    assert!(!state.speaks_for("a", "mine", true).await.unwrap());
    assert!(state.speaks_for("a", "theirs", false).await.unwrap());
}
