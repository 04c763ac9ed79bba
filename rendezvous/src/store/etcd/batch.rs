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
//! A batcher may keep more than one batch in flight ([`Batcher::with_in_flight`]): etcd then
//! commits them together (one Raft round and one disk sync for both), which is where a
//! formation of 10,000 agents spent its time with one batch at a time. Batches in flight
//! together never touch the same key ([`Admit::keys`]): a request that writes a key an
//! earlier batch still writes waits for it, and nothing behind it overtakes it, so the
//! writes of one key still land in the order they were asked.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The most ops in one combined transaction (etcd's default `--max-txn-ops`).
pub const MAX_OPS: usize = 128;

/// The most value bytes in one combined transaction (etcd refuses requests over 1.5 MiB).
pub const MAX_BYTES: usize = 512 * 1024;

/// Combined write transactions a server keeps in flight at once, unless
/// `DRUN_RDZV_WRITES_IN_FLIGHT` says otherwise. Two: etcd commits them together, and a
/// 10,000-agent formation made a third fewer etcd requests and formed 16-39 % sooner than with
/// one (`docs/contributing/benchmarks.md`, Scale). The plan a waiting session lost with 2
/// (`chaos_ci_seed_1_etcd_members`) was the session's: a first entry into a generation that a
/// timed-out write failed was retried without telling the agent (fixed in `session/step.rs`).
pub const WRITES_IN_FLIGHT: usize = 2;

/// [`WRITES_IN_FLIGHT`], or `DRUN_RDZV_WRITES_IN_FLIGHT` (a value that is not a number from 1 to
/// 16 is named in one warning and the default used).
pub fn writes_in_flight() -> usize {
    let value = std::env::var("DRUN_RDZV_WRITES_IN_FLIGHT").ok();
    parse_writes_in_flight(value.as_deref()).unwrap_or_else(|why| {
        tracing::warn!("{why}");
        WRITES_IN_FLIGHT
    })
}

/// A `DRUN_RDZV_WRITES_IN_FLIGHT` this server does not take: the line names the value, the
/// default used instead and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WritesInFlightError {
    /// Not a whole number.
    #[error("DRUN_RDZV_WRITES_IN_FLIGHT={value:?} is not a number from 1 to 16; using {WRITES_IN_FLIGHT} (unset it, or give e.g. 1 for one etcd write batch at a time)")]
    NotANumber {
        /// The value as given.
        value: String,
    },
    /// A number outside 1 to 16.
    #[error("DRUN_RDZV_WRITES_IN_FLIGHT={value:?} is not a number from 1 to 16; using {WRITES_IN_FLIGHT} (unset it, or give e.g. 1 for one etcd write batch at a time)")]
    OutOfRange {
        /// The value as given.
        value: String,
        /// The number it holds.
        count: usize,
    },
}

