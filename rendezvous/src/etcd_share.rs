//! Sharing one etcd among the many sessions of one process (a `drun-rendezvous` server).
//!
//! A server holds one session per agent, and at a formation every session of a run watches the
//! same prefixes and reads the same keys at the same moment: a thousand agents made a thousand
//! etcd watches on `gen/current` and a thousand reads of the same plan. Here
//! * identical prefix watches share one etcd watch ([`Watches`]): each caller gets its own
//!   channel, fed by one task that forwards every event to every live subscriber. A caller that
//!   subscribes to a running watch sees the events after it subscribed — what a new etcd watch
//!   "from now" gives — plus possibly a few just before (callers re-read state on events, so a
//!   duplicate costs nothing). When the etcd watch breaks every subscriber's channel closes, as
//!   a dedicated watch's would, and the callers subscribe again.
//! * identical reads are batched ([`Reads`]): a read of a key that arrives while another read of
//!   it is in flight waits for the next one, which starts after it arrived — never an older one,
//!   so every caller still sees a value at least as new as the moment it asked.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::store::{KeyValue, WatchEvent};
use crate::StoreError;

/// How often a shared watch without events looks for subscribers that went away.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// The result of one read of a key.
pub type Read = Result<Option<KeyValue>, StoreError>;

/// Reads in flight, by key: the callers waiting for the next read of that key.
#[derive(Default)]
pub struct Reads {
    queued: Mutex<HashMap<String, Vec<oneshot::Sender<Read>>>>,
}

impl Reads {
    /// Reads `key` with `read`, sharing the read with the other callers that queued meanwhile.
    /// The reads run in a task of their own, so a caller that gives up cancels nothing.
    ///
    /// # Errors
    /// The read's [`StoreError`], shared by every caller of that read.
    pub async fn get<F, Fut>(self: &Arc<Self>, key: &str, read: F) -> Read
    where
        F: Fn(String) -> Fut + Send + 'static,
        Fut: Future<Output = Read> + Send,
    {
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut q = self.queued.lock().expect("reads mutex poisoned");
            match q.get_mut(key) {
                Some(waiting) => {
                    waiting.push(tx);
                    false
                }
                None => {
                    q.insert(key.to_string(), vec![tx]);
                    true
                }
            }
        };
        if first {
            let this = self.clone();
            let key = key.to_string();
            tokio::spawn(async move {
                // One read per batch; a batch is whoever queued before the read started.
                while let Some(batch) = this.take(&key) {
                    let value = read(key.clone()).await;
                    for w in batch {
                        let _ = w.send(value.clone());
                    }
                }
            });
        }
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable {
                endpoint: "etcd".into(),
                reason: "the shared read was dropped".into(),
            })
        })
    }

    /// The callers queued for `key`, or None (and the key forgotten) when there are none.
    fn take(&self, key: &str) -> Option<Vec<oneshot::Sender<Read>>> {
        let mut q = self.queued.lock().expect("reads mutex poisoned");
        let waiting = q.get_mut(key)?;
        if waiting.is_empty() {
            q.remove(key);
            return None;
        }
        Some(std::mem::take(waiting))
    }
}

/// The subscribers of one shared watch; `closed` once its task ended or is ending.
#[derive(Default)]
struct Subscribers {
    closed: bool,
    txs: Vec<mpsc::UnboundedSender<WatchEvent>>,
}

/// Shared prefix watches, by prefix.
#[derive(Default)]
pub struct Watches {
    hubs: tokio::sync::Mutex<HashMap<String, Arc<Mutex<Subscribers>>>>,
}

impl Watches {
    /// A channel of the events under `prefix` from now on: a subscription to the running watch
    /// of that prefix, or a new one made with `open` (an etcd watch from now).
    ///
    /// # Errors
    /// `open`'s [`StoreError`].
    pub async fn watch<F, Fut>(
        self: &Arc<Self>,
        prefix: &str,
        open: F,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError>>,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(subs) = self.hubs.lock().await.get(prefix) {
            let mut s = subs.lock().expect("subscribers mutex poisoned");
            if !s.closed {
                s.txs.push(tx);
                return Ok(rx);
            }
        }
        // Not under the map's lock: watches of other prefixes open meanwhile.
        let upstream = open().await?;
        let mut hubs = self.hubs.lock().await;
        if let Some(subs) = hubs.get(prefix) {
            let mut s = subs.lock().expect("subscribers mutex poisoned");
            if !s.closed {
                // Another caller opened it first: share theirs, drop ours.
                s.txs.push(tx);
                return Ok(rx);
            }
        }
        let subs = Arc::new(Mutex::new(Subscribers {
            closed: false,
            txs: vec![tx],
        }));
        hubs.insert(prefix.to_string(), subs.clone());
        drop(hubs);
        tokio::spawn(self.clone().forward(prefix.to_string(), upstream, subs));
        Ok(rx)
    }

