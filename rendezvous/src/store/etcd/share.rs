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

/// Where a subscriber's events go.
pub enum Sink {
    /// A channel of its own, which ends when the watch breaks.
    One(mpsc::UnboundedSender<WatchEvent>),
    /// A channel shared with the subscriber's other watches ([`crate::Store::watch_prefixes`]):
    /// `None` says that this watch broke.
    Merged(mpsc::UnboundedSender<Option<WatchEvent>>),
}

impl Sink {
    /// Sends `ev`; false when the subscriber went away.
    fn send(&self, ev: &WatchEvent) -> bool {
        match self {
            Sink::One(tx) => tx.send(ev.clone()).is_ok(),
            Sink::Merged(tx) => tx.send(Some(ev.clone())).is_ok(),
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sink::One(tx) => tx.is_closed(),
            Sink::Merged(tx) => tx.is_closed(),
        }
    }

    /// The watch broke: a channel of its own ends (dropped here), a merged one is told.
    fn broke(self) {
        if let Sink::Merged(tx) = self {
            let _ = tx.send(None);
        }
    }
}

/// The subscribers of one shared watch, by the prefix each asked for; `closed` once its task
/// ended or is ending.
#[derive(Default)]
struct Subscribers {
    closed: bool,
    by_prefix: HashMap<String, Vec<Sink>>,
}

impl Subscribers {
    fn add(&mut self, prefix: &str, sink: Sink) {
        self.by_prefix
            .entry(prefix.to_string())
            .or_default()
            .push(sink);
    }

    /// The watch broke: every subscriber hears it.
    fn broke(&mut self) {
        for (_, sinks) in self.by_prefix.drain() {
            sinks.into_iter().for_each(Sink::broke);
        }
    }

    /// Sends `ev` to every subscriber whose prefix starts its key (the prefixes of the key
    /// at least as long as the hub's), dropping those that went away.
    fn deliver(&mut self, hub: &str, ev: &WatchEvent) {
        let key = match ev {
            WatchEvent::Put(kv) => kv.key.as_str(),
            WatchEvent::Delete(key, _) => key.as_str(),
        };
        for end in hub.len()..=key.len() {
            if !key.is_char_boundary(end) {
                continue;
            }
            let prefix = &key[..end];
            if let Some(txs) = self.by_prefix.get_mut(prefix) {
                txs.retain(|t| t.send(ev));
                // Only the prefixes this event reached: a pass over every prefix per event
                // was quadratic when 10,000 sessions each watch one membership key.
                if txs.is_empty() {
                    self.by_prefix.remove(prefix);
                }
            }
        }
    }

    fn prune(&mut self) {
        self.by_prefix.retain(|_, txs| {
            txs.retain(|t| !t.is_closed());
            !txs.is_empty()
        });
    }
}

/// The hub a watch of `prefix` shares: its "directory", up to and including the last `/`
/// (`/drun/v1/r/members/1/node-a` → `/drun/v1/r/members/1/`). So the one-key watches of a
/// thousand sessions (each its successor's membership key) are one etcd watch.
pub fn hub_of(prefix: &str) -> &str {
    prefix.rfind('/').map_or(prefix, |i| &prefix[..=i])
}

/// Shared prefix watches, by hub ([`hub_of`]).
#[derive(Default)]
pub struct Watches {
    hubs: tokio::sync::Mutex<HashMap<String, Arc<Mutex<Subscribers>>>>,
}

