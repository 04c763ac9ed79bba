//! A node's request to join (key `waiting/<node>`), its environment's fingerprint, and the
//! plan of a generation it is admitted to (key `gen/<g>/plan`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::members::no_port;
use super::{Cursor, Manifest, Member, Members, ShardFile};

/// A node asking to join: what the decision and the ranking need to know of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// Stable node identity (the rank sort key, like torchrun's `--local-addr`/FQDN).
    pub node_id: String,
    /// Address other nodes' workers use to reach this node.
    pub advertise_addr: String,
    /// Worker processes on this node (LOCAL_WORLD_SIZE), ≥ 1.
    pub slots: u32,
    /// `--node-rank` if the user pinned one.
    pub requested_node_rank: Option<u32>,
    /// A port this node holds reserved for MASTER_PORT should it become node rank 0.
    pub master_port: u16,
    /// UDP port on `advertise_addr` where this node's agent answers its generation's peer
    /// probes; 0: none (an older agent).
    #[serde(default, skip_serializing_if = "no_port")]
    pub probe_port: u16,
}

/// A node's request to join, as written under `waiting/<node>`: its [`Candidate`] record and,
/// beside it, the checkpoint it found on disk. Serialized flat, as one JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// Who asks.
    #[serde(flatten)]
    pub candidate: Candidate,
    /// The newest manifest found in this node's checkpoint directory (`--ckpt-dir`), so a run
    /// whose store is new (fresh etcd, requeued job on the embedded store) can resume from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_hint: Option<Box<Manifest>>,
    /// The node's environment and launch config, compared across the members at formation
    /// ([`crate::decisions::envcheck`]); empty: an agent that sends none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub fingerprint: Fingerprint,
    /// The node's `--env-check`; `None`: not sent (an older agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_check: Option<EnvCheck>,
    /// `--ckpt-memory`: the checkpoint steps the node's agent holds in memory (its own staged
    /// copies, replicas it received, copies it fetched for a resume), each file with its
    /// SHA-256; a re-forming world may resume from them ([`crate::ledger::memory`]). Empty:
    /// nothing held (or an older agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldStep>,
}

/// One checkpoint step a node holds in memory, as it reports it in its join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldStep {
    /// The step.
    pub step: u64,
    /// The generation that saved it.
    pub generation: u64,
    /// The node that saved these files (the holder itself for its own staged copy, else the
    /// node whose replica it is).
    pub saved_by: String,
    /// WORLD_SIZE of the generation that saved it, when the holder knows it (its own copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// The data cursor after the step, when the holder knows it (its own copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Cursor>,
    /// The files held, each with its rank, final path in `--ckpt-dir`, size and SHA-256.
    pub files: Vec<ShardFile>,
    /// When the saver's ranks went on training after they staged it (milliseconds since the
    /// Unix epoch), when the holder knows it (its own copy): what a re-form that resumes it
    /// keeps of the work ([`crate::decisions::formation::lost_work`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_at_ms: Option<u64>,
}

/// A resume point taken from the survivors' copies in memory (a step staged by every node
/// of its generation, not yet sealed on disk): which member serves each rank's files. Every
/// agent fetches what it lacks from these before its workers start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryResume {
    /// Per global rank of the step, the node id of the member that serves its files.
    pub sources: BTreeMap<u32, String>,
}

impl From<Candidate> for Join {
    fn from(candidate: Candidate) -> Self {
        Join {
            candidate,
            resume_hint: None,
            fingerprint: Default::default(),
            env_check: None,
            held: Vec::new(),
        }
    }
}

/// One node's environment: key → value (e.g. `torch` → `2.4.0`).
pub type Fingerprint = BTreeMap<String, String>;

/// `--env-check`: what a difference between the members' environments does.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum EnvCheck {
    /// Compare nothing but the [`crate::decisions::envcheck::BREAKING`] keys.
    Off,
    /// Print one table of the differing keys on every agent at formation.
    #[default]
    Warn,
    /// Refuse to form: every node of the round ends with exit 2.
    Strict,
}

