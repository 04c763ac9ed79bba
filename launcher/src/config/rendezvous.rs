//! How this node finds its group: the rendezvous mode and run id, chosen by torchrun's rules,
//! and the settings of the rendezvous that come with it ([`RdzvConfig`]).

use std::collections::BTreeMap;

use super::timing::Timing;
use drun_rendezvous::decisions::envcheck::EnvCheck;

/// How the group forms: what the agent brings to the rendezvous and how long it waits there.
#[derive(Debug, Clone)]
pub struct RdzvConfig {
    /// `--nnodes` MIN.
    pub min_nodes: u32,
    /// `--nnodes` MAX.
    pub max_nodes: u32,
    /// The backend and where it is.
    pub mode: RendezvousMode,
    /// Parsed `--rdzv-conf`.
    pub conf: BTreeMap<String, String>,
    /// Rendezvous timing knobs (from `--rdzv-conf`).
    pub timing: Timing,
    /// `--node-rank` pinned for a dynamic rendezvous.
    pub requested_node_rank: Option<u32>,
    /// `--local-addr`: address other nodes use to reach this one (else chosen per backend).
    pub advertise_addr: Option<String>,
    /// `--env-check`: how a node whose environment differs is judged at the round.
    pub env_check: EnvCheck,
    /// `--fingerprint-cmd`: a command whose output joins the environment fingerprint.
    pub fingerprint_cmd: Option<String>,
}

/// How this node finds its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousMode {
    /// One-node group on the in-process rendezvous (embedded in-memory store). MASTER_ADDR is
    /// `master_addr`; MASTER_PORT is reserved per generation unless `fixed_port` is given.
    Embedded {
        /// Address workers use to reach rank 0's store.
        master_addr: String,
        /// `--master-port` of a one-node static launch; `None` = a fresh free port per generation.
        fixed_port: Option<u16>,
    },
    /// torchrun's static backend across several nodes: no rendezvous at all.
    Static {
        /// `--node-rank`.
        node_rank: u32,
        /// `--master-addr`.
        master_addr: String,
        /// `--master-port` (default 29500).
        master_port: u16,
    },
    /// `drun-rendezvous` replicas (`--rdzv-backend drun`), `host:port` each.
    Server {
        /// Replica endpoints, tried in order on failure.
        endpoints: Vec<String>,
    },
    /// torchrun's c10d backend: the agent that can bind `endpoint` hosts an embedded server.
    C10d {
        /// `host:port`.
        endpoint: String,
        /// `--rdzv-conf is_host=`: force (true) or forbid (false) hosting.
        is_host: Option<bool>,
    },
    /// Every agent runs the rendezvous directly on etcd v3 (`--rdzv-backend etcd`/`etcd-v2`).
    Etcd {
        /// etcd client endpoints.
        endpoints: Vec<String>,
    },
}

impl std::fmt::Display for RendezvousMode {
    /// As printed at start: the backend in the words of `docs/guide/multi-node-and-elastic.md`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RendezvousMode::Embedded { .. } => write!(f, "embedded (this agent, in memory)"),
            RendezvousMode::Static {
                master_addr,
                master_port,
                ..
            } => write!(f, "static (master {master_addr}:{master_port})"),
            RendezvousMode::Server { endpoints } => {
                write!(f, "drun servers {}", endpoints.join(","))
            }
            RendezvousMode::C10d {
                endpoint,
                is_host: Some(true),
            } => write!(f, "embedded (c10d) on {endpoint}, hosted by this agent"),
            RendezvousMode::C10d {
                endpoint,
                is_host: Some(false),
            } => write!(f, "embedded (c10d) on {endpoint}, hosted by another agent"),
            RendezvousMode::C10d { endpoint, .. } => {
                write!(
                    f,
                    "c10d on {endpoint} (hosted by the agent that can bind it)"
                )
            }
            RendezvousMode::Etcd { endpoints } => write!(f, "etcd {}", endpoints.join(",")),
        }
    }
}

impl RendezvousMode {
    /// Whether the node rank is fixed by the command line (no dynamic rendezvous).
    pub fn is_static(&self) -> bool {
        matches!(
            self,
            RendezvousMode::Static { .. }
                | RendezvousMode::Embedded {
                    fixed_port: Some(_),
                    ..
                }
        )
    }

    /// Whether the rendezvous store lives in an agent's memory (lost with the job).
    pub fn store_is_ephemeral(&self) -> bool {
        matches!(
            self,
            RendezvousMode::Embedded { .. } | RendezvousMode::C10d { .. }
        )
    }
}
