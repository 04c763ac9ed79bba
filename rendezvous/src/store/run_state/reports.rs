//! The door's node reports (`reports/<kind>/<node>`): written by a node's session, read by
//! `status`, the partition rule and the pace exchange ([`crate::store::reports`]).

use std::collections::BTreeMap;

use super::RunState;
use crate::store::reports::{self, ReportKind};
use crate::store::LeaseId;
use crate::StoreError;

impl RunState {
    /// Writes `node`'s report of `kind` (JSON, checked by [`reports::invalid`]), under `lease`
    /// when given.
    pub async fn put_report(
        &self,
        kind: ReportKind,
        node: &str,
        json: String,
        lease: Option<LeaseId>,
    ) -> Result<(), StoreError> {
        let key = reports::key(&self.keys, kind, node);
        self.store
            .put(&key, json.into_bytes(), lease)
            .await
            .map(drop)
    }

    /// The job's pace in generation `generation`: every rank's median seconds per step, from
    /// every node's pace report of that generation (others and unparsable ones left out).
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn pace(&self, generation: u64) -> Result<BTreeMap<u32, f64>, StoreError> {
        let prefix = format!("{}reports/pace/", self.keys.prefix());
        let mut out = BTreeMap::new();
        for kv in self.store.get_prefix(&prefix).await? {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&kv.value) else {
                continue;
            };
            if v["generation"].as_u64() != Some(generation) {
                continue;
            }
            for (rank, secs) in v["ranks"].as_object().into_iter().flatten() {
                if let (Ok(r), Some(s)) = (rank.parse(), secs.as_f64()) {
                    out.insert(r, s);
                }
            }
        }
        Ok(out)
    }

    /// Every report of the run: kind → node → its JSON (unparsable values left out).
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn reports(
        &self,
    ) -> Result<BTreeMap<String, BTreeMap<String, serde_json::Value>>, StoreError> {
        let prefix = format!("{}reports/", self.keys.prefix());
        let mut out: BTreeMap<String, BTreeMap<String, serde_json::Value>> = BTreeMap::new();
        for kv in self.store.get_prefix(&prefix).await? {
            let rest = &kv.key[prefix.len()..];
            let Some((kind, node)) = rest.split_once('/') else {
                continue;
            };
            if let Ok(v) = serde_json::from_slice(&kv.value) {
                out.entry(kind.to_string())
                    .or_default()
                    .insert(node.to_string(), v);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::Store;
    use crate::MemoryStore;

    #[tokio::test]
    async fn reports_are_read_back_by_kind_and_node() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let state = RunState::new(store.clone(), "r");
        state
            .put_report(ReportKind::Stragglers, "n1", r#"[{"rank":3}]"#.into(), None)
            .await
            .unwrap();
        let k = reports::key(state.keys(), ReportKind::Preflight, "n0");
        store.put(&k, b"not json".to_vec(), None).await.unwrap();
        let all = state.reports().await.unwrap();
        assert_eq!(all["stragglers"]["n1"][0]["rank"], 3);
        assert!(
            !all.contains_key("preflight"),
            "unparsable values are left out"
        );
    }
}
