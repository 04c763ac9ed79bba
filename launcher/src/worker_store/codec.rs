//! The TCPStore wire format: decoding a client's queries, encoding the server's replies.
//!
//! As torch's client writes them (`TCPStore.cpp`, `SendBuffer`) and its libuv server reads them
//! (`TCPStoreLibUvBackend.cpp`, `UvClient::parse_*_command`): one command byte (the
//! `QueryType` of `TCPStoreBackend.hpp`), then the arguments in host byte order (little-endian
//! on every platform torch ships for): integers as fixed-width values, keys and values as a
//! `u64` length followed by that many bytes, key lists as a `u64` count followed by the keys.
//! The command numbers below were checked against the bytes torch 2.15's client sends.

use std::fmt;

/// The number a client sends first to prove it speaks this protocol
/// (`validationMagicNumber`, `TCPStoreBackend.hpp`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// Longest key accepted, in bytes (`MAX_STRING_LEN`, libuv backend).
pub const MAX_KEY_LEN: u64 = 8 * 1024;
/// Longest value accepted, in bytes (`MAX_PAYLOAD_LEN`, libuv backend).
pub const MAX_VALUE_LEN: u64 = 8 * 1024 * 1024;
/// Most keys in one check, wait, multi_get or multi_set (`MAX_KEY_COUNT`, libuv backend).
pub const MAX_KEY_COUNT: u64 = 128 * 1024;

/// A store key (torch keys are byte strings; the Python client prefixes them with `/`).
pub type Key = Vec<u8>;

/// One request of a client, in the order of torch's `QueryType` enum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// 0: the handshake, first on every connection.
    Validate { magic: u32 },
    /// 1: store a value; no reply.
    Set { key: Key, value: Vec<u8> },
    /// 2: replace the value if it equals `expected`; replies with the value now stored.
    CompareSet {
        key: Key,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    /// 3: the value (empty if absent; clients wait for the key first).
    Get { key: Key },
    /// 4: add to a decimal counter; replies with the new count.
    Add { key: Key, delta: i64 },
    /// 5: whether every key exists (ready) or not.
    Check { keys: Vec<Key> },
    /// 6: reply once every key exists.
    Wait { keys: Vec<Key> },
    /// 7: how many keys exist.
    NumKeys,
    /// 8: remove a key; replies with the number removed (0 or 1).
    DeleteKey { key: Key },
    /// 9: append to a value (creating it); no reply.
    Append { key: Key, value: Vec<u8> },
    /// 10: several values at once.
    MultiGet { keys: Vec<Key> },
    /// 11: several sets at once; no reply.
    MultiSet { pairs: Vec<(Key, Vec<u8>)> },
    /// 12: give up this connection's pending wait.
    CancelWait,
    /// 13: echo the nonce (sent right after Validate).
    Ping { nonce: u32 },
    /// 14: push onto a queue; no reply.
    QueuePush { key: Key, value: Vec<u8> },
    /// 15: pop from a queue: its length before the pop, then the value if there was one.
    QueuePop { key: Key },
    /// 16: a queue's length.
    QueueLen { key: Key },
    /// 17: every key.
    ListKeys,
    /// 18: count this client in barrier `key`; reply once `world_size` have.
    Barrier { key: Key, world_size: i64 },
}

