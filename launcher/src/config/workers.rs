//! What this node's workers are ([`WorkersConfig`]): how many, the command and its
//! interpreter, stdin, the warm interpreters, their CPUs and GPUs, and who hosts their store.

use std::path::PathBuf;

use crate::command::{Entrypoint, PythonSource};

/// This node's workers.
#[derive(Debug, Clone)]
pub struct WorkersConfig {
    /// Workers on this node (LOCAL_WORLD_SIZE), ≥ 1.
    pub nproc_per_node: u32,
    /// ROLE_NAME.
    pub role: String,
    /// The worker command (program resolved by [`super::prepare`]).
    pub entrypoint: Entrypoint,
    /// `--python`, `DRUN_PYTHON` or `PYTHON_EXEC`, as given (resolved into the entrypoint by
    /// [`super::prepare`]); `None`: `python3` on PATH.
    pub python: Option<PathBuf>,
    /// Where `python` came from (for the message when it does not exist).
    pub python_source: PythonSource,
    /// `--stdin-rank`: the local rank that reads drun's stdin; the others read `/dev/null`.
    pub stdin_rank: Option<u32>,
    /// `--warm-workers`: restarted workers start on a pre-started interpreter.
    pub warm_workers: crate::warm::WarmWorkers,
    /// `--numa-binding`: each local rank's CPUs near its GPU; `None`: workers are not bound.
    pub numa: Option<crate::numa::Binding>,
    /// `--virtual-local-rank`: each worker sees its own GPU only, as device 0.
    pub virtual_local_rank: bool,
    /// Who hosts the workers' c10d store (`--worker-store`).
    pub worker_store: crate::worker_store::WorkerStoreMode,
}

impl WorkersConfig {
    /// The CPUs local rank `local_rank` is bound to (`--numa-binding`), if any.
    pub fn cpus_of(&self, local_rank: u32) -> Option<crate::numa::topology::Cpus> {
        self.numa
            .as_ref()
            .and_then(|b| b.for_rank(local_rank))
            .cloned()
    }
}
