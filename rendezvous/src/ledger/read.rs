//! Reading the ledger: the sealed manifests, the ones marked bad, and the resume point of a formation.

use std::collections::BTreeMap;

use super::*;

impl Ledger {
    /// Every sealed manifest, oldest first.
    ///
    /// # Errors
    /// Store errors; a manifest that does not decode is [`StoreError::Corrupt`].
    pub async fn manifests(&self) -> Result<Vec<Manifest>, StoreError> {
        let mut out = Vec::new();
        for kv in self
            .store
            .get_prefix(&self.keys.ckpt_manifest_prefix())
            .await?
        {
            out.push(
                serde_json::from_slice::<Manifest>(&kv.value).map_err(|e| corrupt(&kv.key, e))?,
            );
        }
        out.sort_by_key(|m| (m.step, m.generation));
        Ok(out)
    }

    /// Manifests marked bad: id → why.
    ///
    /// # Errors
    /// Store errors.
    pub async fn bad(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let prefix = self.keys.ckpt_bad_prefix();
        Ok(self
            .store
            .get_prefix(&prefix)
            .await?
            .into_iter()
            .map(|kv| (kv.key[prefix.len()..].to_string(), kv.value_str()))
            .collect())
    }

    /// The newest sealed manifest not marked bad, among the ledger's and `hints` (manifests read
    /// from checkpoint directories by the joining nodes, for a run whose store is new).
    ///
    /// # Errors
    /// Store errors.
    pub async fn resume_point(&self, hints: &[&Manifest]) -> Result<ResumePoint, StoreError> {
        let latest_revision = self
            .store
            .get(&self.keys.ckpt_latest())
            .await?
            .map_or(0, |kv| kv.mod_revision);
        let bad = self.bad().await?;
        let stored = self.manifests().await?;
        let best_stored = stored
            .into_iter()
            .rev()
            .find(|m| !bad.contains_key(&m.id()));
        let best_hint = hints
            .iter()
            .filter(|m| m.run_id == self.run_id && !bad.contains_key(&m.id()))
            .max_by_key(|m| (m.step, m.generation))
            .map(|m| (*m).clone());
        let (manifest, import) = match (best_stored, best_hint) {
            (Some(s), Some(h)) if (h.step, h.generation) > (s.step, s.generation) => {
                (Some(h), true)
            }
            (Some(s), _) => (Some(s), false),
            (None, Some(h)) => (Some(h), true),
            (None, None) => (None, false),
        };
        Ok(ResumePoint {
            manifest,
            latest_revision,
            import,
        })
    }
}
