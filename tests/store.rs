//! The store under a `drun-rendezvous` server, on a real etcd: a watch that falls far behind
//! still delivers every event, and agent leases shared on one etcd lease expire one by one.

use std::sync::Arc;
use std::time::Duration;

use drun_rendezvous::store::shared_lease::SharedLeases;
use drun_rendezvous::{EtcdStore, Op, Store, Txn, WatchEvent};

use crate::harness::cluster::Etcd;

async fn etcd_store(etcd: &Etcd) -> Arc<dyn Store> {
    Arc::new(
        EtcdStore::connect(std::slice::from_ref(&etcd.endpoint))
            .await
            .expect("etcd reachable"),
    )
}

#[test]
fn a_watch_behind_by_more_than_4_mib_delivers_every_event() {
    // A watch started at an old revision gets the history in few large answers: 12 MiB here,
    // past etcd-client's default 4 MiB limit, which broke the watch of a 10,000-agent re-form.
    let etcd = Etcd::start();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let s = etcd_store(&etcd).await;
        let start = s.put("/burst/start", vec![], None).await.unwrap();
        let value = vec![b'x'; 10 * 1024];
        for t in 0..12 {
            let success = (0..100)
                .map(|i| Op::put(format!("/burst/k/{t}-{i}"), value.clone()))
                .collect();
            s.txn(Txn {
                compares: vec![],
                success,
                failure: vec![],
            })
            .await
            .unwrap();
        }
        let mut w = s.watch_prefix("/burst/k/", start).await.unwrap();
        let mut seen = 0;
        while seen < 1200 {
            match tokio::time::timeout(Duration::from_secs(20), w.recv()).await {
                Ok(Some(WatchEvent::Put(_))) => seen += 1,
                other => panic!("after {seen} of 1200 events: {other:?}"),
            }
        }
    });
}

#[test]
fn agent_leases_on_one_etcd_lease_expire_each_on_its_own_deadline() {
    let etcd = Etcd::start();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let inner = etcd_store(&etcd).await;
        let s: Arc<dyn Store> = Arc::new(SharedLeases::new(inner.clone()));
        let ttl = Duration::from_secs(2);
        let kept = s.lease_grant(ttl).await.unwrap();
        let idle = s.lease_grant(ttl).await.unwrap();
        s.put("/sl/kept", b"1".to_vec(), Some(kept)).await.unwrap();
        s.put("/sl/idle", b"1".to_vec(), Some(idle)).await.unwrap();
        let carrier = inner.get("/sl/kept").await.unwrap().unwrap().lease;
        assert_eq!(inner.get("/sl/idle").await.unwrap().unwrap().lease, carrier);
        let mut w = s.watch_prefix("/sl/", 0).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let gone = loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "idle lease never expired"
            );
            s.lease_keep_alive(kept).await.unwrap();
            match tokio::time::timeout(Duration::from_millis(300), w.recv()).await {
                Ok(Some(WatchEvent::Delete(k, _))) => break k,
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => {}
            }
        };
        assert_eq!(gone, "/sl/idle");
        assert!(inner.get("/sl/kept").await.unwrap().is_some());
        s.lease_revoke(kept).await.unwrap();
        assert!(inner.get("/sl/kept").await.unwrap().is_none());
    });
}
