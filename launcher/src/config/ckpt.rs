//! Checkpoint and preemption flags: `--ckpt-*`, `--on-scale-up`, `--on-preempt`, `--requeue`.

use nix::sys::signal::Signal;

use super::parse::parse_preempt_signal;
use super::timing::seconds;
use super::{invalid, RendezvousMode};
use crate::ckpt::{CkptConfig, OnScaleUp};
use crate::slurm::OnPreempt;
use crate::{Args, ConfigError};
use drun_rendezvous::decisions::ckpt_interval::{IntervalConfig, IntervalMode};

/// Checks the checkpoint and preemption flags of `a` against each other and the rendezvous;
/// returns the checkpoint settings (paths as given: [`super::prepare`] makes them absolute)
/// and the preemption signal.
///
/// # Errors
/// Retention without a directory, `--requeue` without `--on-preempt checkpoint`, a preemption
/// checkpoint on an in-memory rendezvous without `--ckpt-dir`, a bad signal or timeout.
pub(super) fn checkpoint_flags(
    a: &Args,
    rendezvous: &RendezvousMode,
    notes: &mut Vec<String>,
) -> Result<(CkptConfig, Signal), ConfigError> {
    if a.ckpt.ckpt_keep_every > 0 && a.ckpt.ckpt_keep_last == 0 {
        return Err(invalid(
            "--ckpt-keep-every",
            a.ckpt.ckpt_keep_every.to_string(),
            "needs --ckpt-keep-last K (without it every checkpoint is kept anyway)",
        ));
    }
    if a.ckpt.ckpt_keep_last > 0 && a.ckpt.ckpt_dir.is_none() {
        return Err(invalid(
            "--ckpt-keep-last",
            a.ckpt.ckpt_keep_last.to_string(),
            "needs --ckpt-dir DIR (retention only ever deletes files inside it)",
        ));
    }
    let preempt_signal = parse_preempt_signal(&a.preempt_signal)?;
    if a.requeue && a.on_preempt != OnPreempt::Checkpoint {
        return Err(invalid(
            "--requeue",
            "true",
            "needs --on-preempt checkpoint (the job requeues after its checkpoint is sealed)",
        ));
    }
    if a.on_preempt == OnPreempt::Checkpoint
        && rendezvous.store_is_ephemeral()
        && a.ckpt.ckpt_dir.is_none()
    {
        return Err(invalid(
            "--on-preempt",
            "checkpoint",
            "needs --ckpt-dir DIR with an in-memory rendezvous: the restarted job finds the checkpoint through DIR/latest",
        ));
    }
    let scale_up_save_timeout = seconds(
        "--scale-up-save-timeout",
        a.ckpt.scale_up_save_timeout,
        false,
    )?;
    let mode = IntervalMode::parse(&a.ckpt.ckpt_interval).map_err(|e| {
        invalid(
            "--ckpt-interval",
            a.ckpt.ckpt_interval.clone(),
            e.to_string(),
        )
    })?;
    if mode.is_on() && matches!(rendezvous, RendezvousMode::Static { .. }) {
        return Err(invalid(
            "--ckpt-interval",
            a.ckpt.ckpt_interval.clone(),
            "needs a rendezvous with a checkpoint ledger (the static backend has none)",
        ));
    }
    let interval = IntervalConfig {
        mode,
        expected_mtbf: seconds("--expected-mtbf", a.ckpt.expected_mtbf, false)?,
    };
    let memory =
        crate::ckpt::memory::budget(&a.ckpt.ckpt_memory, crate::ckpt::memory::NodeMemory::read())
            .map_err(|why| invalid("--ckpt-memory", a.ckpt.ckpt_memory.clone(), why.to_string()))?;
    // Staged copies are persisted to --ckpt-dir: without one there is nothing to stage for
    // (said when a size was asked for; `auto`, the default, goes without saying).
    let asked = !matches!(
        a.ckpt.ckpt_memory.trim().to_ascii_lowercase().as_str(),
        "auto" | "on"
    );
    if memory.is_some() && asked && a.ckpt.ckpt_dir.is_none() {
        notes.push(format!(
            "--ckpt-memory {} is ignored without --ckpt-dir: staged checkpoints are persisted there (give --ckpt-dir DIR)",
            a.ckpt.ckpt_memory.trim()
        ));
    }
    let memory = memory.filter(|_| a.ckpt.ckpt_dir.is_some());
    let replicas = a.ckpt.ckpt_replicas;
    if replicas > 1 {
        return Err(invalid(
            "--ckpt-replicas",
            replicas.to_string(),
            "give 0 or 1 (one copy on the ring neighbour; more are not built)",
        ));
    }
    if replicas > 0 && memory.is_none() {
        return Err(invalid(
            "--ckpt-replicas",
            replicas.to_string(),
            "replicas are copies of checkpoints staged in memory: give --ckpt-memory SIZE|auto and --ckpt-dir, or --ckpt-replicas 0",
        ));
    }
    let ckpt = CkptConfig {
        memory,
        replicas,
        interval,
        scale_up_save: (a.ckpt.on_scale_up == OnScaleUp::Checkpoint)
            .then_some(scale_up_save_timeout),
        resume_from: a.ckpt.ckpt_resume_from.clone(),
        dir: a.ckpt.ckpt_dir.clone(),
        verify: a.ckpt.ckpt_verify,
        retention: drun_rendezvous::Retention {
            keep_last: a.ckpt.ckpt_keep_last,
            keep_every: a.ckpt.ckpt_keep_every,
        },
    };
    Ok((ckpt, preempt_signal))
}