/// `DRUN_RDZV_WRITES_IN_FLIGHT`'s value (`None`: unset) as a count.
///
/// # Errors
/// A value that is not a number from 1 to 16.
pub fn parse_writes_in_flight(value: Option<&str>) -> Result<usize, WritesInFlightError> {
    let Some(v) = value else {
        return Ok(WRITES_IN_FLIGHT);
    };
    let count = v
        .trim()
        .parse::<usize>()
        .map_err(|_| WritesInFlightError::NotANumber { value: v.into() })?;
    if (1..=16).contains(&count) {
        Ok(count)
    } else {
        Err(WritesInFlightError::OutOfRange {
            value: v.into(),
            count,
        })
    }
}

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
    /// The keys it writes: a request waits while a batch in flight writes one of them (none:
    /// it commutes with everything, as a read does).
    fn keys(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Takes the longest prefix of `queue` that fits in one transaction: at least one request (a
/// single request too big is sent alone; etcd then answers for it), then requests in arrival
/// order while they fit — stopping at the first that does not, so no request overtakes another.
pub fn take_batch<Q: Admit>(queue: &mut VecDeque<Q>) -> Vec<Q> {
    take_batch_beside(queue, &HashMap::new())
}

/// [`take_batch`] beside batches in flight that write `busy` (key → batches): stops at the
/// first request that writes one of those keys, so it may take none.
pub fn take_batch_beside<Q: Admit>(
    queue: &mut VecDeque<Q>,
    busy: &HashMap<String, usize>,
) -> Vec<Q> {
    let mut batch: Vec<Q> = Vec::new();
    let (mut ops, mut bytes) = (0, 0);
    while let Some(next) = queue.front() {
        let free = busy.is_empty() || next.keys().iter().all(|k| !busy.contains_key(k));
        let fits = free
            && (batch.is_empty()
                || (ops + next.ops() <= MAX_OPS
                    && bytes + next.bytes() <= MAX_BYTES
                    && next.fits_with(&batch)));
        if !fits {
            break;
        }
        ops += next.ops();
        bytes += next.bytes();
        batch.extend(queue.pop_front());
    }
    batch
}

/// Requests waiting for the next batch, and the batches in flight.
struct Queue<Q, R> {
    waiting: VecDeque<(Q, oneshot::Sender<R>)>,
    /// Pumps running (each sends one batch at a time).
    pumps: usize,
    /// The keys written by the batches in flight, each with how many batches write it.
    busy: HashMap<String, usize>,
}

/// One queue of combinable requests `Q` answered with `R`, at most `in_flight` batches in
/// flight at a time (one by default).
pub struct Batcher<Q, R> {
    queue: Mutex<Queue<Q, R>>,
    in_flight: usize,
}

impl<Q, R> Default for Batcher<Q, R> {
    fn default() -> Self {
        Self::with_in_flight(1)
    }
}

impl<Q, R> Batcher<Q, R> {
    /// A batcher that keeps up to `in_flight` (at least 1) batches in flight.
    pub fn with_in_flight(in_flight: usize) -> Self {
        Self {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                pumps: 0,
                busy: HashMap::new(),
            }),
            in_flight: in_flight.max(1),
        }
    }
}

