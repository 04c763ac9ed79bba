//! The etcd side of combining requests ([`crate::store::etcd::batch`]): one transaction for a
//! batch of the requests [`super::combinable`] admits, and a read or a write sent through the
//! next batch.

use etcd_client as etcd;

use super::combinable::{ReadReq, WriteReq};
use super::{to_kv, EtcdStore};
use crate::store::{KeyValue, Txn, TxnResponse};
use crate::StoreError;
impl EtcdStore {
    /// One combined transaction of unconditional writes: every request gets its revision. When
    /// it fails because a lease is gone, each request is sent alone, so only the writes under
    /// that lease fail (with [`StoreError::LeaseLost`]).
    pub(super) async fn write_combined(
        &self,
        batch: Vec<WriteReq>,
    ) -> Vec<Result<TxnResponse, StoreError>> {
        let n = batch.len();
        let txns: Vec<Txn> = batch
            .into_iter()
            .map(|w| Txn {
                compares: vec![],
                success: w.0,
                failure: vec![],
            })
            .collect();
        if n == 1 {
            return vec![self.txn_once(txns.into_iter().next().expect("one")).await];
        }
        let all = Txn {
            compares: vec![],
            success: txns.iter().flat_map(|t| t.success.clone()).collect(),
            failure: vec![],
        };
        match self.txn_once(all).await {
            Ok(r) => vec![Ok(r); n],
            Err(StoreError::LeaseLost(_)) => {
                let mut out = Vec::with_capacity(n);
                for t in txns {
                    out.push(self.txn_once(t).await);
                }
                out
            }
            Err(e) => vec![Err(e); n],
        }
    }

    /// One combined read transaction: the value of each key, in order.
    async fn read_combined(
        &self,
        batch: Vec<ReadReq>,
    ) -> Vec<Result<Option<KeyValue>, StoreError>> {
        if batch.len() == 1 {
            return vec![self.get_once(&batch[0].0).await];
        }
        let t = etcd::Txn::new().and_then(
            batch
                .iter()
                .map(|r| etcd::TxnOp::get(r.0.as_bytes(), None))
                .collect::<Vec<_>>(),
        );
        let resp = self
            .retry(|c| {
                let t = t.clone();
                async move { super::kv(&c).txn(t).await }
            })
            .await;
        match resp {
            Ok(resp) => {
                let mut out: Vec<_> = resp
                    .op_responses()
                    .into_iter()
                    .map(|r| match r {
                        etcd::TxnOpResponse::Get(g) => Ok(g.kvs().first().map(to_kv)),
                        _ => Err(StoreError::Unavailable {
                            endpoint: self.endpoints.clone(),
                            reason: "a read transaction answered with a write".into(),
                        }),
                    })
                    .collect();
                out.resize_with(batch.len(), || Err(self.dropped("read")));
                out
            }
            Err(e) => vec![Err(self.unavailable(e)); batch.len()],
        }
    }

    /// Reads `key` in the next combined read transaction.
    pub(super) async fn get_batched(&self, key: String) -> Result<Option<KeyValue>, StoreError> {
        let this = self.clone();
        self.read_batch
            .call(ReadReq(key), move |batch| {
                let this = this.clone();
                async move { this.read_combined(batch).await }
            })
            .await
            .unwrap_or_else(|| Err(self.dropped("read")))
    }

    /// The error of a combined request whose answer was lost.
    pub(super) fn dropped(&self, what: &str) -> StoreError {
        StoreError::Unavailable {
            endpoint: self.endpoints.clone(),
            reason: format!("the combined {what} was dropped"),
        }
    }
}
