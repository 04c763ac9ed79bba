//! The worker environment: torchrun's contract overlaid on the agent's full environment.
//!
//! Computed as `LocalElasticAgent._start_workers` does (the table of
//! `docs/reference/worker-environment.md`): RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_WORLD_SIZE,
//! ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
//! TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE,
//! TORCHELASTIC_ERROR_FILE, TORCHELASTIC_SIGNALS_TO_HANDLE, TORCH_NCCL_ASYNC_ERROR_HANDLING (kept
//! if set, else `1`) and OMP_NUM_THREADS (`1` when unset and more than one local worker), plus
//! drun's own `DRUN_*`; under `--hang-timeout`, torch's flight-recorder size (unless set). Inherited values of the contract variables (e.g. RANK from an outer
//! launcher) are overwritten, never trusted.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use drun_rendezvous::{Member, Plan};

/// Per-worker inputs that are not in the plan.
#[derive(Debug, Clone)]
pub struct WorkerSlot<'a> {
    /// LOCAL_RANK.
    pub local_rank: u32,
    /// TORCHELASTIC_RESTART_COUNT.
    pub restart_count: u32,
    /// TORCHELASTIC_MAX_RESTARTS.
    pub max_restarts: u32,
    /// ROLE_NAME.
    pub role: &'a str,
    /// TORCHELASTIC_ERROR_FILE.
    pub error_file: &'a Path,
    /// TORCHELASTIC_SIGNALS_TO_HANDLE.
    pub signals_to_handle: &'a str,
    /// TORCHELASTIC_USE_AGENT_STORE: `True` when the agent hosts the store, else `False`.
    pub use_agent_store: &'static str,
    /// DRUN_AGENT_ID: unique per agent process; drun finds escaped descendants by it.
    pub agent_id: &'a str,
    /// DRUN_AGENT_SOCK: the agent's worker API socket.
    pub agent_sock: Option<&'a Path>,
    /// DRUN_CKPT_DIR (`--ckpt-dir`).
    pub ckpt_dir: Option<&'a Path>,
    /// DRUN_RESUME_MANIFEST: the manifest file of `plan.resume`.
    pub resume_manifest: Option<&'a Path>,
    /// DRUN_CKPT_STAGE_DIR: the agent's staging directory (`--ckpt-memory`), and
    /// DRUN_CKPT_STAGE_SHARE: a local rank's share of its budget in bytes (a rank makes no spare
    /// staging file the share cannot hold).
    pub ckpt_stage: Option<(&'a Path, u64)>,
    /// The staged copy of `plan.resume` this agent holds complete: DRUN_RESUME_PATH names it
    /// instead of `--ckpt-dir` (a resume from memory).
    pub resume_staged: Option<&'a Path>,
    /// `--virtual-local-rank`: LOCAL_RANK 0 and only this worker's GPU visible.
    pub virtual_local_rank: bool,
    /// `--hang-timeout` is on: torch's flight recorder is on unless the user set its size
    /// ([`FLIGHT_RECORDER_VARS`]).
    pub flight_recorder: bool,
}

/// The sizes of torch's flight recorder (its ring buffer of the last collectives, per process;
/// the first set wins, 0 turns it off). Under `--hang-timeout` drun sets the first to
/// [`FLIGHT_RECORDER_ENTRIES`] unless the user set either, so that a hang's dump has the
/// collectives in it (gloo records none unless it is set). Not the second: torch 2.15 warns
/// on every rank that it is deprecated, and reads the first for NCCL too.
pub const FLIGHT_RECORDER_VARS: &[&str] = &["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"];

/// Entries in the flight recorder's ring buffer: torch's own default size, the one its docs
/// suggest.
pub const FLIGHT_RECORDER_ENTRIES: &str = "2000";

/// Under `--virtual-local-rank`, the one device local rank `local_rank` sees, as torchrun picks
/// it: the entry at `local_rank` of the agent's visible-devices list, or the local rank itself
/// when the agent has none; `None` when the list is too short.
pub fn virtual_device(parent_visible: Option<&str>, local_rank: u32) -> Option<String> {
    match parent_visible {
        None => Some(local_rank.to_string()),
        Some(list) => list
            .split(',')
            .nth(local_rank as usize)
            .map(|d| d.trim().to_string()),
    }
}

