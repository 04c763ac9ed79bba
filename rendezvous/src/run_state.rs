//! One typed accessor for a run's own keys (`gen/current`, plans, `restarts`, `finished`, `lost/…`, `closed`), with one encode/decode each.
//!
//! [`crate::Round`], the session and [`crate::Ledger`] read these keys only through
//! [`RunState`]: a value that does not decode is [`StoreError::Corrupt`] everywhere, never a
//! silent default.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::formation::Formation;
use crate::keys::RunKeys;
use crate::loss;
use crate::root_cause::RootCause;
use crate::round::Restarts;
use crate::session::RunEnd;
use crate::store::{Compare, KeyValue, Op, Store, Txn};
use crate::{Plan, StoreError};

/// Encodes a generation number for `gen/current`.
pub fn encode_generation(g: u64) -> Vec<u8> {
    g.to_string().into_bytes()
}

/// Decodes `gen/current` (stored at `key`).
pub fn decode_generation(key: &str, value: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(value)
        .map_err(|e| e.to_string())
        .and_then(|s| s.parse::<u64>().map_err(|e| e.to_string()))
        .map_err(|reason| StoreError::Corrupt {
            key: key.to_string(),
            reason,
        })
}

/// Encodes a JSON record (plans, restart counters, the run's end).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("run records serialize")
}

/// Decodes a JSON record stored at `key`.
pub fn decode<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

/// Plans decoded lately, newest last: (key, stored bytes, plan).
type PlanCache = Vec<(String, bytes::Bytes, Plan)>;

/// How many decoded plans [`decode_plan`] keeps.
const PLANS_KEPT: usize = 8;

/// Decodes the plan stored at `key` as `value`, or returns the copy decoded earlier from the
/// very same bytes (a clone of a [`Plan`] shares its member list). A server's sessions all read
/// one plan at a formation; decoding a 1,024-member plan a thousand times was most of a
/// formation's CPU.
pub fn decode_plan(key: &str, value: &bytes::Bytes) -> Result<Plan, StoreError> {
    static PLANS: std::sync::Mutex<PlanCache> = std::sync::Mutex::new(Vec::new());
    if let Some((_, _, plan)) = PLANS
        .lock()
        .expect("plan cache poisoned")
        .iter()
        // The same buffer (a read shared by many sessions) needs no byte comparison.
        .find(|(k, v, _)| {
            k == key && ((v.as_ptr() == value.as_ptr() && v.len() == value.len()) || v == value)
        })
    {
        return Ok(plan.clone());
    }
    let plan: Plan = decode(key, value)?;
    let mut plans = PLANS.lock().expect("plan cache poisoned");
    if plans.len() >= PLANS_KEPT {
        plans.remove(0);
    }
    plans.push((key.to_string(), value.clone(), plan.clone()));
    Ok(plan)
}

/// The typed keys of one run on a store. Cheap to clone.
#[derive(Clone)]
pub struct RunState {
    store: Arc<dyn Store>,
    keys: RunKeys,
}

