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

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The most ops in one combined transaction (etcd's default `--max-txn-ops`).
pub const MAX_OPS: usize = 128;

/// The most value bytes in one combined transaction (etcd refuses requests over 1.5 MiB).
pub const MAX_BYTES: usize = 512 * 1024;

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
}

/// Takes the longest prefix of `queue` that fits in one transaction: at least one request (a
/// single request too big is sent alone; etcd then answers for it), then requests in arrival
/// order while they fit — stopping at the first that does not, so no request overtakes another.
pub fn take_batch<Q: Admit>(queue: &mut VecDeque<Q>) -> Vec<Q> {
    let mut batch: Vec<Q> = Vec::new();
    let (mut ops, mut bytes) = (0, 0);
    while let Some(next) = queue.front() {
        let fits = batch.is_empty()
            || (ops + next.ops() <= MAX_OPS
                && bytes + next.bytes() <= MAX_BYTES
                && next.fits_with(&batch));
        if !fits {
            break;
        }
        ops += next.ops();
        bytes += next.bytes();
        batch.extend(queue.pop_front());
    }
    batch
}

/// Requests waiting for the next batch, and whether a batch is in flight.
struct Queue<Q, R> {
    waiting: VecDeque<(Q, oneshot::Sender<R>)>,
    busy: bool,
}

/// One queue of combinable requests `Q` answered with `R`, one batch in flight at a time.
pub struct Batcher<Q, R> {
    queue: Mutex<Queue<Q, R>>,
}

impl<Q, R> Default for Batcher<Q, R> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                busy: false,
            }),
        }
    }
}

impl<Q, R> Batcher<Q, R>
where
    Q: Admit + Send + 'static,
    R: Send + 'static,
{
    /// Queues `req` and waits for its answer. When no batch is in flight this call starts the
    /// pump, which sends batches with `send` (one answer per request, in order) until the queue
    /// is empty; it runs in a task of its own, so a caller that gives up cancels nothing.
    /// `None` when the pump lost the request (`send` answered too few).
    pub async fn call<F, Fut>(self: &Arc<Self>, req: Q, send: F) -> Option<R>
    where
        F: Fn(Vec<Q>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<R>> + Send,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock().expect("batch queue poisoned");
            q.waiting.push_back((req, tx));
            !std::mem::replace(&mut q.busy, true)
        };
        if start {
            let this = self.clone();
            tokio::spawn(async move {
                while let Some((reqs, txs)) = this.next_batch() {
                    let answers = send(reqs).await;
                    for (tx, answer) in txs.into_iter().zip(answers) {
                        let _ = tx.send(answer);
                    }
                }
            });
        }
        rx.await.ok()
    }

    /// The next batch and its reply channels, or None (and the pump marked idle) when the
    /// queue is empty.
    #[allow(clippy::type_complexity)]
    fn next_batch(&self) -> Option<(Vec<Q>, Vec<oneshot::Sender<R>>)> {
        let mut q = self.queue.lock().expect("batch queue poisoned");
        if q.waiting.is_empty() {
            q.busy = false;
            return None;
        }
        let (mut reqs, mut txs): (VecDeque<Q>, Vec<_>) = q.waiting.drain(..).unzip();
        let batch = take_batch(&mut reqs);
        // Put back what did not fit, with its reply channels, at the front in order.
        let rest = txs.split_off(batch.len());
        for pair in reqs.into_iter().zip(rest).rev() {
            q.waiting.push_front(pair);
        }
        Some((batch, txs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Notify;

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
    }

    #[test]
    fn a_batch_stops_at_the_first_request_that_does_not_fit() {
        let mut q: VecDeque<W> = [W("a", 1, 1), W("b", 1, 1), W("a", 1, 1), W("c", 1, 1)].into();
        assert_eq!(take_batch(&mut q), vec![W("a", 1, 1), W("b", 1, 1)]);
        // "c" would fit but must not overtake the second write of "a".
        assert_eq!(q.len(), 2);
        assert_eq!(take_batch(&mut q), vec![W("a", 1, 1), W("c", 1, 1)]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_batch_keeps_to_the_op_and_byte_limits_but_always_takes_one() {
        let mut q: VecDeque<W> = (0..200).map(|_| W("", 1, 1)).collect();
        q.iter_mut().enumerate().for_each(|(i, w)| {
            w.0 = Box::leak(i.to_string().into_boxed_str());
        });
        assert_eq!(take_batch(&mut q).len(), MAX_OPS);
        let mut q: VecDeque<W> = [W("a", 1, MAX_BYTES), W("b", 1, 1)].into();
        assert_eq!(take_batch(&mut q).len(), 1);
        let mut q: VecDeque<W> = [W("big", MAX_OPS + 5, 1)].into();
        assert_eq!(take_batch(&mut q).len(), 1, "too big alone still goes");
    }

    #[tokio::test]
    async fn requests_queued_during_a_batch_share_the_next_one() {
        let batcher: Arc<Batcher<W, usize>> = Arc::default();
        let sends = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Notify::new());
        let send = {
            let (sends, gate) = (sends.clone(), gate.clone());
            move |reqs: Vec<W>| {
                let (sends, gate) = (sends.clone(), gate.clone());
                async move {
                    // The first batch waits for the gate; later ones answer at once.
                    if sends.fetch_add(1, Ordering::SeqCst) == 0 {
                        gate.notified().await;
                    }
                    (0..reqs.len()).map(|i| i * 10 + reqs.len()).collect()
                }
            }
        };
        let first = tokio::spawn({
            let (b, s) = (batcher.clone(), send.clone());
            async move { b.call(W("k0", 1, 1), s).await }
        });
        // Wait until the first batch is in flight, then queue three more behind it.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while sends.load(Ordering::SeqCst) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "first batch never sent"
            );
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = ["k1", "k2", "k3"]
            .into_iter()
            .map(|k| {
                let (b, s) = (batcher.clone(), send.clone());
                tokio::spawn(async move { b.call(W(k, 1, 1), s).await })
            })
            .collect();
        while batcher.queue.lock().unwrap().waiting.len() < 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "requests never queued"
            );
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(first.await.unwrap(), Some(1), "alone in its batch");
        let mut answers = Vec::new();
        for h in later {
            answers.push(h.await.unwrap().unwrap());
        }
        // One batch of three, answered in order.
        assert_eq!(answers, vec![3, 13, 23]);
        assert_eq!(sends.load(Ordering::SeqCst), 2);
        assert!(!batcher.queue.lock().unwrap().busy, "the pump went idle");
    }
}