impl<Q, R> Batcher<Q, R>
where
    Q: Admit + Send + 'static,
    R: Send + 'static,
{
    /// Queues `req` and waits for its answer. When fewer batches than allowed are in flight
    /// this call starts a pump, which sends batches with `send` (one answer per request, in
    /// order) until the queue is empty or what is left must wait for a batch in flight; it
    /// runs in a task of its own, so a caller that gives up cancels nothing.
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
            let start = q.pumps < self.in_flight;
            if start {
                q.pumps += 1;
            }
            start
        };
        if start {
            let this = self.clone();
            tokio::spawn(async move {
                while let Some((reqs, txs, keys)) = this.next_batch() {
                    let answers = send(reqs).await;
                    this.landed(keys);
                    for (tx, answer) in txs.into_iter().zip(answers) {
                        let _ = tx.send(answer);
                    }
                }
            });
        }
        rx.await.ok()
    }

    /// The next batch, its reply channels and the keys it writes (marked busy), or None (and
    /// this pump gone) when the queue is empty or its head waits for a batch in flight (whose
    /// pump takes it next).
    #[allow(clippy::type_complexity)]
    fn next_batch(&self) -> Option<(Vec<Q>, Vec<oneshot::Sender<R>>, Vec<String>)> {
        let mut q = self.queue.lock().expect("batch queue poisoned");
        let (mut reqs, mut txs): (VecDeque<Q>, Vec<_>) = q.waiting.drain(..).unzip();
        let batch = take_batch_beside(&mut reqs, &q.busy);
        // Put back what did not fit, with its reply channels, at the front in order.
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

    /// A batch that wrote `keys` was answered: they are free again.
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
        fn keys(&self) -> Vec<String> {
            vec![self.0.to_string()]
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

    impl W {
        fn key(&self) -> String {
            self.0.to_string()
        }
    }

    #[test]
    fn writes_in_flight_is_a_number_from_1_to_16_and_a_bad_value_is_named() {
        assert_eq!(parse_writes_in_flight(None), Ok(WRITES_IN_FLIGHT));
        assert_eq!(parse_writes_in_flight(Some(" 4 ")), Ok(4));
        assert_eq!(parse_writes_in_flight(Some("1")), Ok(1));
        for bad in ["0", "17", "two", ""] {
            let why = parse_writes_in_flight(Some(bad)).unwrap_err().to_string();
            assert!(
                why.contains("DRUN_RDZV_WRITES_IN_FLIGHT") && why.contains("1 to 16"),
                "{why}"
            );
        }
        assert!(matches!(
            parse_writes_in_flight(Some("17")),
            Err(WritesInFlightError::OutOfRange { count: 17, .. })
        ));
        assert_eq!(
            parse_writes_in_flight(Some("two")),
            Err(WritesInFlightError::NotANumber {
                value: "two".into()
            })
        );
        assert_eq!(
            parse_writes_in_flight(Some("0")).unwrap_err().to_string(),
            "DRUN_RDZV_WRITES_IN_FLIGHT=\"0\" is not a number from 1 to 16; using 2 (unset it, or give e.g. 1 for one etcd write batch at a time)"
        );
    }

    #[test]
    fn a_write_of_a_key_in_flight_waits_and_nothing_behind_it_overtakes() {
        let busy: HashMap<String, usize> = [("a".to_string(), 1)].into();
        let mut q: VecDeque<W> = [W("a", 1, 1), W("c", 1, 1)].into();
        assert!(
            take_batch_beside(&mut q, &busy).is_empty(),
            "the head writes a key in flight"
        );
        assert_eq!(q.len(), 2, "both still queued, in order");
        let mut q: VecDeque<W> = [W("c", 1, 1), W("a", 1, 1), W("d", 1, 1)].into();
        assert_eq!(take_batch_beside(&mut q, &busy), vec![W("c", 1, 1)]);
        assert_eq!(q.front(), Some(&W("a", 1, 1)));
        assert_eq!(
            take_batch_beside(&mut q, &HashMap::new()),
            vec![W("a", 1, 1), W("d", 1, 1)],
            "once it landed"
        );
    }

    #[tokio::test]
    async fn two_batches_go_out_together_when_two_may_be_in_flight() {
        let batcher: Arc<Batcher<W, usize>> = Arc::new(Batcher::with_in_flight(2));
        let sent = Arc::new(Mutex::new(Vec::<Vec<String>>::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let send = {
            let (sent, gate) = (sent.clone(), gate.clone());
            move |reqs: Vec<W>| {
                let (sent, gate) = (sent.clone(), gate.clone());
                async move {
                    sent.lock().unwrap().push(reqs.iter().map(W::key).collect());
                    gate.acquire().await.unwrap().forget();
                    vec![reqs.len(); reqs.len()]
                }
            }
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut calls = Vec::new();
        // "a" goes out alone; "b", asked while "a" is in flight, goes out beside it.
        for (i, k) in ["a", "b"].into_iter().enumerate() {
            let (b, s) = (batcher.clone(), send.clone());
            calls.push(tokio::spawn(async move { b.call(W(k, 1, 1), s).await }));
            while sent.lock().unwrap().len() <= i {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "batch {i} waited for the one in flight: {:?}",
                    sent.lock().unwrap()
                );
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(*sent.lock().unwrap(), vec![vec!["a"], vec!["b"]]);
        assert_eq!(batcher.queue.lock().unwrap().pumps, 2);
        gate.add_permits(2);
        for c in calls {
            assert_eq!(c.await.unwrap(), Some(1));
        }
        assert_eq!(
            batcher.queue.lock().unwrap().pumps,
            0,
            "both pumps went idle"
        );
        assert!(
            batcher.queue.lock().unwrap().busy.is_empty(),
            "no key left busy"
        );
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
        assert_eq!(batcher.queue.lock().unwrap().pumps, 0, "the pump went idle");
    }
}
