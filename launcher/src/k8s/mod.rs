//! Running as the container command of a Kubernetes training job (`drun ...` where the pod
//! spec said `torchrun ...`).
//!
//! # Theory of operation
//!
//! Like [`crate::slurm`]: when `--kubernetes auto` (the default) and the pod environment shows
//! one of the operators below, [`detect`] reads what the operator injected and
//! [`K8sJob::fill`] completes the command line with what the user did not say. An explicit
//! flag always wins, and so does a `PET_*` variable (clap reads those into the flags, as
//! torchrun's argparse does); what was taken is printed at start and by `drun doctor`.
//! Detection is a pure function of the environment, the pod's hostname and its FQDN (read from
//! `/etc/hosts` by [`crate::config::Host::probe`]).
//!
//! | operator | what it injects (source) | what drun takes |
//! |---|---|---|
//! | Kubeflow v1 PyTorchJob | `MASTER_ADDR=<job>-master-0`, `MASTER_PORT`, `WORLD_SIZE`, `RANK` (pod level), and since v1.7 `PET_NPROC_PER_NODE`, `PET_NODE_RANK`, `PET_NNODES` (`kubeflow/training-operator` `pkg/controller.v1/pytorch/envvar.go`, `master.go`) | static rendezvous: node rank from `RANK`, nnodes from `WORLD_SIZE` (older revisions without `PET_NNODES`), master from `MASTER_ADDR`/`MASTER_PORT`. drun sets each worker's own `RANK`/`WORLD_SIZE`/`MASTER_*` over the pod-level ones |
//! | … with `elasticPolicy` | `PET_RDZV_ENDPOINT=<job>-worker-0:<port>`, `PET_RDZV_BACKEND` (default `c10d`), `PET_NNODES=min:max`, `PET_MAX_RESTARTS`, `PET_RDZV_ID`, `PET_RDZV_CONF`, `PET_STANDALONE=""` when `standalone: true`, and (one revision) `PET_N_PROC_PER_NODE` (`pkg/controller.v1/pytorch/elastic.go`) | the run id `<job>` when `PET_RDZV_ID` is absent; pod `<job>-worker-0` hosts the c10d rendezvous; `PET_N_PROC_PER_NODE` as `--nproc-per-node` when `PET_NPROC_PER_NODE` is absent; `PET_STANDALONE=""` is read as unset, with a warning (see [`unset_empty`]) |
//! | Kubeflow Trainer v2 TrainJob | `PET_NNODES`, `PET_NPROC_PER_NODE` (`auto`, `cpu`, `gpu` or an integer), `PET_NODE_RANK` (the job completion index), `PET_MASTER_ADDR=<job>-node-0-0.<job>`, `PET_MASTER_PORT=29400` (`kubeflow/trainer` `pkg/runtime/framework/plugins/torch/torch.go`) | everything through the `PET_*` flags (static rendezvous); labelled as a TrainJob; the master name is waited for until it resolves |
//! | JobSet | Indexed Jobs `<jobset>-<rjob>-<jobIdx>`, pods with hostname `<jobset>-<rjob>-<jobIdx>-<podIdx>` and subdomain `spec.network.subdomain` (default: the JobSet name), `JOB_COMPLETION_INDEX` = podIdx (`kubernetes-sigs/jobset` `pkg/controllers/jobset_controller.go`, `GetSubdomain`, `coordinatorEndpoint`) | with `--nnodes` > 1: the embedded rendezvous on `<jobset>-<rjob>-0-0.<subdomain>:29400`, hosted by that pod; run id `<jobset>-<rjob>` |
//! | Indexed Job + headless Service | `JOB_COMPLETION_INDEX`, hostname `<job>-<index>`, subdomain as set in the pod template (Kubernetes `pkg/controller/job/indexed_job_utils.go`) | with `--nnodes` > 1: the embedded rendezvous on `<job>-0.<subdomain>:29400`, hosted by index 0; run id `<job>` |
//! | Volcano | `VC_TASK_INDEX` (env plugin), `VC_<TASK>_HOSTS=<job>-<task>-0.<job>,...` and `VC_<TASK>_NUM` (svc plugin); with the pytorch plugin also `MASTER_ADDR`, `MASTER_PORT=23456`, `WORLD_SIZE`, `RANK` (`volcano-sh/volcano` `pkg/controllers/job/plugins/{env/env.go,svc/svc.go,distributed-framework/pytorch/pytorch.go}`) | pytorch plugin: as a v1 PyTorchJob; else nnodes = the task's host count, node rank = `VC_TASK_INDEX`, the embedded rendezvous on the task's first host, port 29400, run id `<job>` |
//!
//! Pods start at different times, so a rendezvous or master name that does not resolve yet is
//! waited for ([`crate::dns`]).

mod detect;
mod fill;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use detect::{detect, fqdn_from_hosts};