/// drun's checkpoint variables, removed when inherited and not set for this worker.
pub const CKPT_VARS: &[&str] = &[
    "DRUN_AGENT_SOCK",
    "DRUN_CKPT_DIR",
    "DRUN_RESUME_STEP",
    "DRUN_RESUME_GENERATION",
    "DRUN_RESUME_PATH",
    "DRUN_RESUME_MANIFEST",
    "DRUN_RESUME_WORLD_SIZE",
    "DRUN_DATA_EPOCH",
    "DRUN_GLOBAL_SAMPLES",
    "DRUN_SAMPLE_OFFSET",
    "DRUN_CKPT_VERSION",
    "DRUN_CKPT_STAGE_DIR",
    "DRUN_CKPT_STAGE_SHARE",
];

/// The agent's secrets, never passed on to workers: the rendezvous token and the etcd password
/// (and where they are).
pub const SECRET_VARS: &[&str] = &[
    "DRUN_RDZV_TOKEN",
    "DRUN_RDZV_TOKEN_FILE",
    "DRUN_ETCD_PASSWORD",
    "DRUN_ETCD_PASSWORD_FILE",
    "DRUN_SLURM_SECRET",
];

/// Variables drun sets for every worker (and therefore overwrites when inherited).
pub const CONTRACT_VARS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
];