impl Watches {
    /// A channel of the events under `prefix` from now on: a subscription to the running watch
    /// of its hub, or a new one made with `open(hub)` (an etcd watch of the hub from now),
    /// forwarding only the events under `prefix`.
    ///
    /// # Errors
    /// `open`'s [`StoreError`].
    pub async fn watch<F, Fut>(
        self: &Arc<Self>,
        prefix: &str,
        open: F,
    ) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError>>,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        self.watch_into(prefix, Sink::One(tx), open).await?;
        Ok(rx)
    }

    /// [`Self::watch`] into `sink`.
    ///
    /// # Errors
    /// `open`'s [`StoreError`].
    pub async fn watch_into<F, Fut>(
        self: &Arc<Self>,
        prefix: &str,
        sink: Sink,
        open: F,
    ) -> Result<(), StoreError>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError>>,
    {
        let hub = hub_of(prefix);
        if let Some(subs) = self.hubs.lock().await.get(hub) {
            let mut s = subs.lock().expect("subscribers mutex poisoned");
            if !s.closed {
                s.add(prefix, sink);
                return Ok(());
            }
        }
        // Not under the map's lock: watches of other hubs open meanwhile.
        let upstream = open(hub.to_string()).await?;
        let mut hubs = self.hubs.lock().await;
        if let Some(subs) = hubs.get(hub) {
            let mut s = subs.lock().expect("subscribers mutex poisoned");
            if !s.closed {
                // Another caller opened it first: share theirs, drop ours.
                s.add(prefix, sink);
                return Ok(());
            }
        }
        let mut first = Subscribers::default();
        first.add(prefix, sink);
        let subs = Arc::new(Mutex::new(first));
        hubs.insert(hub.to_string(), subs.clone());
        drop(hubs);
        tokio::spawn(self.clone().forward(hub.to_string(), upstream, subs));
        Ok(())
    }

    /// Forwards the etcd watch's events to the live subscribers they concern until the watch
    /// breaks or no subscriber is left; then closes the hub (the subscribers' channels end).
    async fn forward(
        self: Arc<Self>,
        hub: String,
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
                        Some(ev) => s.deliver(&hub, &ev),
                        // The etcd watch broke: every subscriber's channel ends (a merged
                        // one is told).
                        None => s.broke(),
                    }
                    if s.by_prefix.is_empty() {
                        s.closed = true;
                        break;
                    }
                }
                _ = prune.tick() => {
                    let mut s = subs.lock().expect("subscribers mutex poisoned");
                    s.prune();
                    if s.by_prefix.is_empty() {
                        s.closed = true;
                        break;
                    }
                }
            }
        }
        let mut hubs = self.hubs.lock().await;
        if hubs.get(&hub).is_some_and(|h| Arc::ptr_eq(h, &subs)) {
            hubs.remove(&hub);
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
            key: format!("p/{v}"),
            value: v.as_bytes().to_vec().into(),
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
        assert_eq!(&v.value[..], b"read 1");
        until("the second read started", || {
            calls.load(Ordering::SeqCst) >= 2
        })
        .await;
        go.notify_one();
        for h in later {
            assert_eq!(&h.await.unwrap().unwrap().unwrap().value[..], b"read 2");
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
            .watch("p/", |_| {
                opened.fetch_add(1, Ordering::SeqCst);
                let rx = up_rx.take().unwrap();
                async move { Ok(rx) }
            })
            .await
            .unwrap();
        let mut b = watches
            .watch("p/", |_| async {
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
        let a = watches.watch("p/", |_| async { Ok(up_rx) }).await.unwrap();
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
        let mut c = watches.watch("p/", |_| async { Ok(up2_rx) }).await.unwrap();
        up2_tx.send(WatchEvent::Put(kv("y"))).unwrap();
        assert!(matches!(c.recv().await, Some(WatchEvent::Put(_))));
    }
}

#[cfg(test)]
mod merged_tests {
    use super::*;

    fn put(key: &str) -> WatchEvent {
        WatchEvent::Put(KeyValue {
            key: key.into(),
            value: bytes::Bytes::new(),
            create_revision: 1,
            mod_revision: 1,
            lease: None,
        })
    }

    fn key(ev: &WatchEvent) -> &str {
        match ev {
            WatchEvent::Put(kv) => &kv.key,
            WatchEvent::Delete(k, _) => k,
        }
    }

    #[tokio::test]
    async fn merged_watches_of_two_hubs_feed_one_channel_and_a_broken_one_says_so_once() {
        let watches = Arc::new(Watches::default());
        let (gen_tx, gen_rx) = mpsc::unbounded_channel();
        let (mem_tx, mem_rx) = mpsc::unbounded_channel();
        let (tx, mut rx) = mpsc::unbounded_channel();
        watches
            .watch_into("/r/gen/2/", Sink::Merged(tx.clone()), |hub| {
                assert_eq!(hub, "/r/gen/2/");
                async { Ok(gen_rx) }
            })
            .await
            .unwrap();
        watches
            .watch_into("/r/members/2/b", Sink::Merged(tx.clone()), |hub| {
                assert_eq!(hub, "/r/members/2/");
                async { Ok(mem_rx) }
            })
            .await
            .unwrap();
        // Another session's own channel on the same hub is not disturbed.
        let mut other = watches
            .watch("/r/members/2/c", |_| async {
                unreachable!("the running watch is shared")
            })
            .await
            .unwrap();
        drop(tx);
        mem_tx.send(put("/r/members/2/a")).unwrap();
        mem_tx.send(put("/r/members/2/b")).unwrap();
        gen_tx.send(put("/r/gen/2/closed")).unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            seen.push(key(&rx.recv().await.unwrap().unwrap()).to_string());
        }
        seen.sort();
        assert_eq!(seen, ["/r/gen/2/closed", "/r/members/2/b"]);
        // The membership watch breaks: the merged channel hears it once and stays open for
        // the generation's watch; a subscriber of its own sees its channel end.
        drop(mem_tx);
        assert_eq!(rx.recv().await, Some(None));
        assert!(other.recv().await.is_none());
        gen_tx.send(put("/r/gen/2/preempt")).unwrap();
        assert_eq!(key(&rx.recv().await.unwrap().unwrap()), "/r/gen/2/preempt");
        drop(gen_tx);
        assert_eq!(rx.recv().await, Some(None));
        // Every watch of the session is gone: its channel ends.
        assert_eq!(rx.recv().await, None);
    }
}

#[cfg(test)]
mod hub_tests {
    use super::*;

    fn put(key: &str) -> WatchEvent {
        WatchEvent::Put(KeyValue {
            key: key.into(),
            value: bytes::Bytes::new(),
            create_revision: 1,
            mod_revision: 1,
            lease: None,
        })
    }

    #[test]
    fn a_watch_shares_the_hub_of_its_directory() {
        assert_eq!(hub_of("/r/members/1/node-a"), "/r/members/1/");
        assert_eq!(hub_of("/r/waiting/"), "/r/waiting/");
        assert_eq!(hub_of("/r/gen/current"), "/r/gen/");
        assert_eq!(hub_of("no-slash"), "no-slash");
    }

    #[tokio::test]
    async fn one_upstream_serves_many_keys_and_each_subscriber_gets_only_its_own() {
        let watches = Arc::new(Watches::default());
        let (up_tx, up_rx) = mpsc::unbounded_channel();
        let mut up_rx = Some(up_rx);
        let mut open = |hub: String| {
            assert_eq!(hub, "/r/m/");
            let rx = up_rx.take().expect("one upstream for the hub");
            async move { Ok(rx) }
        };
        let mut a = watches.watch("/r/m/a", &mut open).await.unwrap();
        let mut ab = watches.watch("/r/m/ab", &mut open).await.unwrap();
        let mut all = watches.watch("/r/m/", &mut open).await.unwrap();
        up_tx.send(put("/r/m/ab")).unwrap();
        up_tx.send(WatchEvent::Delete("/r/m/a".into(), 2)).unwrap();
        up_tx.send(put("/r/m/c")).unwrap();
        drop(up_tx);
        let drain = |rx: &mut mpsc::UnboundedReceiver<WatchEvent>| {
            let mut keys = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                keys.push(match ev {
                    WatchEvent::Put(kv) => kv.key,
                    WatchEvent::Delete(k, _) => k,
                });
            }
            keys
        };
        // Wait until the forwarder ended (the upstream closed): every channel then ends.
        assert!(all.recv().await.is_some());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while watches.hubs.lock().await.contains_key("/r/m/") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hub never closed"
            );
            tokio::task::yield_now().await;
        }
        // A prefix watch of "/r/m/a" also sees "/r/m/ab", as etcd's would.
        assert_eq!(drain(&mut a), vec!["/r/m/ab", "/r/m/a"]);
        assert_eq!(drain(&mut ab), vec!["/r/m/ab"]);
        assert_eq!(drain(&mut all), vec!["/r/m/a", "/r/m/c"]);
    }
}
