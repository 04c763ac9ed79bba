//! Combining the small etcd requests of many sessions into one transaction.
//!
//! At a formation every session of a server writes its join, then its membership key, and
//! reads a few keys of its own: a thousand agents made some five thousand one-key etcd
//! requests, each a Raft proposal (writes) or a ReadIndex round (reads) of its own. A
//! [`Batcher`] queues them and sends whatever queued while the previous batch was in flight as
//! **one** etcd transaction (etcd `Txn` with no compares: every op applies, in order, at one
//! revision). A lone request goes out at once, so the latency of a quiet server is unchanged.
//!
//! Only requests that commute may share a transaction ([`Admit`]): unconditional writes to
//! distinct keys (etcd refuses a transaction that writes one key twice) or reads; conditional
//! transactions never come here. A batch holds at most [`MAX_OPS`] ops — etcd's default
//! `--max-txn-ops` is 128 — and about [`MAX_BYTES`] of values (etcd's request limit is 1.5 MiB).
//! Each caller still sees a result as new as the moment it asked: a batch is sent after every
//! request in it was queued.
//!
//! Up to [`IN_FLIGHT`] batches are in flight at once: etcd commits proposals that arrive
//! together in one Raft round (one fsync), so a burst of 10,000 rejoins costs a quarter of the
//! sequential round trips it cost with one batch at a time. A request never goes out while a
//! batch in flight touches one of its keys ([`Admit::keys`]), so writes of one key keep their
//! order.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The most ops in one combined transaction (etcd's default `--max-txn-ops`).
pub const MAX_OPS: usize = 128;

/// The most value bytes in one combined transaction (etcd refuses requests over 1.5 MiB).
pub const MAX_BYTES: usize = 512 * 1024;

/// The most batches of one queue in flight at once.
pub const IN_FLIGHT: usize = 4;

/// What a batch of requests may hold together.
pub trait Admit {
    /// The ops this request adds to a transaction.
    fn ops(&self) -> usize;
    /// The value bytes it adds.
    fn bytes(&self) -> usize;
    /// Whether it may share a transaction with `batch` (e.g. no key written twice).
    fn fits_with(&self, batch: &[Self]) -> bool
    where
        Self: Sized;
    /// The keys it must not overtake another request on (the keys it writes; none for a read).
    fn keys(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Takes the longest prefix of `queue` that fits in one transaction: at least one request (a
/// single request too big is sent alone; etcd then answers for it), then requests in arrival
/// order while they fit — stopping at the first that does not, so no request overtakes another.
/// Nothing is taken from the first request on that touches a key of `busy` (the keys of the
/// batches in flight).
pub fn take_batch<Q: Admit>(queue: &mut VecDeque<Q>, busy: &HashSet<String>) -> Vec<Q> {
    let mut batch: Vec<Q> = Vec::new();
    let (mut ops, mut bytes) = (0, 0);
    while let Some(next) = queue.front() {
        let fits = (batch.is_empty()
            || (ops + next.ops() <= MAX_OPS
                && bytes + next.bytes() <= MAX_BYTES
                && next.fits_with(&batch)))
            && (busy.is_empty() || next.keys().iter().all(|k| !busy.contains(k)));
        if !fits {
            break;
        }
        ops += next.ops();
        bytes += next.bytes();
        batch.extend(queue.pop_front());
    }
    batch
}

/// Requests waiting for the next batch, how many pumps send batches, and the keys of the
/// batches in flight (each key with the number of batches in flight that touch it).
struct Queue<Q, R> {
    waiting: VecDeque<(Q, oneshot::Sender<R>)>,
    pumps: usize,
    busy: HashMap<String, usize>,
}

/// One queue of combinable requests `Q` answered with `R`, up to [`IN_FLIGHT`] batches in
/// flight at a time.
pub struct Batcher<Q, R> {
    queue: Mutex<Queue<Q, R>>,
}

impl<Q, R> Default for Batcher<Q, R> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                pumps: 0,
                busy: HashMap::new(),
            }),
        }
    }
}

