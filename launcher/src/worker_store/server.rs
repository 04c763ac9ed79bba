//! The worker store's TCP server: accepts torch's TCPStore clients and feeds their queries to
//! the [`State`].
//!
//! One task accepts; one task per connection reads queries and writes that connection's
//! replies. The state sits behind one mutex, never held across an `.await`: a query is applied
//! and its replies (to this client and to the waiters it woke) are queued on the clients'
//! channels under the lock, so every client receives its replies in order. As in torch's server
//! (`TCPStoreLibUvBackend.cpp`), a connection must first send Validate with the magic number
//! (then normally Ping); anything else, a malformed query or a failing one closes it. Dropping
//! the [`WorkerStore`] closes the listening socket and every connection.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use super::codec::{self, Query, Reply, VALIDATION_MAGIC};
use super::state::{ClientId, State, StoreError};

/// Why a worker's connection to the store is closed: it broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ProtocolError {
    /// A query that does not decode.
    #[error("bad query: {0}")]
    BadQuery(#[source] codec::DecodeError),
    /// A validation with another number than [`VALIDATION_MAGIC`].
    #[error("bad validation number {0:#x}")]
    BadValidation(u32),
    /// A query before the validation.
    #[error("query before validation")]
    NotValidated,
    /// A second validation.
    #[error("validation repeated")]
    Repeated,
    /// A query the store refuses.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Read buffer growth step, in bytes.
const READ_CHUNK: usize = 4096;

/// The state and the reply channel of every connected client.
#[derive(Default)]
struct Shared {
    state: State,
    clients: HashMap<ClientId, mpsc::UnboundedSender<Vec<u8>>>,
}

type SharedRef = Arc<Mutex<Shared>>;

fn lock(s: &SharedRef) -> std::sync::MutexGuard<'_, Shared> {
    // A panic while holding the lock would leave the state half-updated; the store is then
    // unusable anyway, so a poisoned lock is taken as is rather than propagated.
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running worker store. Serves until dropped.
#[derive(Debug)]
pub struct WorkerStore {
    port: u16,
    accept: JoinHandle<()>,
}

impl WorkerStore {
    /// Serves torch's TCPStore protocol on `listener` (already bound and listening) with an
    /// empty key space. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The listener cannot be handed to tokio or has no local address.
    pub fn serve(listener: std::net::TcpListener) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let listener = TcpListener::from_std(listener)?;
        let accept = tokio::spawn(accept_loop(listener, Arc::default()));
        Ok(Self { port, accept })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for WorkerStore {
    fn drop(&mut self) {
        // The accept task owns the listener and the connections' JoinSet: cancelling it closes
        // them all.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: SharedRef) {
    let mut conns = JoinSet::new();
    let mut next_id: ClientId = 0;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    next_id += 1;
                    tracing::trace!(client = next_id, %peer, "worker store: client connected");
                    let _ = stream.set_nodelay(true);
                    conns.spawn(connection(stream, next_id, shared.clone()));
                }
                Err(e) => {
                    // EMFILE and the like: keep serving the connected clients, retry shortly.
                    tracing::warn!(error = %e, "worker store: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(stream: TcpStream, id: ClientId, shared: SharedRef) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    lock(&shared).clients.insert(id, tx);
    let why = serve_client(stream, id, &shared, &mut rx).await;
    tracing::debug!(client = id, "worker store: connection closed: {why}");
    let mut s = lock(&shared);
    s.clients.remove(&id);
    s.state.disconnect(id);
}

/// Runs one connection until it ends; returns why it ended.
async fn serve_client(
    stream: TcpStream,
    id: ClientId,
    shared: &SharedRef,
    rx: &mut mpsc::UnboundedReceiver<Vec<u8>>,
) -> String {
    let (mut rd, mut wr) = stream.into_split();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut validated = false;
    loop {
        tokio::select! {
            // `read_buf` is cancel-safe: nothing is lost when a reply wins the race.
            n = rd.read_buf(&mut buf) => match n {
                Ok(0) => return "end of stream".into(),
                Err(e) => return format!("read error: {e}"),
                Ok(_) => {
                    if let Err(why) = handle_input(&mut buf, id, shared, &mut validated) {
                        return why.to_string();
                    }
                    if buf.capacity() - buf.len() < READ_CHUNK {
                        buf.reserve(READ_CHUNK);
                    }
                }
            },
            Some(bytes) = rx.recv() => {
                if let Err(e) = wr.write_all(&bytes).await {
                    return format!("write error: {e}");
                }
            }
        }
    }
}

/// Applies every complete query in `buf` and removes it; a partial one stays for the next read.
fn handle_input(
    buf: &mut Vec<u8>,
    id: ClientId,
    shared: &SharedRef,
    validated: &mut bool,
) -> Result<(), ProtocolError> {
    let mut used = 0;
    let result = loop {
        let (query, n) = match codec::decode(&buf[used..]) {
            Ok(Some(q)) => q,
            Ok(None) => break Ok(()),
            Err(e) => break Err(ProtocolError::BadQuery(e)),
        };
        used += n;
        if let Err(e) = handle_query(query, id, shared, validated) {
            break Err(e);
        }
    };
    buf.drain(..used);
    result
}

fn handle_query(
    query: Query,
    id: ClientId,
    shared: &SharedRef,
    validated: &mut bool,
) -> Result<(), ProtocolError> {
    let mut s = lock(shared);
    match (query, *validated) {
        (Query::Validate { magic }, false) if magic == VALIDATION_MAGIC => {
            *validated = true;
            Ok(())
        }
        (Query::Validate { magic }, false) => Err(ProtocolError::BadValidation(magic)),
        (_, false) => Err(ProtocolError::NotValidated),
        (Query::Validate { .. }, true) => Err(ProtocolError::Repeated),
        (Query::Ping { nonce }, true) => {
            send(&s, id, &Reply::U32(nonce));
            Ok(())
        }
        (query, true) => {
            let out = s.state.apply(id, query)?;
            for (to, reply) in &out {
                send(&s, *to, reply);
            }
            Ok(())
        }
    }
}

fn send(s: &Shared, to: ClientId, reply: &Reply) {
    if let Some(tx) = s.clients.get(&to) {
        let mut bytes = Vec::new();
        reply.encode(&mut bytes);
        // A closed channel means that client is going away; its wait state goes with it.
        let _ = tx.send(bytes);
    }
}
