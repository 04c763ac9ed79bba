//! Reading the ledger: the sealed manifests, the ones marked bad, and the resume point of a formation.

use std::collections::BTreeMap;

use super::*;

impl Ledger {
    /// Every sealed manifest, oldest first.
    ///
    /// # Errors
    /// Store errors; a manifest that does not decode is [`StoreError::Corrupt`].
    pub async fn manifests(&self) -> Result<Vec<Manifest>, StoreError> {
        self.state.manifests().await
    }

    /// Manifests marked bad: id → why.
    ///
    /// # Errors
    /// Store errors.
    pub async fn bad(&self) -> Result<BTreeMap<String, String>, StoreError> {
        self.state.bad_manifests().await
    }

    /// The newest sealed manifest not marked bad, among the ledger's and `hints` (manifests read
    /// from checkpoint directories by the joining nodes, for a run whose store is new); see
    /// [`resume::newest_good`].
    ///
    /// # Errors
    /// Store errors.
    pub async fn resume_point(&self, hints: &[&Manifest]) -> Result<ResumePoint, StoreError> {
        let latest_revision = self.state.ckpt_latest().await?.map_or(0, |(_, rev)| rev);
        let bad = self.bad().await?;
        let stored = self.manifests().await?;
        let (manifest, import) = resume::newest_good(&self.run_id, stored, &bad, hints);
        Ok(ResumePoint {
            manifest,
            latest_revision,
            import,
        })
    }
}
