//! [`Member`]: one node of a plan; [`Members`]: a plan's member list, shared between clones, with a lookup by node id.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

/// One node of a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Node identity.
    pub node_id: String,
    /// Address the node advertised.
    pub advertise_addr: String,
    /// GROUP_RANK, dense in `0..members.len()`.
    pub node_rank: u32,
    /// LOCAL_WORLD_SIZE of this node.
    pub slots: u32,
    /// Global rank of this node's local rank 0.
    pub base_rank: u32,
    /// UDP port on `advertise_addr` where the node's agent answers peer probes; 0: none (an
    /// older agent).
    #[serde(default, skip_serializing_if = "no_port")]
    pub probe_port: u16,
}

/// Whether a port field is unset (0), so older records stay as they were.
pub(crate) fn no_port(p: &u16) -> bool {
    *p == 0
}

/// A plan's member list in node-rank order, shared by every clone of the plan, with a lookup by
/// node id built once on first use (a server's thousand sessions each look themselves up in one
/// thousand-member plan). Compares, prints and serializes as the plain list.
#[derive(Clone, Default)]
pub struct Members {
    list: Arc<[Member]>,
    by_id: Arc<OnceLock<HashMap<String, usize>>>,
}

impl Members {
    /// The index of `node_id` in node-rank order, if it is a member.
    pub fn position(&self, node_id: &str) -> Option<usize> {
        if self.list.len() <= 8 {
            return self.list.iter().position(|m| m.node_id == node_id);
        }
        self.by_id
            .get_or_init(|| {
                self.list
                    .iter()
                    .enumerate()
                    .map(|(i, m)| (m.node_id.clone(), i))
                    .collect()
            })
            .get(node_id)
            .copied()
    }
}

impl std::ops::Deref for Members {
    type Target = [Member];
    fn deref(&self) -> &[Member] {
        &self.list
    }
}

impl PartialEq for Members {
    fn eq(&self, other: &Self) -> bool {
        self.list == other.list
    }
}

impl Eq for Members {}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.list.fmt(f)
    }
}

impl From<Vec<Member>> for Members {
    fn from(v: Vec<Member>) -> Self {
        Members {
            list: v.into(),
            by_id: Arc::default(),
        }
    }
}

impl FromIterator<Member> for Members {
    fn from_iter<I: IntoIterator<Item = Member>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

impl Serialize for Members {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.list.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<Member>::deserialize(d).map(Into::into)
    }
}
