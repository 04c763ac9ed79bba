//! The worker store's key-value state machine: keys, queues, and clients waiting on keys.
//!
//! Pure: [`State::apply`] takes one client's query and returns the replies to send, to that
//! client and to others a change woke up; no sockets, no clocks. Behaviour follows torch's libuv
//! server (`TCPStoreLibUvBackend.cpp`, `LibUVStoreDaemon`), with two deliberate differences:
//! a compare_set that changes nothing wakes nobody (torch wakes the key's waiters even when the
//! key is absent, and their next get reads an empty value), and a queue push wakes the first
//! client waiting on that queue (torch decrements every waiter's count on the way).

use std::collections::{HashMap, VecDeque};

use super::codec::{Key, Query, Reply, WaitReply};

/// Identifies one client connection.
pub type ClientId = u64;

/// Replies to send, in order, each to its client.
pub type Outbox = Vec<(ClientId, Reply)>;

/// Why a query fails. The server closes the client's connection, as torch's server does when a
/// handler throws.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// add or barrier on a value that is not a decimal integer (torch: `std::stoll` throws).
    #[error("value of key {key:?} is not an integer")]
    NotANumber {
        /// The key, lossily as text.
        key: String,
    },
    /// add past the range of `i64`.
    #[error("add overflows the counter of key {key:?}")]
    Overflow {
        /// The key, lossily as text.
        key: String,
    },
    /// A query the state machine does not take (Validate, Ping: the connection's business).
    #[error("unexpected {0} query")]
    Unexpected(&'static str),
}

/// All keys, values, queues and waiters of one generation's store.
#[derive(Debug, Default)]
pub struct State {
    values: HashMap<Key, Vec<u8>>,
    queues: HashMap<Key, VecDeque<Vec<u8>>>,
    /// Per missing key, the clients waiting for it, in arrival order.
    waiting: HashMap<Key, Vec<ClientId>>,
    /// Per waiting client, how many of its keys are still missing.
    awaited: HashMap<ClientId, usize>,
}

fn text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// A decimal integer as C's `strtoll` reads it (`std::stoll`): leading blanks, an optional sign,
/// digits, anything after ignored; `None` without digits or out of range.
pub fn parse_counter(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?.trim_start();
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'-') => ("-", &s[1..]),
        Some(b'+') => ("", &s[1..]),
        _ => ("", s),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    format!("{sign}{}", &rest[..digits]).parse().ok()
}

impl State {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys (queues not counted, as in torch).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no key exists.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Number of clients with a pending wait or barrier.
    pub fn waiters(&self) -> usize {
        self.awaited.len()
    }

    /// Applies `query` from client `from`: the replies to send, in order.
    ///
    /// # Errors
    /// [`StoreError`]; the store is unchanged then.
    pub fn apply(&mut self, from: ClientId, query: Query) -> Result<Outbox, StoreError> {
        let mut out = Outbox::new();
        match query {
            Query::Validate { .. } => return Err(StoreError::Unexpected("validate")),
            Query::Ping { .. } => return Err(StoreError::Unexpected("ping")),
            Query::Set { key, value } => self.set(key, value, &mut out),
            Query::CompareSet {
                key,
                expected,
                desired,
            } => {
                let now = self.compare_set(key, expected, desired, &mut out);
                out.push((from, Reply::Bytes(now)));
            }
            Query::Get { key } => {
                let v = self.values.get(&key).cloned().unwrap_or_default();
                out.push((from, Reply::Bytes(v)));
            }
            Query::Add { key, delta } => {
                let new = self.add(key, delta, &mut out)?;
                out.push((from, Reply::I64(new)));
            }
            Query::Check { keys } => {
                let ready = keys.iter().all(|k| self.present(k));
                out.push((from, Reply::Check(ready)));
            }
            Query::Wait { keys } => self.wait(from, keys, &mut out),
            Query::NumKeys => out.push((from, Reply::I64(self.values.len() as i64))),
            Query::DeleteKey { key } => {
                let n = i64::from(self.values.remove(&key).is_some());
                out.push((from, Reply::I64(n)));
            }
            Query::Append { key, value } => {
                let mut v = self.values.get(&key).cloned().unwrap_or_default();
                v.extend_from_slice(&value);
                self.set(key, v, &mut out);
            }
            Query::MultiGet { keys } => {
                let vs = keys
                    .iter()
                    .map(|k| self.values.get(k).cloned().unwrap_or_default())
                    .collect();
                out.push((from, Reply::Values(vs)));
            }
            Query::MultiSet { pairs } => {
                for (k, v) in pairs {
                    self.set(k, v, &mut out);
                }
            }
            Query::CancelWait => {
                self.disconnect(from);
                out.push((from, Reply::Wait(WaitReply::Canceled)));
            }
            Query::QueuePush { key, value } => {
                self.queues.entry(key.clone()).or_default().push_back(value);
                self.wake_one(&key, &mut out);
            }
            Query::QueuePop { key } => {
                let q = self.queues.entry(key).or_default();
                let len = q.len() as i64;
                out.push((
                    from,
                    Reply::Popped {
                        len,
                        value: q.pop_front(),
                    },
                ));
            }
            Query::QueueLen { key } => {
                let len = self.queues.get(&key).map_or(0, VecDeque::len);
                out.push((from, Reply::I64(len as i64)));
            }
            Query::ListKeys => out.push((from, Reply::Keys(self.values.keys().cloned().collect()))),
            Query::Barrier { key, world_size } => self.barrier(from, key, world_size, &mut out)?,
        }
        Ok(out)
    }

