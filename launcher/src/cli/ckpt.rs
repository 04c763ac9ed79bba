//! The checkpoint ledger's flags (`--ckpt-*`, `--on-scale-up`, `--ckpt-interval`), flattened
//! into [`super::Args`]; validated by `crate::config::ckpt`.

use std::path::PathBuf;

use clap::Args;

/// The checkpoint flags, raw.
#[derive(Debug, Clone, Args)]
pub struct CkptArgs {
    /// Checkpoint directory: exported to workers as DRUN_CKPT_DIR; drun keeps the `latest`
    /// pointer file here and reads it back when the rendezvous store knows no checkpoint (a
    /// fresh etcd, a requeued job). Created if missing.
    #[arg(long = "ckpt-dir", value_name = "DIR", help_heading = "Checkpoints")]
    pub ckpt_dir: Option<PathBuf>,

    /// How the resume point is checked before workers start: size (stat every file), digest
    /// (size and digest of every byte, files in parallel) or none. A mismatch marks the
    /// checkpoint bad and the group falls back to the previous one.
    #[arg(
        long = "ckpt-verify",
        value_enum,
        default_value = "size",
        help_heading = "Checkpoints"
    )]
    pub ckpt_verify: crate::ckpt::VerifyMode,

    /// Start a new run from another run's sealed checkpoint (a failed run, an earlier job): PATH
    /// is its `drun-manifest-<step>-<generation>.json` file, its --ckpt-dir or
    /// `<ckpt-dir>/<run id>` (whose `latest` pointer is used). Only the run's first generation
    /// adopts it, and only while the run has no checkpoint of its own; verified like any resume
    /// point (--ckpt-verify; a failure is exit 2, never a start from step 0); its files are never
    /// deleted or rewritten by this run.
    #[arg(
        long = "ckpt-resume-from",
        value_name = "PATH",
        help_heading = "Checkpoints"
    )]
    pub ckpt_resume_from: Option<PathBuf>,

    /// Checkpoints staged in memory and persisted behind the training (with --ckpt-dir):
    /// `drun.atomic_save` writes to the agent's tmpfs, the commit returns at once, and the agent
    /// writes the files to --ckpt-dir in the background (throttled, fsynced, digest-verified)
    /// before the step is sealed. SIZE (e.g. 8GiB) is the node's memory budget for staged
    /// copies; `auto` (default) a quarter of the node's RAM or of its cgroup's limit when
    /// smaller, no more than the tmpfs has free; `off` saves straight to --ckpt-dir (the commit
    /// answers once the step is sealed on disk). A save that does not fit, or a tmpfs that is
    /// missing or full, goes straight to disk, with one warning. Nothing changes for a run
    /// without --ckpt-dir.
    #[arg(
        long = "ckpt-memory",
        value_name = "SIZE|auto|off",
        default_value = "auto",
        env = "DRUN_CKPT_MEMORY",
        help_heading = "Checkpoints"
    )]
    pub ckpt_memory: String,

    /// Copies of each node's checkpoints in memory kept on another node (with --ckpt-memory):
    /// `1` sends each node's staged files of a step to its ring neighbour's agent (the next node
    /// by node rank) over a TCP connection between the agents, on the port number of the peer
    /// probes, verified by digest on receipt and held within the receiver's --ckpt-memory;
    /// `status` shows the steps `replicated`. `0` (default) keeps them on their own node only:
    /// a replica doubles the memory each node holds and sends every checkpoint over the
    /// network while the training runs.
    #[arg(
        long = "ckpt-replicas",
        value_name = "0|1",
        default_value_t = 0,
        env = "DRUN_CKPT_REPLICAS",
        help_heading = "Checkpoints"
    )]
    pub ckpt_replicas: u8,

    /// What a node arriving while the group runs below MAX nodes (--nnodes MIN:MAX) does: `now`
    /// re-forms at once, as torchrun does (work since the last checkpoint is repeated);
    /// `checkpoint` first asks every rank for a coordinated checkpoint (`should_save` turns
    /// true), re-forms once it is sealed, so the bigger group resumes from that step, or after
    /// --scale-up-save-timeout without one.
    #[arg(
        long = "on-scale-up",
        value_enum,
        default_value = "now",
        help_heading = "Checkpoints"
    )]
    pub on_scale_up: crate::ckpt::OnScaleUp,

    /// When drun itself asks every rank for a coordinated checkpoint (`should_save` turns true
    /// at the same step, as for a preemption warning): `off` (default: the script decides),
    /// SECONDS since the last seal, or `auto`: the first-order optimum √(2·C·M) from the
    /// measured save cost C and the job's mean time between failures M, re-evaluated after each
    /// seal and each failure (docs/guide/checkpoint-interval.md).
    #[arg(
        long = "ckpt-interval",
        value_name = "auto|SECONDS|off",
        default_value = "off",
        env = "DRUN_CKPT_INTERVAL",
        help_heading = "Checkpoints"
    )]
    pub ckpt_interval: String,

    /// With --ckpt-interval auto: the mean time between failures assumed until the job has
    /// failed, seconds (> 0; default 4 h). For a new job, the cluster's MTBF per node divided
    /// by the number of nodes.
    #[arg(
        long = "expected-mtbf",
        value_name = "SECONDS",
        default_value_t = drun_rendezvous::decisions::ckpt_interval::DEFAULT_EXPECTED_MTBF_S,
        help_heading = "Checkpoints"
    )]
    pub expected_mtbf: f64,

    /// With --on-scale-up checkpoint: the longest wait for that checkpoint, seconds (> 0); the
    /// group then re-forms without it.
    #[arg(
        long = "scale-up-save-timeout",
        value_name = "SECONDS",
        default_value_t = 120.0,
        help_heading = "Checkpoints"
    )]
    pub scale_up_save_timeout: f64,

    /// Keep only the newest K sealed checkpoints and delete the files of older ones (0: keep
    /// all, delete nothing).
    #[arg(
        long = "ckpt-keep-last",
        value_name = "K",
        default_value_t = 0,
        help_heading = "Checkpoints"
    )]
    pub ckpt_keep_last: u32,

    /// With --ckpt-keep-last, also keep every checkpoint whose step is a multiple of M
    /// (milestones; 0: none).
    #[arg(
        long = "ckpt-keep-every",
        value_name = "M",
        default_value_t = 0,
        help_heading = "Checkpoints"
    )]
    pub ckpt_keep_every: u64,
}