    /// Forwards the etcd watch's events to every live subscriber until the watch breaks or no
    /// subscriber is left; then closes the hub (the subscribers' channels end).
    async fn forward(
        self: Arc<Self>,
        prefix: String,
        mut upstream: mpsc::UnboundedReceiver<WatchEvent>,
        subs: Arc<Mutex<Subscribers>>,
    ) {
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        prune.tick().await;
        loop {
            tokio::select! {
                ev = upstream.recv() => {
                    let mut s = subs.lock().expect("subscribers mutex poisoned");
                    match ev {
                        Some(ev) => s.txs.retain(|t| t.send(ev.clone()).is_ok()),
                        // The etcd watch broke: every subscriber's channel ends.
                        None => s.txs.clear(),
                    }
                    if s.txs.is_empty() {
                        s.closed = true;
                        break;
                    }
                }
                _ = prune.tick() => {
                    let mut s = subs.lock().expect("subscribers mutex poisoned");
                    s.txs.retain(|t| !t.is_closed());
                    if s.txs.is_empty() {
                        s.closed = true;
                        break;
                    }
                }
            }
        }
        let mut hubs = self.hubs.lock().await;
        if hubs.get(&prefix).is_some_and(|h| Arc::ptr_eq(h, &subs)) {
            hubs.remove(&prefix);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Notify;

    fn kv(v: &str) -> KeyValue {
        KeyValue {
            key: "k".into(),
            value: v.as_bytes().to_vec(),
            create_revision: 1,
            mod_revision: 1,
            lease: None,
        }
    }

    /// Polls `cond` (yielding to the tasks under test) until it holds; fails after 5 s.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::task::yield_now().await;
        }
    }

    /// A read that counts its calls, waits for `go` and answers "read <n>".
    fn counting(
        calls: Arc<AtomicUsize>,
        go: Arc<Notify>,
    ) -> impl Fn(String) -> std::pin::Pin<Box<dyn Future<Output = Read> + Send>> + Send + 'static
    {
        move |_key| {
            let calls = calls.clone();
            let go = go.clone();
            Box::pin(async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                go.notified().await;
                Ok(Some(kv(&format!("read {n}"))))
            })
        }
    }

    #[tokio::test]
    async fn callers_that_queue_during_a_read_share_the_next_one_not_the_older_one() {
        let reads = Arc::new(Reads::default());
        let (calls, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        let first = tokio::spawn({
            let (r, f) = (reads.clone(), counting(calls.clone(), go.clone()));
            async move { r.get("k", f).await }
        });
        until("the first read started", || {
            calls.load(Ordering::SeqCst) > 0
        })
        .await;
        let later: Vec<_> = (0..5)
            .map(|_| {
                let (r, f) = (reads.clone(), counting(calls.clone(), go.clone()));
                tokio::spawn(async move { r.get("k", f).await })
            })
            .collect();
        go.notify_one();
        let v = first.await.unwrap().unwrap().unwrap();
        assert_eq!(v.value, b"read 1");
        until("the second read started", || {
            calls.load(Ordering::SeqCst) >= 2
        })
        .await;
        go.notify_one();
        for h in later {
            assert_eq!(h.await.unwrap().unwrap().unwrap().value, b"read 2");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_read_error_reaches_every_caller_of_that_read_and_the_key_is_forgotten() {
        let reads = Arc::new(Reads::default());
        let failing = |_key: String| async {
            Err(StoreError::Unavailable {
                endpoint: "e".into(),
                reason: "down".into(),
            })
        };
        assert!(reads.get("k", failing).await.is_err());
        assert!(reads.queued.lock().unwrap().is_empty());
        let ok = |_key: String| async { Ok(None) };
        assert_eq!(reads.get("k", ok).await.unwrap(), None);
    }

    #[tokio::test]
    async fn identical_watches_share_one_upstream_and_each_gets_every_event() {
        let watches = Arc::new(Watches::default());
        let opened = Arc::new(AtomicUsize::new(0));
        let (up_tx, up_rx) = mpsc::unbounded_channel();
        let mut up_rx = Some(up_rx);
        let mut a = watches
            .watch("p/", || {
                opened.fetch_add(1, Ordering::SeqCst);
                let rx = up_rx.take().unwrap();
                async move { Ok(rx) }
            })
            .await
            .unwrap();
        let mut b = watches
            .watch("p/", || async {
                unreachable!("the running watch is shared")
            })
            .await
            .unwrap();
        up_tx.send(WatchEvent::Put(kv("x"))).unwrap();
        assert!(matches!(a.recv().await, Some(WatchEvent::Put(_))));
        assert!(matches!(b.recv().await, Some(WatchEvent::Put(_))));
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        // The etcd watch breaks: every subscriber's channel ends, as a dedicated one's would.
        drop(up_tx);
        assert!(a.recv().await.is_none());
        assert!(b.recv().await.is_none());
    }

    #[tokio::test]
    async fn once_every_subscriber_left_the_next_watch_opens_a_new_upstream() {
        let watches = Arc::new(Watches::default());
        let (up_tx, up_rx) = mpsc::unbounded_channel();
        let a = watches.watch("p/", || async { Ok(up_rx) }).await.unwrap();
        drop(a);
        // The next event finds no subscriber: the hub closes.
        up_tx.send(WatchEvent::Put(kv("x"))).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while watches.hubs.lock().await.contains_key("p/") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hub never closed"
            );
            tokio::task::yield_now().await;
        }
        let (up2_tx, up2_rx) = mpsc::unbounded_channel();
        let mut c = watches.watch("p/", || async { Ok(up2_rx) }).await.unwrap();
        up2_tx.send(WatchEvent::Put(kv("y"))).unwrap();
        assert!(matches!(c.recv().await, Some(WatchEvent::Put(_))));
    }
}
