//! Adopting an agent lease another replica held: the agent reconnected here, so its keys move
//! under this server's carrier, found through the lease's registry record ([`super::record`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::record::{record, registry_key, Record};
use super::SharedLeases;
use crate::store::{Compare, LeaseId, Op, Txn};
use crate::StoreError;

/// Attempts at moving the keys before giving the lease up (each fails only when one of its
/// keys changed meanwhile).
const ATTEMPTS: usize = 3;

impl SharedLeases {
    /// Adopts agent lease `lease` from the replica that held it: its keys still attached to that
    /// replica's carrier are rewritten under ours, with the registry record, in one transaction
    /// guarded by their revisions. `LeaseLost` when the record is gone (the lease ended).
    pub(super) async fn adopt(self: &Arc<Self>, lease: LeaseId) -> Result<Duration, StoreError> {
        let reg = registry_key(lease);
        for _ in 0..ATTEMPTS {
            if let Some(ttl) = self.table().renew(lease, Instant::now()) {
                return Ok(ttl); // adopted meanwhile by a concurrent call
            }
            let Some(kv) = self.inner.get(&reg).await? else {
                return Err(StoreError::LeaseLost(lease));
            };
            let rec: Record =
                serde_json::from_slice(&kv.value).map_err(|e| StoreError::Corrupt {
                    key: reg.clone(),
                    reason: e.to_string(),
                })?;
            let ttl = Duration::from_millis(rec.ttl_ms);
            let carrier = self.carrier(ttl).await?;
            if kv.lease == Some(carrier) {
                return Err(StoreError::LeaseLost(lease)); // ours, and ended here
            }
            let mut compares = vec![Compare::ModRevisionEquals(reg.clone(), kv.mod_revision)];
            let mut moved = Vec::new();
            for key in &rec.keys {
                let Some(k) = self.inner.get(key).await? else {
                    compares.push(Compare::Missing(key.clone()));
                    continue;
                };
                compares.push(Compare::ModRevisionEquals(key.clone(), k.mod_revision));
                if k.lease == kv.lease {
                    moved.push(Op::Put {
                        key: key.clone(),
                        value: k.value.to_vec(),
                        lease: Some(carrier),
                    });
                }
            }
            let kept: Vec<String> = moved
                .iter()
                .filter_map(|op| match op {
                    Op::Put { key, .. } => Some(key.clone()),
                    _ => None,
                })
                .collect();
            let mut success = moved;
            success.push(Op::Put {
                key: reg.clone(),
                value: record(ttl, &kept),
                lease: Some(carrier),
            });
            let resp = self
                .inner
                .txn(Txn {
                    compares,
                    success,
                    failure: vec![],
                })
                .await?;
            if !resp.succeeded {
                continue;
            }
            let mut t = self.table();
            t.grant(lease, ttl, carrier, Instant::now());
            for key in kept.iter().chain(std::iter::once(&reg)) {
                t.writing(lease, key);
                t.wrote(key, Some(lease), resp.revision);
            }
            tracing::info!(
                lease = format!("{lease:#x}"),
                keys = kept.len(),
                "took over an agent lease from another server"
            );
            return Ok(ttl);
        }
        Err(StoreError::LeaseLost(lease))
    }
}