    /// `compareSet`: the value the key holds afterwards, which is the reply.
    fn compare_set(
        &mut self,
        key: Key,
        expected: Vec<u8>,
        desired: Vec<u8>,
        out: &mut Outbox,
    ) -> Vec<u8> {
        match self.values.get(&key) {
            None if expected.is_empty() => {
                self.set(key, desired.clone(), out);
                desired
            }
            // Absent and something else expected: torch answers with `expected`.
            None => expected,
            Some(cur) if *cur == expected => {
                self.set(key, desired.clone(), out);
                desired
            }
            Some(cur) => cur.clone(),
        }
    }

    /// `add`: the counter's new value.
    fn add(&mut self, key: Key, delta: i64, out: &mut Outbox) -> Result<i64, StoreError> {
        let old = match self.values.get(&key) {
            None => 0,
            Some(v) => {
                parse_counter(v).ok_or_else(|| StoreError::NotANumber { key: text(&key) })?
            }
        };
        let new = old
            .checked_add(delta)
            .ok_or_else(|| StoreError::Overflow { key: text(&key) })?;
        self.set(key, new.to_string().into_bytes(), out);
        Ok(new)
    }

    /// `wait`: answered now when every key exists, else parked until the missing ones appear.
    fn wait(&mut self, from: ClientId, keys: Vec<Key>, out: &mut Outbox) {
        if keys.iter().all(|k| self.present(k)) {
            out.push((from, Reply::Wait(WaitReply::StopWaiting)));
            return;
        }
        let missing: Vec<Key> = keys.into_iter().filter(|k| !self.present(k)).collect();
        self.awaited.insert(from, missing.len());
        for k in missing {
            self.waiting.entry(k).or_default().push(from);
        }
    }

    /// A barrier arrival: counts it and releases everyone once `world_size` arrived.
    fn barrier(
        &mut self,
        from: ClientId,
        key: Key,
        world_size: i64,
        out: &mut Outbox,
    ) -> Result<(), StoreError> {
        let count = match self.values.get(&key) {
            None => 1,
            Some(v) => parse_counter(v)
                .and_then(|c| c.checked_add(1))
                .ok_or_else(|| StoreError::NotANumber { key: text(&key) })?,
        };
        // Stored without waking: the barrier's own waiters are woken below, together.
        self.values
            .insert(key.clone(), count.to_string().into_bytes());
        if count >= world_size {
            self.wake_all(&key, out);
            out.push((from, Reply::Wait(WaitReply::StopWaiting)));
        } else {
            self.waiting.entry(key).or_default().push(from);
            self.awaited.insert(from, 1);
        }
        Ok(())
    }

    /// Forgets client `c`'s pending wait (it cancelled it or disconnected).
    pub fn disconnect(&mut self, c: ClientId) {
        if self.awaited.remove(&c).is_none() {
            return;
        }
        self.waiting.retain(|_, clients| {
            clients.retain(|x| *x != c);
            !clients.is_empty()
        });
    }

    /// Whether `key` exists as a value or as a non-empty queue (torch's `checkKeys`).
    fn present(&self, key: &[u8]) -> bool {
        self.values.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    fn set(&mut self, key: Key, value: Vec<u8>, out: &mut Outbox) {
        self.wake_all(&key, out);
        self.values.insert(key, value);
    }

    /// One fewer missing key for `c`; replies StopWaiting when none is left.
    fn arrived(&mut self, c: ClientId, out: &mut Outbox) -> bool {
        let Some(n) = self.awaited.get_mut(&c) else {
            return false;
        };
        *n = n.saturating_sub(1);
        if *n > 0 {
            return false;
        }
        self.awaited.remove(&c);
        out.push((c, Reply::Wait(WaitReply::StopWaiting)));
        true
    }

    fn wake_all(&mut self, key: &[u8], out: &mut Outbox) {
        for c in self.waiting.remove(key).unwrap_or_default() {
            self.arrived(c, out);
        }
    }

    fn wake_one(&mut self, key: &[u8], out: &mut Outbox) {
        let Some(clients) = self.waiting.get_mut(key) else {
            return;
        };
        let first = clients.remove(0);
        if clients.is_empty() {
            self.waiting.remove(key);
        }
        self.arrived(first, out);
    }
}