/// `--kubernetes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum K8sMode {
    /// Use what a Kubernetes training operator injected, when one is recognized.
    #[default]
    Auto,
    /// Ignore Kubernetes.
    Off,
}

/// The operator (or job kind) whose pod drun runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// Kubeflow training-operator v1 `PyTorchJob` without `elasticPolicy`.
    PyTorchJob,
    /// Kubeflow training-operator v1 `PyTorchJob` with `elasticPolicy`.
    PyTorchJobElastic,
    /// Kubeflow Trainer v2 `TrainJob` (a JobSet underneath).
    TrainJob,
    /// A JobSet (not a TrainJob).
    JobSet,
    /// A plain Indexed Job with a headless Service.
    IndexedJob,
    /// A Volcano `Job` (`batch.volcano.sh`).
    Volcano,
}

impl Operator {
    /// As printed at start and by `drun doctor`.
    pub fn name(self) -> &'static str {
        match self {
            Operator::PyTorchJob => "Kubeflow PyTorchJob",
            Operator::PyTorchJobElastic => "Kubeflow PyTorchJob (elasticPolicy)",
            Operator::TrainJob => "Kubeflow TrainJob",
            Operator::JobSet => "JobSet",
            Operator::IndexedJob => "Indexed Job",
            Operator::Volcano => "Volcano Job",
        }
    }
}

/// What drun takes from the pod environment. Each value is paired with the variables it was
/// read from (for `drun doctor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sJob {
    /// Which operator.
    pub operator: Operator,
    /// The job's name (the run id when the user gave none), when it can be told.
    pub job: Option<(String, &'static str)>,
    /// `--nnodes` (`N` or `MIN:MAX`) not already given through `PET_NNODES`.
    pub nnodes: Option<(String, &'static str)>,
    /// This node's rank, for the static rendezvous.
    pub node_rank: Option<(u32, &'static str)>,
    /// Master address and port of the static rendezvous.
    pub master: Option<(String, u16, &'static str)>,
    /// Endpoint of the embedded rendezvous (`host:port`) for a dynamic one.
    pub endpoint: Option<(String, &'static str)>,
    /// `--nproc-per-node` from a misspelt variable (`PET_N_PROC_PER_NODE`).
    pub nproc_per_node: Option<(String, &'static str)>,
    /// The pod meant to host the embedded/c10d rendezvous (its hostname) and whether it is
    /// this pod (`None`: cannot tell). See [`K8sJob::hosts`].
    pub hosts_rendezvous: Option<(String, bool)>,
    /// The operator's pod-level `RANK`/`WORLD_SIZE`/`MASTER_*` that drun replaces per worker.
    pub overwritten: BTreeMap<&'static str, String>,
    /// Problems found in the environment, printed once at start.
    pub warnings: Vec<String>,
    /// An operator variable set to a value the operator never sets (variable, value, what is
    /// expected): the launch is refused (exit 2).
    pub invalid: Option<(&'static str, String, String)>,
}

impl K8sJob {
    fn new(operator: Operator) -> Self {
        K8sJob {
            operator,
            job: None,
            nnodes: None,
            node_rank: None,
            master: None,
            endpoint: None,
            nproc_per_node: None,
            hosts_rendezvous: None,
            overwritten: BTreeMap::new(),
            warnings: Vec::new(),
            invalid: None,
        }
    }
}

impl K8sJob {
    /// Whether this pod hosts a c10d/embedded rendezvous on `endpoint`: known only when the
    /// endpoint names the pod the operator designates (`<job>-worker-0`, index 0); `None`
    /// for any other endpoint (whoever can bind it hosts, as with torchrun's c10d).
    pub fn hosts(&self, endpoint: &str) -> Option<bool> {
        let (pod, me) = self.hosts_rendezvous.as_ref()?;
        let host = crate::dns::split(endpoint).map_or(endpoint, |(h, _)| h);
        (host.split('.').next() == Some(pod.as_str())).then_some(*me)
    }
}

/// The port of the rendezvous drun places on an index-0 pod (torchrun's c10d default).
pub const RDZV_PORT: u16 = 29400;

/// `PET_*` variables that are set but empty, which torchrun's argparse turns into a crash
/// (`PET_STANDALONE=""` is what one training-operator revision injects for
/// `elasticPolicy.standalone: true`, see `elastic.go`). The binary removes them before the
/// command line is parsed and prints each warning. Pure: `env` is a lookup.
pub fn unset_empty(env: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    [
        "PET_STANDALONE",
        "PET_NO_PYTHON",
        "PET_MODULE",
        "PET_RUN_PATH",
    ]
    .into_iter()
    .filter(|k| env(k).is_some_and(|v| v.trim().is_empty()))
    .map(|k| {
        (
            k,
            format!(
                "{k} is set but empty (an operator revision injects it so); read as unset: \
                     set it to 1 or remove it"
            ),
        )
    })
    .collect()
}