/// Why bytes from a client are not a query. The server closes that connection, as torch's does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A command byte no torch client sends.
    UnknownCommand(u8),
    /// A key or value longer than torch's server accepts.
    TooLong {
        /// "key" or "value".
        what: &'static str,
        /// Announced length in bytes.
        len: u64,
    },
    /// More keys in one query than torch's server accepts.
    TooManyKeys(u64),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::UnknownCommand(c) => write!(f, "unknown command {c}"),
            DecodeError::TooLong { what, len } => write!(f, "{what} of {len} bytes is too long"),
            DecodeError::TooManyKeys(n) => write!(f, "{n} keys in one query (max {MAX_KEY_COUNT})"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Reading stopped: the query is not complete yet, or it is malformed.
enum Stop {
    More,
    Bad(DecodeError),
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Stop> {
        let end = self.pos.checked_add(n).ok_or(Stop::More)?;
        let s = self.buf.get(self.pos..end).ok_or(Stop::More)?;
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        Ok(self.take(N)?.try_into().expect("take returns N bytes"))
    }
    fn u32(&mut self) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, Stop> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    fn bytes(&mut self, what: &'static str, max: u64) -> Result<Vec<u8>, Stop> {
        let len = self.u64()?;
        if len > max {
            return Err(Stop::Bad(DecodeError::TooLong { what, len }));
        }
        Ok(self.take(len as usize)?.to_vec())
    }
    fn key(&mut self) -> Result<Key, Stop> {
        self.bytes("key", MAX_KEY_LEN)
    }
    fn value(&mut self) -> Result<Vec<u8>, Stop> {
        self.bytes("value", MAX_VALUE_LEN)
    }
    fn count(&mut self) -> Result<usize, Stop> {
        let n = self.u64()?;
        if n > MAX_KEY_COUNT {
            return Err(Stop::Bad(DecodeError::TooManyKeys(n)));
        }
        Ok(n as usize)
    }
    fn keys(&mut self) -> Result<Vec<Key>, Stop> {
        let n = self.count()?;
        (0..n).map(|_| self.key()).collect()
    }
}

/// Decodes the first query in `buf`: `Ok(Some((query, bytes used)))`, `Ok(None)` when `buf`
/// holds only part of it (read more and call again).
///
/// # Errors
/// An unknown command byte, or a length or count beyond torch's limits.
pub fn decode(buf: &[u8]) -> Result<Option<(Query, usize)>, DecodeError> {
    let mut c = Cursor { buf, pos: 0 };
    match decode_from(&mut c) {
        Ok(q) => Ok(Some((q, c.pos))),
        Err(Stop::More) => Ok(None),
        Err(Stop::Bad(e)) => Err(e),
    }
}

fn decode_from(c: &mut Cursor<'_>) -> Result<Query, Stop> {
    let [cmd] = c.array::<1>()?;
    Ok(match cmd {
        0 => Query::Validate { magic: c.u32()? },
        1 => Query::Set {
            key: c.key()?,
            value: c.value()?,
        },
        2 => Query::CompareSet {
            key: c.key()?,
            expected: c.value()?,
            desired: c.value()?,
        },
        3 => Query::Get { key: c.key()? },
        4 => Query::Add {
            key: c.key()?,
            delta: c.i64()?,
        },
        5 => Query::Check { keys: c.keys()? },
        6 => Query::Wait { keys: c.keys()? },
        7 => Query::NumKeys,
        8 => Query::DeleteKey { key: c.key()? },
        9 => Query::Append {
            key: c.key()?,
            value: c.value()?,
        },
        10 => Query::MultiGet { keys: c.keys()? },
        11 => {
            let n = c.count()?;
            let pairs = (0..n)
                .map(|_| Ok((c.key()?, c.value()?)))
                .collect::<Result<_, Stop>>()?;
            Query::MultiSet { pairs }
        }
        12 => Query::CancelWait,
        13 => Query::Ping { nonce: c.u32()? },
        14 => Query::QueuePush {
            key: c.key()?,
            value: c.value()?,
        },
        15 => Query::QueuePop { key: c.key()? },
        16 => Query::QueueLen { key: c.key()? },
        17 => Query::ListKeys,
        18 => Query::Barrier {
            key: c.key()?,
            world_size: c.i64()?,
        },
        other => return Err(Stop::Bad(DecodeError::UnknownCommand(other))),
    })
}

/// The answer to a wait or a barrier (`WaitResponseType`, one byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReply {
    /// 0: every awaited key exists (or the barrier is complete).
    StopWaiting,
    /// 1: the wait was cancelled (CancelWait).
    Canceled,
}

/// One reply of the server, as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A value: `u64` length and bytes (get, compare_set).
    Bytes(Vec<u8>),
    /// An `i64` (add, num_keys, delete_key, queue_len).
    I64(i64),
    /// A `u32` (ping's nonce).
    U32(u32),
    /// Check: one byte, 0 ready, 1 not ready (`CheckResponseType`).
    Check(bool),
    /// Wait, cancel_wait, barrier: one byte.
    Wait(WaitReply),
    /// multi_get: each value as in `Bytes`, no count.
    Values(Vec<Vec<u8>>),
    /// queue_pop: the queue's `i64` length before the pop, then the value if there was one.
    Popped { len: i64, value: Option<Vec<u8>> },
    /// list_keys: an `i64` count, then each key as in `Bytes`.
    Keys(Vec<Key>),
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

impl Reply {
    /// Appends this reply's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Bytes(b) => put_bytes(out, b),
            Reply::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Reply::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Reply::Check(ready) => out.push(if *ready { 0 } else { 1 }),
            Reply::Wait(WaitReply::StopWaiting) => out.push(0),
            Reply::Wait(WaitReply::Canceled) => out.push(1),
            Reply::Values(vs) => vs.iter().for_each(|v| put_bytes(out, v)),
            Reply::Popped { len, value } => {
                out.extend_from_slice(&len.to_le_bytes());
                if let Some(v) = value {
                    put_bytes(out, v);
                }
            }
            Reply::Keys(keys) => {
                out.extend_from_slice(&(keys.len() as i64).to_le_bytes());
                keys.iter().for_each(|k| put_bytes(out, k));
            }
        }
    }
}