/// The complete environment of one worker: `inherited` (the agent's own environment) with the
/// contract variables of `member`'s worker `slot` in `plan` laid over it.
pub fn worker_env(
    inherited: &BTreeMap<OsString, OsString>,
    plan: &Plan,
    member: &Member,
    slot: &WorkerSlot<'_>,
) -> BTreeMap<OsString, OsString> {
    let mut env = base_env(inherited, member.slots, slot.flight_recorder);
    let rank = member.base_rank + slot.local_rank;
    let mut set = |k: &str, v: String| {
        env.insert(OsString::from(k), OsString::from(v));
    };
    set("RANK", rank.to_string());
    set("LOCAL_RANK", slot.local_rank.to_string());
    if slot.virtual_local_rank {
        // HIP_VISIBLE_DEVICES wins over CUDA_VISIBLE_DEVICES on ROCm: it is the list to pick
        // from when the agent has it, and both are set then (as torchrun does).
        let var = |k: &str| {
            inherited
                .get(&OsString::from(k))
                .and_then(|v| v.to_str())
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let hip = var("HIP_VISIBLE_DEVICES");
        let parent = hip.clone().or_else(|| var("CUDA_VISIBLE_DEVICES"));
        // The config refused a list shorter than --nproc-per-node.
        let device = virtual_device(parent.as_deref(), slot.local_rank).unwrap_or_default();
        set("LOCAL_RANK", "0".into());
        if hip.is_some() {
            set("HIP_VISIBLE_DEVICES", device.clone());
        }
        set("CUDA_VISIBLE_DEVICES", device);
    }
    set("GROUP_RANK", member.node_rank.to_string());
    set("ROLE_RANK", rank.to_string());
    set("ROLE_NAME", slot.role.to_string());
    set("LOCAL_WORLD_SIZE", member.slots.to_string());
    set("WORLD_SIZE", plan.world_size.to_string());
    set("GROUP_WORLD_SIZE", plan.node_count().to_string());
    set("ROLE_WORLD_SIZE", plan.world_size.to_string());
    set("MASTER_ADDR", plan.master_addr.clone());
    set("MASTER_PORT", plan.master_port.to_string());
    set("TORCHELASTIC_RESTART_COUNT", slot.restart_count.to_string());
    set("TORCHELASTIC_MAX_RESTARTS", slot.max_restarts.to_string());
    set("TORCHELASTIC_RUN_ID", plan.run_id.clone());
    // `True`: every worker is a client of the store the agent of node rank 0 serves on
    // MASTER_PORT (crate::worker_store); `False`: worker rank 0 creates it there.
    set("TORCHELASTIC_USE_AGENT_STORE", slot.use_agent_store.into());
    set(
        "TORCHELASTIC_ERROR_FILE",
        slot.error_file.to_string_lossy().into_owned(),
    );
    set(
        "TORCHELASTIC_SIGNALS_TO_HANDLE",
        slot.signals_to_handle.to_string(),
    );
    set("DRUN_RUN_ID", plan.run_id.clone());
    set("DRUN_GENERATION", plan.generation.to_string());
    set("DRUN_RESTARTS_FAILURES", plan.restarts_failures.to_string());
    set(
        "DRUN_RESTARTS_MEMBERSHIP",
        plan.restarts_membership.to_string(),
    );
    set("DRUN_AGENT_ID", slot.agent_id.to_string());
    if let Some(p) = slot.agent_sock {
        set("DRUN_AGENT_SOCK", p.to_string_lossy().into_owned());
    }
    if let Some(p) = slot.ckpt_dir {
        set("DRUN_CKPT_DIR", p.to_string_lossy().into_owned());
        if let Some((s, share)) = slot.ckpt_stage {
            set("DRUN_CKPT_STAGE_DIR", s.to_string_lossy().into_owned());
            set("DRUN_CKPT_STAGE_SHARE", share.to_string());
        }
    }
    if let Some(m) = &plan.resume {
        // Every rank gets the same values: the global cursor, never a per-rank offset.
        set("DRUN_RESUME_STEP", m.step.to_string());
        set("DRUN_RESUME_GENERATION", m.generation.to_string());
        let dir = slot
            .resume_staged
            .map(Path::to_path_buf)
            .or_else(|| crate::ckpt::resume_dir(m, slot.resume_manifest));
        if let Some(d) = dir {
            set("DRUN_RESUME_PATH", d.to_string_lossy().into_owned());
        }
        if let Some(p) = slot.resume_manifest {
            set("DRUN_RESUME_MANIFEST", p.to_string_lossy().into_owned());
        }
        set("DRUN_RESUME_WORLD_SIZE", m.world_size.to_string());
        set("DRUN_DATA_EPOCH", m.cursor.epoch.to_string());
        set(
            "DRUN_GLOBAL_SAMPLES",
            m.cursor.consumed_in_epoch.to_string(),
        );
        set("DRUN_SAMPLE_OFFSET", m.cursor.consumed_in_epoch.to_string());
        set("DRUN_CKPT_VERSION", m.step.to_string());
    }
    env
}

/// What every worker of a node with `local_slots` workers has, whatever the plan: `inherited`
/// without the agent's secrets and checkpoint variables, with torch's defaults as drun sets
/// them (`OMP_NUM_THREADS=1` for more than one local worker, as torchrun does; with
/// `flight_recorder` (`--hang-timeout`), the flight recorder's size unless the user set it). It
/// is all that `import torch` reads of drun's, so a warm interpreter started with it before the
/// first plan imports torch as that plan's worker would.
pub fn base_env(
    inherited: &BTreeMap<OsString, OsString>,
    local_slots: u32,
    flight_recorder: bool,
) -> BTreeMap<OsString, OsString> {
    let mut env = inherited.clone();
    for k in CKPT_VARS.iter().chain(SECRET_VARS) {
        env.remove(&OsString::from(k));
    }
    env.entry(OsString::from("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
        .or_insert_with(|| OsString::from("1"));
    if local_slots > 1 {
        env.entry(OsString::from("OMP_NUM_THREADS"))
            .or_insert_with(|| OsString::from("1"));
    }
    let user_sized = FLIGHT_RECORDER_VARS
        .iter()
        .any(|k| env.contains_key(&OsString::from(k)));
    if flight_recorder && !user_sized {
        env.insert(
            OsString::from(FLIGHT_RECORDER_VARS[0]),
            OsString::from(FLIGHT_RECORDER_ENTRIES),
        );
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::{assign, Candidate};

    fn plan(slots: &[u32]) -> Plan {
        let cands: Vec<Candidate> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| Candidate {
                node_id: format!("n{i}"),
                advertise_addr: format!("10.0.0.{i}"),
                slots: *s,
                requested_node_rank: None,
                master_port: 1234,
                probe_port: 0,
            })
            .collect();
        assign("job", 2, &cands, 1, 0).unwrap()
    }

    fn slot(lr: u32) -> WorkerSlot<'static> {
        WorkerSlot {
            local_rank: lr,
            restart_count: 1,
            max_restarts: 3,
            role: "trainer",
            error_file: Path::new("/tmp/e.json"),
            signals_to_handle: "SIGTERM",
            use_agent_store: "True",
            agent_id: "agent",
            agent_sock: None,
            ckpt_dir: None,
            resume_manifest: None,
            ckpt_stage: None,
            resume_staged: None,
            virtual_local_rank: false,
            flight_recorder: false,
        }
    }

    fn get<'a>(env: &'a BTreeMap<OsString, OsString>, k: &str) -> &'a str {
        env.get(&OsString::from(k))
            .and_then(|v| v.to_str())
            .unwrap_or_else(|| panic!("{k} unset"))
    }

    #[test]
    fn ranks_are_contiguous_per_node_and_inherited_rank_is_overwritten() {
        let p = plan(&[2, 3]);
        let mut inherited = BTreeMap::new();
        inherited.insert(OsString::from("RANK"), OsString::from("99"));
        inherited.insert(OsString::from("OMP_NUM_THREADS"), OsString::from("4"));
        inherited.insert(
            OsString::from("TORCH_NCCL_ASYNC_ERROR_HANDLING"),
            OsString::from("0"),
        );
        let env = worker_env(&inherited, &p, &p.members[1], &slot(2));
        assert_eq!(get(&env, "RANK"), "4");
        assert_eq!(get(&env, "GROUP_RANK"), "1");
        assert_eq!(get(&env, "WORLD_SIZE"), "5");
        assert_eq!(get(&env, "LOCAL_WORLD_SIZE"), "3");
        assert_eq!(get(&env, "GROUP_WORLD_SIZE"), "2");
        assert_eq!(get(&env, "MASTER_ADDR"), "10.0.0.0");
        assert_eq!(get(&env, "OMP_NUM_THREADS"), "4", "user value kept");
        assert_eq!(
            get(&env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
            "0",
            "user value kept"
        );
        assert_eq!(get(&env, "DRUN_GENERATION"), "2");
        assert_eq!(get(&env, "TORCHELASTIC_USE_AGENT_STORE"), "True");
        let rank0 = WorkerSlot {
            use_agent_store: crate::worker_store::WorkerStoreMode::Rank0.use_agent_store(),
            ..slot(0)
        };
        let env = worker_env(&inherited, &p, &p.members[0], &rank0);
        assert_eq!(get(&env, "TORCHELASTIC_USE_AGENT_STORE"), "False");
    }

    #[test]
    fn omp_default_only_with_several_local_workers() {
        let p = plan(&[1]);
        let env = worker_env(&BTreeMap::new(), &p, &p.members[0], &slot(0));
        assert!(!env.contains_key(&OsString::from("OMP_NUM_THREADS")));
        let p = plan(&[2]);
        let env = worker_env(&BTreeMap::new(), &p, &p.members[0], &slot(0));
        assert_eq!(get(&env, "OMP_NUM_THREADS"), "1");
        assert_eq!(get(&env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    }

    #[test]
    fn a_virtual_local_rank_sees_its_own_gpu_as_device_0() {
        let p = plan(&[4]);
        let virt = |lr: u32| WorkerSlot {
            virtual_local_rank: true,
            ..slot(lr)
        };
        let env = worker_env(&BTreeMap::new(), &p, &p.members[0], &virt(2));
        assert_eq!(get(&env, "LOCAL_RANK"), "0");
        assert_eq!(get(&env, "RANK"), "2");
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "2");
        let mut inherited = BTreeMap::new();
        inherited.insert(
            OsString::from("CUDA_VISIBLE_DEVICES"),
            OsString::from("4,5,6,7"),
        );
        let env = worker_env(&inherited, &p, &p.members[0], &virt(1));
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "5");
        assert!(!env.contains_key(&OsString::from("HIP_VISIBLE_DEVICES")));
        inherited.insert(OsString::from("HIP_VISIBLE_DEVICES"), OsString::from("2,3"));
        let env = worker_env(&inherited, &p, &p.members[0], &virt(1));
        assert_eq!(get(&env, "HIP_VISIBLE_DEVICES"), "3");
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "3");
        // Off: the local rank and the agent's list, unchanged.
        let env = worker_env(&inherited, &p, &p.members[0], &slot(1));
        assert_eq!(get(&env, "LOCAL_RANK"), "1");
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), "4,5,6,7");
        assert_eq!(virtual_device(Some("0,1"), 2), None);
    }

    #[test]
    fn the_flight_recorder_is_sized_under_hang_timeout_unless_the_user_sized_it() {
        let p = plan(&[2]);
        let fr = |inherited: &BTreeMap<OsString, OsString>, on: bool| {
            let s = WorkerSlot {
                flight_recorder: on,
                ..slot(0)
            };
            let env = worker_env(inherited, &p, &p.members[0], &s);
            FLIGHT_RECORDER_VARS
                .iter()
                .map(|k| {
                    env.get(&OsString::from(k))
                        .map(|v| v.to_string_lossy().into_owned())
                })
                .collect::<Vec<_>>()
        };
        let none = BTreeMap::new();
        assert_eq!(
            fr(&none, false),
            vec![None, None],
            "off without --hang-timeout"
        );
        let on = Some(FLIGHT_RECORDER_ENTRIES.to_string());
        assert_eq!(
            fr(&none, true),
            vec![on, None],
            "the name torch reads first"
        );
        // The user's choice (0: off) stands, and the other variable is not set over it.
        let mut user = BTreeMap::new();
        user.insert(
            OsString::from("TORCH_NCCL_TRACE_BUFFER_SIZE"),
            OsString::from("0"),
        );
        assert_eq!(fr(&user, true), vec![None, Some("0".to_string())]);
    }
}
