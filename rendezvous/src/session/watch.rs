//! The running generation's watch as the generation core reads it: a store event of the keys
//! a member watches, decoded into an [`Input`] of the generation core.

use super::generation::Input;
use crate::store::keys::RunKeys;
use crate::store::WatchEvent;
use crate::StoreError;

/// Turns a watch event of generation `g` into an [`Input`]. A corrupt `finished` is an error.
pub(crate) fn classify(keys: &RunKeys, g: u64, ev: WatchEvent) -> Result<Input, StoreError> {
    let waiting = keys.waiting_prefix();
    let members = keys.members_prefix(g);
    let silent = keys.silent_prefix(g);
    let accusation = |key: &str, still: bool| {
        let (accused, by) = key[silent.len()..].split_once('/')?;
        Some(Input::Accused {
            accused: accused.to_string(),
            by: by.to_string(),
            still,
        })
    };
    Ok(match ev {
        WatchEvent::Put(kv) if kv.key.starts_with(&silent) => {
            accusation(&kv.key, true).unwrap_or(Input::Other)
        }
        WatchEvent::Delete(key, _) if key.starts_with(&silent) => {
            accusation(&key, false).unwrap_or(Input::Other)
        }
        WatchEvent::Put(kv) if kv.key == keys.closed(g) => Input::Closed(kv.value_str()),
        WatchEvent::Put(kv)
            if kv.key == keys.preempt(g)
                || kv.key == keys.scale_up_save(g)
                || kv.key.starts_with(&keys.save_due_prefix(g)) =>
        {
            Input::SaveRequest(kv.value.to_vec())
        }
        WatchEvent::Put(kv) if kv.key == keys.ckpt_latest() => Input::Sealed(kv.value_str()),
        WatchEvent::Put(kv) if kv.key == keys.finished() => Input::Finished(
            serde_json::from_slice(&kv.value).map_err(|e| StoreError::Corrupt {
                key: kv.key.clone(),
                reason: e.to_string(),
            })?,
        ),
        WatchEvent::Put(kv) if kv.key.starts_with(&waiting) => Input::Waiting(
            kv.key[waiting.len()..].to_string(),
            serde_json::from_slice(&kv.value).ok(),
        ),
        WatchEvent::Put(kv) if kv.key.starts_with(&members) => {
            Input::MemberUp(kv.key[members.len()..].to_string())
        }
        WatchEvent::Delete(key, _) if key.starts_with(&waiting) => Input::WaitingGone,
        WatchEvent::Delete(key, _) if key.starts_with(&members) => {
            Input::MemberGone(key[members.len()..].to_string())
        }
        _ => Input::Other,
    })
}

#[cfg(test)]
mod tests;
