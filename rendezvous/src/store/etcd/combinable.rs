//! Which requests combine into one etcd transaction ([`crate::store::etcd::batch`]): a read of
//! one key, and unconditional writes that touch no key another request of the batch writes.

use crate::store::etcd::batch::Admit;
use crate::store::{Op, Txn};

/// A read of one key, for a combined read transaction.
pub(super) struct ReadReq(pub(super) String);

impl Admit for ReadReq {
    fn ops(&self) -> usize {
        1
    }
    fn bytes(&self) -> usize {
        self.0.len()
    }
    fn fits_with(&self, _: &[Self]) -> bool {
        true
    }
}

/// The ops of an unconditional transaction, for a combined write transaction.
pub(super) struct WriteReq(pub(super) Vec<Op>);

impl WriteReq {
    /// The keys it writes.
    fn written(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|op| match op {
            Op::Put { key, .. } | Op::Delete(key) | Op::DeletePrefix(key) => key.as_str(),
        })
    }

    /// Whether `txn` may share a transaction with others: no compares, no failure branch, no
    /// prefix delete (it could cover another request's key).
    pub(super) fn combinable(txn: &Txn) -> bool {
        txn.compares.is_empty()
            && txn.failure.is_empty()
            && !txn.success.is_empty()
            && !txn
                .success
                .iter()
                .any(|op| matches!(op, Op::DeletePrefix(_)))
    }
}

impl Admit for WriteReq {
    fn ops(&self) -> usize {
        self.0.len()
    }
    fn bytes(&self) -> usize {
        self.0
            .iter()
            .map(|op| match op {
                Op::Put { key, value, .. } => key.len() + value.len(),
                Op::Delete(key) | Op::DeletePrefix(key) => key.len(),
            })
            .sum()
    }
    /// etcd refuses a transaction that writes one key twice.
    fn fits_with(&self, batch: &[Self]) -> bool {
        self.written()
            .all(|k| batch.iter().all(|other| other.written().all(|o| o != k)))
    }
    fn keys(&self) -> Vec<String> {
        self.written().map(str::to_string).collect()
    }
}
