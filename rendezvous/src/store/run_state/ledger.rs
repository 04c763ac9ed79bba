//! The door's reads and transactions for the checkpoint ledger (`ckpt/…`): a node's commit of
//! a step, sealing a manifest, retention's deletions, marking a manifest bad.
//!
//! The rules (who may commit, when a step seals, what retention keeps) are
//! [`crate::ledger`]'s; every guard here is the one its method names.

use std::collections::BTreeMap;

use super::{decode, encode, encode_generation, RunState};
use crate::store::records::{Manifest, NodeCommit};
use crate::store::{Compare, Op};
use crate::StoreError;

/// One node's record of a step as stored (`ckpt/shards/<g>/<step>/<node>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredShard {
    /// Its key: what [`RunState::prune`] deletes.
    pub key: String,
    /// The record; `None` when it does not decode (retention deletes it).
    pub commit: Option<NodeCommit>,
}

/// What retention deletes after a seal, in one batch of transactions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prune {
    /// Node records of steps that will never seal or sealed already ([`StoredShard::key`]).
    pub shard_keys: Vec<String>,
    /// Manifests to forget (with their bad marks), by id.
    pub manifest_ids: Vec<String>,
}

/// How many deletions go in one transaction (etcd allows 128 ops).
const PRUNE_CHUNK: usize = 100;

impl RunState {
    /// Every sealed manifest, oldest first (by step, then generation).
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when a manifest does not decode; the store's.
    pub async fn manifests(&self) -> Result<Vec<Manifest>, StoreError> {
        let mut out = self
            .store
            .get_prefix(&self.keys.ckpt_manifest_prefix())
            .await?
            .iter()
            .map(|kv| decode::<Manifest>(&kv.key, &kv.value))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_by_key(|m| (m.step, m.generation));
        Ok(out)
    }

    /// Manifests marked bad: id → why.
    pub async fn bad_manifests(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let prefix = self.keys.ckpt_bad_prefix();
        Ok(self
            .store
            .get_prefix(&prefix)
            .await?
            .into_iter()
            .map(|kv| (kv.key[prefix.len()..].to_string(), kv.value_str()))
            .collect())
    }

    /// Whether manifest `id` is sealed (`ckpt/manifest/<id>` exists).
    pub async fn is_sealed(&self, id: &str) -> Result<bool, StoreError> {
        self.exists(&self.keys.ckpt_manifest(id)).await
    }

    /// Writes `rec` (`ckpt/shards/<g>/<step>/<node>`, `g` its generation) if generation `g`
    /// runs (`gen/current == g`), the node's membership key of `g` exists and the step is not
    /// sealed yet; whether the guards held.
    pub async fn commit_node(&self, rec: &NodeCommit) -> Result<bool, StoreError> {
        let g = rec.generation;
        let id = crate::store::records::manifest_id(rec.step, g);
        self.txn(
            vec![
                self.generation_is(g),
                Compare::Exists(self.keys.member(g, &rec.node_id)),
                Compare::Missing(self.keys.ckpt_manifest(&id)),
            ],
            vec![Op::put(
                self.keys.ckpt_shard(g, rec.step, &rec.node_id),
                encode(rec),
            )],
        )
        .await
    }

    /// The node records of step `step` of generation `g`, in key order.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when one does not decode; the store's.
    pub async fn step_commits(&self, g: u64, step: u64) -> Result<Vec<NodeCommit>, StoreError> {
        self.store
            .get_prefix(&self.keys.ckpt_step_prefix(g, step))
            .await?
            .iter()
            .map(|kv| decode(&kv.key, &kv.value))
            .collect()
    }

    /// Seals `manifest` for the running generation `g`: writes `ckpt/manifest/<id>`, deletes
    /// `g`'s node records of its step and, when `moves_latest`, points `ckpt/latest` at it;
    /// guarded by `gen/current` being `g` (the manifest's generation, but for a step resumed from
    /// memory, sealed by the generation that resumed it), `ckpt/latest`'s `mod_revision` being `latest_revision` (0: missing) and the
    /// manifest not being sealed yet. Whether the guards held.
    pub async fn seal(
        &self,
        manifest: &Manifest,
        g: u64,
        latest_revision: i64,
        moves_latest: bool,
    ) -> Result<bool, StoreError> {
        let id = manifest.id();
        let mut ops = vec![
            Op::put(self.keys.ckpt_manifest(&id), encode(manifest)),
            Op::DeletePrefix(self.keys.ckpt_step_prefix(g, manifest.step)),
        ];
        if moves_latest {
            ops.push(Op::put(self.keys.ckpt_latest(), id.clone()));
        }
        self.txn(
            vec![
                self.generation_is(g),
                Compare::ModRevisionEquals(self.keys.ckpt_latest(), latest_revision),
                Compare::Missing(self.keys.ckpt_manifest(&id)),
            ],
            ops,
        )
        .await
    }

    /// Every node record of every step not sealed or pruned yet, in key order.
    pub async fn stored_shards(&self) -> Result<Vec<StoredShard>, StoreError> {
        Ok(self
            .store
            .get_prefix(&self.keys.ckpt_shards_prefix())
            .await?
            .into_iter()
            .map(|kv| StoredShard {
                commit: serde_json::from_slice(&kv.value).ok(),
                key: kv.key,
            })
            .collect())
    }

    /// Deletes what retention dropped (see [`Prune`]), a hundred keys per transaction.
    pub async fn prune(&self, prune: &Prune) -> Result<(), StoreError> {
        let mut ops: Vec<Op> = prune
            .shard_keys
            .iter()
            .map(|k| Op::Delete(k.clone()))
            .collect();
        for id in &prune.manifest_ids {
            ops.push(Op::Delete(self.keys.ckpt_manifest(id)));
            ops.push(Op::Delete(self.keys.ckpt_bad(id)));
        }
        for chunk in ops.chunks(PRUNE_CHUNK) {
            self.txn(vec![], chunk.to_vec()).await?;
        }
        Ok(())
    }

    /// Marks manifest `id` bad (`ckpt/bad/<id>`), with why.
    pub async fn mark_bad(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        self.store
            .put(&self.keys.ckpt_bad(id), reason.as_bytes().to_vec(), None)
            .await
            .map(drop)
    }

    /// The guard "generation `g` runs" (`gen/current == g`).
    fn generation_is(&self, g: u64) -> Compare {
        Compare::ValueEquals(self.keys.gen_current(), encode_generation(g))
    }
}