impl RunState {
    /// The keys of run `run_id` on `store`.
    pub fn new(store: Arc<dyn Store>, run_id: &str) -> Self {
        Self {
            store,
            keys: RunKeys::new(run_id),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.store.get(key).await
    }

    /// Current generation (0 before the first formation) and the `mod_revision` of its key.
    pub async fn current_generation(&self) -> Result<(u64, i64), StoreError> {
        let key = self.keys.gen_current();
        match self.get(&key).await? {
            None => Ok((0, 0)),
            Some(kv) => Ok((decode_generation(&key, &kv.value)?, kv.mod_revision)),
        }
    }

    /// The plan of generation `g`, if written. Decoded once per process: the thousand sessions
    /// of a server that read the same plan share one decoded copy ([`decode_plan`]).
    pub async fn plan(&self, g: u64) -> Result<Option<Plan>, StoreError> {
        let key = self.keys.plan(g);
        self.get(&key)
            .await?
            .map(|kv| decode_plan(&key, &kv.value))
            .transpose()
    }

    /// When generation `g` formed ([`crate::formation::Formation`]); `None` before it did, or
    /// when an older drun formed it.
    pub async fn formation(&self, g: u64) -> Result<Option<Formation>, StoreError> {
        let key = self.keys.formation(g);
        self.get(&key)
            .await?
            .map(|kv| decode(&key, &kv.value))
            .transpose()
    }

    /// Restart counters and the `mod_revision` of their key (0: never written).
    pub async fn restarts(&self) -> Result<(Restarts, i64), StoreError> {
        let key = self.keys.restarts();
        match self.get(&key).await? {
            None => Ok((Restarts::default(), 0)),
            Some(kv) => Ok((decode(&key, &kv.value)?, kv.mod_revision)),
        }
    }

    /// How the run ended, if it did.
    pub async fn finished(&self) -> Result<Option<RunEnd>, StoreError> {
        let key = self.keys.finished();
        self.get(&key)
            .await?
            .map(|kv| decode(&key, &kv.value))
            .transpose()
    }

    /// The run's recorded root causes, one per generation a worker failure ended, oldest first.
    pub async fn root_causes(&self) -> Result<Vec<RootCause>, StoreError> {
        let mut all = self
            .store
            .get_prefix(&self.keys.root_cause_prefix())
            .await?
            .iter()
            .map(|kv| decode::<RootCause>(&kv.key, &kv.value))
            .collect::<Result<Vec<_>, _>>()?;
        all.sort_by_key(|c| c.generation);
        Ok(all)
    }

    /// The job-wide failure history, oldest first (keys `failure/<g>`).
    pub async fn failures(&self) -> Result<Vec<crate::failure_log::FailureRecord>, StoreError> {
        self.store
            .get_prefix(&self.keys.failures_prefix())
            .await?
            .iter()
            .map(|kv| decode(&kv.key, &kv.value))
            .collect()
    }

    /// The checkpoint interval in force (`ckpt/interval`), if `--ckpt-interval` set one.
    pub async fn ckpt_interval(
        &self,
    ) -> Result<Option<crate::ckpt_interval::Interval>, StoreError> {
        let key = self.keys.ckpt_interval();
        self.get(&key)
            .await?
            .map(|kv| decode(&key, &kv.value))
            .transpose()
    }

    /// Why generation `g` must re-form, if it must.
    pub async fn closed(&self, g: u64) -> Result<Option<String>, StoreError> {
        Ok(self
            .get(&self.keys.closed(g))
            .await?
            .map(|kv| kv.value_str()))
    }

    /// Why `node` was dropped ([`loss::LEASE_EXPIRED`] when nobody said).
    pub async fn lost(&self, node: &str) -> Result<String, StoreError> {
        Ok(self
            .get(&self.keys.lost(node))
            .await?
            .map_or_else(|| loss::LEASE_EXPIRED.to_string(), |kv| kv.value_str()))
    }

    /// Ends the run as `end` unless it has ended already (one transaction on `finished`, as
    /// the session's own verdicts write it); true if this call ended it. Every session of the
    /// run sees the end through its watch and reports it to its agent.
    ///
    /// # Errors
    /// The store's.
    pub async fn end(&self, end: &RunEnd) -> Result<bool, StoreError> {
        let key = self.keys.finished();
        let r = self
            .store
            .txn(Txn {
                compares: vec![Compare::Missing(key.clone())],
                success: vec![Op::put(key, encode(end))],
                failure: vec![],
            })
            .await?;
        Ok(r.succeeded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[tokio::test]
    async fn a_run_ends_once_and_the_first_end_stays() {
        let state = RunState::new(Arc::new(MemoryStore::new()), "r");
        let end = |reason: &str| RunEnd {
            success: false,
            reason: reason.into(),
            at_ms: 1,
            root_cause: None,
            retryable: true,
        };
        assert!(state.end(&end("the host stopped")).await.unwrap());
        assert!(!state.end(&end("later")).await.unwrap());
        assert_eq!(
            state.finished().await.unwrap(),
            Some(end("the host stopped"))
        );
    }

    #[tokio::test]
    async fn a_corrupt_generation_is_an_error_not_zero() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let state = RunState::new(store.clone(), "r");
        assert_eq!(state.current_generation().await.unwrap().0, 0);
        let key = RunKeys::new("r").gen_current();
        store.put(&key, encode_generation(7), None).await.unwrap();
        assert_eq!(state.current_generation().await.unwrap().0, 7);
        store.put(&key, b"seven".to_vec(), None).await.unwrap();
        assert!(matches!(
            state.current_generation().await,
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[tokio::test]
    async fn corrupt_records_are_errors() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let state = RunState::new(store.clone(), "r");
        let keys = RunKeys::new("r");
        assert_eq!(state.restarts().await.unwrap(), (Restarts::default(), 0));
        assert_eq!(state.lost("n").await.unwrap(), loss::LEASE_EXPIRED);
        for key in [keys.restarts(), keys.finished(), keys.plan(1)] {
            store.put(&key, b"{".to_vec(), None).await.unwrap();
        }
        assert!(state.restarts().await.is_err());
        assert!(state.finished().await.is_err());
        assert!(state.plan(1).await.is_err());
    }
}