impl EnvCheck {
    /// Parses `off`, `warn` or `strict`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(EnvCheck::Off),
            "warn" => Some(EnvCheck::Warn),
            "strict" => Some(EnvCheck::Strict),
            _ => None,
        }
    }

    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            EnvCheck::Off => "off",
            EnvCheck::Warn => "warn",
            EnvCheck::Strict => "strict",
        }
    }
}

/// What the members of a formed group agreed on (pure data, stored with the formation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Door {
    /// The keys every member that sent a fingerprint has, with the value they share.
    pub agreed: Fingerprint,
    /// The keys the members differ on (a value, or present on some only): not compared.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub disputed: std::collections::BTreeSet<String>,
    /// The group's setting: the strictest among its members.
    pub env_check: EnvCheck,
}

/// The assignment of generation `generation`. Identical for every agent of the generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Run id (`--rdzv-id`).
    pub run_id: String,
    /// Generation number, ≥ 1; the fencing token.
    pub generation: u64,
    /// Members in node-rank order. Shared: a server holds one copy of a thousand-node plan
    /// for all the sessions of its generation, not one each.
    pub members: Members,
    /// Sum of all slots (WORLD_SIZE).
    pub world_size: u32,
    /// Node rank 0's advertised address.
    pub master_addr: String,
    /// Port node rank 0 holds reserved for its rank-0 worker's store.
    pub master_port: u16,
    /// Group restarts caused by worker failures so far (job-wide).
    pub restarts_failures: u32,
    /// Group restarts caused by membership changes so far.
    pub restarts_membership: u32,
    /// The checkpoint every rank resumes from: the newest sealed manifest not marked bad at
    /// formation (`None`: start fresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Manifest>,
    /// Set when `resume` is a step resumed from the survivors' copies in memory
    /// (`--ckpt-replicas`), not a sealed checkpoint: who serves each rank's files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_memory: Option<MemoryResume>,
    /// Lines every agent prints as a warning when the generation forms (e.g. two nodes pinned
    /// the same node rank and the tie went by node id).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Why the group formed when it did, from the decision core ("3 of max 3 nodes joined",
    /// "every surviving member rejoined with 2 nodes ..."); empty for a static plan.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub formed_because: String,
    /// The number of nodes when `members` lists only the receiving node's entry: a plan of
    /// more than [`FULL_PLAN_NODES`] nodes as a `drun-rendezvous` server sends it to one agent
    /// (what the agent needs is its own entry, the world size and the master). 0: `members`
    /// is complete.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub node_count: u32,
}

/// Plans of at most this many nodes reach every agent whole (its log names every node);
/// larger ones carry only the receiving node's entry, so a formation of N agents sends O(N)
/// bytes, not O(N²).
pub const FULL_PLAN_NODES: usize = 64;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Plan {
    /// This node's entry, if it is a member.
    pub fn member(&self, node_id: &str) -> Option<&Member> {
        self.members.position(node_id).map(|i| &self.members[i])
    }

    /// The number of nodes of the generation (GROUP_WORLD_SIZE).
    pub fn node_count(&self) -> usize {
        (self.node_count as usize).max(self.members.len())
    }

    /// Whether `members` lists every node (not only the receiving one's entry).
    pub fn complete(&self) -> bool {
        self.node_count as usize <= self.members.len()
    }

    /// The plan as sent to agent `node_id`: whole up to [`FULL_PLAN_NODES`] nodes, else with
    /// only that node's entry and the node count.
    pub fn for_node(&self, node_id: &str) -> Plan {
        if self.members.len() <= FULL_PLAN_NODES {
            return self.clone();
        }
        let own: Vec<Member> = self.member(node_id).cloned().into_iter().collect();
        Plan {
            members: own.into(),
            node_count: self.node_count() as u32,
            ..self.clone()
        }
    }
}

#[cfg(test)]
impl Candidate {
    /// A test candidate on loopback with `slots` workers (no requested rank, no probe port).
    pub(crate) fn local(id: &str, slots: u32) -> Self {
        Candidate {
            node_id: id.into(),
            advertise_addr: "127.0.0.1".into(),
            slots,
            requested_node_rank: None,
            master_port: 29500,
            probe_port: 0,
        }
    }
}