impl<Q, R> Batcher<Q, R>
where
    Q: Admit + Send + 'static,
    R: Send + 'static,
{
    /// Queues `req` and waits for its answer. When fewer than [`IN_FLIGHT`] batches are being
    /// sent this call starts a pump, which sends batches with `send` (one answer per request,
    /// in order) until the queue is empty or what is left waits on a batch in flight; it runs
    /// in a task of its own, so a caller that gives up cancels nothing. `None` when the pump
    /// lost the request (`send` answered too few).
    pub async fn call<F, Fut>(self: &Arc<Self>, req: Q, send: F) -> Option<R>
    where
        F: Fn(Vec<Q>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send,
    {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.queue.lock().expect("batch queue poisoned");
            q.waiting.push_back((req, tx));
        }
        self.start_pump(Arc::new(send));
        rx.await.ok()
    }

    /// Starts a pump unless [`IN_FLIGHT`] run already.
    fn start_pump<F, Fut>(self: &Arc<Self>, send: Arc<F>)
    where
        F: Fn(Vec<Q>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send,
    {
        {
            let mut q = self.queue.lock().expect("batch queue poisoned");
            if q.pumps >= IN_FLIGHT || q.waiting.is_empty() {
                return;
            }
            q.pumps += 1;
        }
        let this = self.clone();
        tokio::spawn(async move {
            while let Some((reqs, txs, keys)) = this.next_batch() {
                // Another pump may take what queued meanwhile.
                this.start_pump(send.clone());
                let answers = send(reqs).await;
                for (tx, answer) in txs.into_iter().zip(answers) {
                    let _ = tx.send(answer);
                }
                this.landed(keys);
            }
        });
    }

    /// The next batch, its reply channels and its keys (now busy), or None (and this pump
    /// gone) when nothing can go: the queue is empty, or its head waits on a batch in flight
    /// (whose pump takes it once it landed).
    #[allow(clippy::type_complexity)]
    fn next_batch(&self) -> Option<(Vec<Q>, Vec<oneshot::Sender<R>>, Vec<String>)> {
        let mut q = self.queue.lock().expect("batch queue poisoned");
        let busy: HashSet<String> = q.busy.keys().cloned().collect();
        let (mut reqs, mut txs): (VecDeque<Q>, Vec<_>) = q.waiting.drain(..).unzip();
        let batch = take_batch(&mut reqs, &busy);
        // Put back what did not go, with its reply channels, at the front in order.
        let rest = txs.split_off(batch.len());
        for pair in reqs.into_iter().zip(rest).rev() {
            q.waiting.push_front(pair);
        }
        if batch.is_empty() {
            q.pumps -= 1;
            return None;
        }
        let keys: Vec<String> = batch.iter().flat_map(Admit::keys).collect();
        for k in &keys {
            *q.busy.entry(k.clone()).or_default() += 1;
        }
        Some((batch, txs, keys))
    }

    /// A batch of `keys` was answered: its keys are free again.
    fn landed(&self, keys: Vec<String>) {
        let mut q = self.queue.lock().expect("batch queue poisoned");
        for k in keys {
            if let Some(n) = q.busy.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    q.busy.remove(&k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Semaphore;

    /// A write of `key` with `ops` ops and `bytes` bytes.
    #[derive(Debug, Clone, PartialEq)]
    struct W(&'static str, usize, usize);

    impl Admit for W {
        fn ops(&self) -> usize {
            self.1
        }
        fn bytes(&self) -> usize {
            self.2
        }
        fn fits_with(&self, batch: &[Self]) -> bool {
            batch.iter().all(|w| w.0 != self.0)
        }
        fn keys(&self) -> Vec<String> {
            vec![self.0.to_string()]
        }
    }

    fn none() -> HashSet<String> {
        HashSet::new()
    }

    #[test]
    fn a_batch_stops_at_the_first_request_that_does_not_fit() {
        let mut q: VecDeque<W> = [W("a", 1, 1), W("b", 1, 1), W("a", 1, 1), W("c", 1, 1)].into();
        assert_eq!(take_batch(&mut q, &none()), vec![W("a", 1, 1), W("b", 1, 1)]);
        // "c" would fit but must not overtake the second write of "a".
        assert_eq!(q.len(), 2);
        assert_eq!(take_batch(&mut q, &none()), vec![W("a", 1, 1), W("c", 1, 1)]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_batch_keeps_to_the_op_and_byte_limits_but_always_takes_one() {
        let mut q: VecDeque<W> = (0..200).map(|_| W("", 1, 1)).collect();
        q.iter_mut().enumerate().for_each(|(i, w)| {
            w.0 = Box::leak(i.to_string().into_boxed_str());
        });
        assert_eq!(take_batch(&mut q, &none()).len(), MAX_OPS);
        let mut q: VecDeque<W> = [W("a", 1, MAX_BYTES), W("b", 1, 1)].into();
        assert_eq!(take_batch(&mut q, &none()).len(), 1);
        let mut q: VecDeque<W> = [W("big", MAX_OPS + 5, 1)].into();
        assert_eq!(take_batch(&mut q, &none()).len(), 1, "too big alone still goes");
    }

    #[test]
    fn nothing_overtakes_a_request_whose_key_is_in_flight() {
        let busy: HashSet<String> = ["b".to_string()].into();
        let mut q: VecDeque<W> = [W("a", 1, 1), W("b", 1, 1), W("c", 1, 1)].into();
        assert_eq!(take_batch(&mut q, &busy), vec![W("a", 1, 1)]);
        assert!(take_batch(&mut q, &busy).is_empty(), "b waits, and c behind it");
        assert_eq!(q.len(), 2);
    }

    /// A send that counts its batches; the first `gated` wait for a permit each.
    fn gated_send(
        sends: Arc<AtomicUsize>,
        gate: Arc<Semaphore>,
        gated: usize,
    ) -> impl Fn(Vec<W>) -> std::pin::Pin<Box<dyn Future<Output = Vec<usize>> + Send>>
           + Clone
           + Send
           + Sync
           + 'static {
        move |reqs: Vec<W>| {
            let (sends, gate) = (sends.clone(), gate.clone());
            Box::pin(async move {
                if sends.fetch_add(1, Ordering::SeqCst) < gated {
                    gate.acquire().await.unwrap().forget();
                }
                (0..reqs.len()).map(|i| i * 10 + reqs.len()).collect()
            })
        }
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn batches_go_in_parallel_up_to_the_limit_then_requests_share_the_next_one() {
        let batcher: Arc<Batcher<W, usize>> = Arc::default();
        let sends = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let send = gated_send(sends.clone(), gate.clone(), IN_FLIGHT);
        const KEYS: [&str; 7] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6"];
        let call = |k: &'static str| {
            let (b, s) = (batcher.clone(), send.clone());
            tokio::spawn(async move { b.call(W(k, 1, 1), s).await })
        };
        // IN_FLIGHT lone requests go out at once, each in a batch of its own.
        let first: Vec<_> = KEYS[..IN_FLIGHT].iter().map(|k| call(k)).collect();
        until("every pump busy", || sends.load(Ordering::SeqCst) == IN_FLIGHT).await;
        // Three more queue behind them.
        let later: Vec<_> = KEYS[IN_FLIGHT..].iter().map(|k| call(k)).collect();
        until("requests queued", || {
            batcher.queue.lock().unwrap().waiting.len() == KEYS.len() - IN_FLIGHT
        })
        .await;
        gate.add_permits(IN_FLIGHT);
        for h in first {
            assert_eq!(h.await.unwrap(), Some(1), "alone in its batch");
        }
        let mut answers = Vec::new();
        for h in later {
            answers.push(h.await.unwrap().unwrap());
        }
        // One batch of three, answered in order.
        assert_eq!(answers, vec![3, 13, 23]);
        assert_eq!(sends.load(Ordering::SeqCst), IN_FLIGHT + 1);
        let q = batcher.queue.lock().unwrap();
        assert_eq!(q.pumps, 0, "every pump went idle");
        assert!(q.busy.is_empty(), "no key left busy");
    }

    #[tokio::test]
    async fn a_write_of_a_key_in_flight_waits_for_that_batch() {
        let batcher: Arc<Batcher<W, usize>> = Arc::default();
        let sends = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let send = gated_send(sends.clone(), gate.clone(), 1);
        let call = |k: &'static str| {
            let (b, s) = (batcher.clone(), send.clone());
            tokio::spawn(async move { b.call(W(k, 1, 1), s).await })
        };
        let a1 = call("a");
        until("the first write in flight", || sends.load(Ordering::SeqCst) == 1).await;
        let a2 = call("a");
        until("the second queued", || batcher.queue.lock().unwrap().waiting.len() == 1).await;
        // Another pump could go, but the only request waits on the key in flight.
        tokio::task::yield_now().await;
        assert_eq!(sends.load(Ordering::SeqCst), 1, "the second write did not overtake");
        gate.add_permits(1);
        assert_eq!(a1.await.unwrap(), Some(1));
        assert_eq!(a2.await.unwrap(), Some(1));
        assert_eq!(sends.load(Ordering::SeqCst), 2);
    }
}
