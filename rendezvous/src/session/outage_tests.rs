//! A session whose store goes away for longer than the lease TTL fences within the TTL, even
//! while it is busy re-establishing its watch (the keeper's verdict is not left waiting).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};

use super::*;
use crate::store::{KeyValue, LeaseId, Txn, TxnResponse, WatchEvent};
use crate::{Candidate, MemoryStore, RoundConfig, StoreError};

/// A memory store that can go away: while down, every call hangs (a stopped etcd answers
/// nothing) and every open watch ends (its connection broke).
struct Outage {
    inner: MemoryStore,
    down: AtomicBool,
    broken: watch::Sender<bool>,
}

impl Outage {
    async fn gate(&self) {
        if self.down.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl Store for Outage {
    fn name(&self) -> String {
        "outage".into()
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.gate().await;
        self.inner.get(key).await
    }
    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        self.gate().await;
        self.inner.get_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        self.gate().await;
        self.inner.txn(txn).await
    }
    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.gate().await;
        self.inner.lease_grant(ttl).await
    }
    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, StoreError> {
        self.gate().await;
        self.inner.lease_keep_alive(lease).await
    }
    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.gate().await;
        self.inner.lease_revoke(lease).await
    }
    async fn watch_prefix(
        &self,
        prefix: &str,
        after: i64,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.gate().await;
        let mut upstream = self.inner.watch_prefix(prefix, after).await?;
        let mut broken = self.broken.subscribe();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = upstream.recv() => {
                        let Some(ev) = ev else { return };
                        if tx.send(ev).is_err() {
                            return;
                        }
                    }
                    _ = broken.changed() => return,
                }
            }
        });
        Ok(rx)
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_gone_for_a_whole_ttl_fences_even_while_the_watch_is_being_retried() {
    let store = Arc::new(Outage {
        inner: MemoryStore::new(),
        down: AtomicBool::new(false),
        broken: watch::channel(false).0,
    });
    let ttl = Duration::from_secs(3);
    let cfg = SessionConfig {
        run_id: "outage".into(),
        node_id: "a".into(),
        round: RoundConfig {
            min_nodes: 1,
            max_nodes: 1,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(60),
            settle: Duration::ZERO,
        },
        lease_ttl: ttl,
        keep_alive_interval: ttl / 3,
        max_restarts: 0,
        auto_keep_alive: true,
        scale_up_save: None,
        ckpt_interval: Default::default(),
    };
    let (tx, mut rx) = spawn_session(store.clone(), cfg, None);
    let cand = Candidate {
        node_id: "a".into(),
        advertise_addr: "127.0.0.1".into(),
        slots: 1,
        requested_node_rank: None,
        master_port: 1,
        probe_port: 0,
    };
    tx.send(Request::Join(cand.into(), 0)).unwrap();
    let formed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.recv().await {
                Some(Event::Formed(_)) => return,
                Some(Event::Error(e)) => panic!("{e}"),
                Some(_) => {}
                None => panic!("session ended"),
            }
        }
    });
    formed.await.expect("formed");
    // The store goes away: calls hang, the generation's watch breaks.
    store.down.store(true, Ordering::SeqCst);
    store.broken.send_replace(true);
    let t0 = tokio::time::Instant::now();
    let fenced = tokio::time::timeout(ttl + Duration::from_secs(2), async {
        loop {
            match rx.recv().await {
                Some(Event::Fenced(reason)) => return reason,
                Some(_) => {}
                None => panic!("session ended without a fence"),
            }
        }
    })
    .await
    .expect("fenced within the TTL (plus a keep-alive interval)");
    assert!(t0.elapsed() <= ttl + ttl / 3, "{:?}", t0.elapsed());
    assert!(fenced.contains("renew"), "{fenced}");
}
