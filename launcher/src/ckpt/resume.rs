//! The resume point of a generation, on this node: what the node offers the rendezvous when the
//! store knows no checkpoint (its own `latest`, or the `--ckpt-resume-from` one, adopted), and
//! the verification of the plan's resume point before the workers start from it.

use std::path::{Path, PathBuf};

use drun_rendezvous::{Manifest, Plan};

use super::{fallback, verify, CkptConfig, CkptError, VerifyMode};
use crate::error::ConfigError;

/// What the resume hint and the verification need to know about the launch.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// This run's id (`--rdzv-id`).
    pub run_id: &'a str,
    /// Checkpoint settings.
    pub ckpt: &'a CkptConfig,
    /// False inside a Slurm job that is not a requeued one: files in `--ckpt-dir` may belong
    /// to an earlier job with the same (reused) id.
    pub may_resume_files: bool,
}

/// What this node offers the rendezvous as a resume point for a store that knows no
/// checkpoint: its own run's latest manifest file, else the `--ckpt-resume-from` one. When the
/// latter cannot be read, the first reason is kept in `adoption_failed`.
pub fn hint(src: Source<'_>, adoption_failed: &mut Option<String>) -> Option<Box<Manifest>> {
    own_hint(src).or_else(|| match adopted_hint(src) {
        Ok(m) => m,
        Err(e) => {
            // Matters only while the run has no checkpoint of its own: then the check of the
            // plan refuses to start from the beginning, with this reason.
            adoption_failed.get_or_insert_with(|| format!("no longer usable: {e}"));
            None
        }
    })
}

/// The `--ckpt-resume-from` checkpoint, relabelled as this run's (`adopted_from` keeps the
/// run it came from). Re-read at each join: once this run seals its own checkpoints the
/// ledger prefers those (they are later steps).
///
/// # Errors
/// The checkpoint can no longer be read (see [`super::read_adoptable`]).
pub fn adopted_hint(src: Source<'_>) -> Result<Option<Box<Manifest>>, CkptError> {
    let Some(path) = src.ckpt.resume_from.as_deref() else {
        return Ok(None);
    };
    let (_, mut m) = super::read_adoptable(path)?;
    if m.run_id != src.run_id {
        m.adopted_from = Some(std::mem::replace(&mut m.run_id, src.run_id.to_string()));
    }
    Ok(Some(Box::new(m)))
}

/// The manifest `--ckpt-dir`'s `latest` points at, when it belongs to this run (a manifest of
/// another run is ignored, and said so once).
pub fn own_hint(src: Source<'_>) -> Option<Box<Manifest>> {
    let dir = src.ckpt.dir.as_deref()?;
    // This run's own pointer first: another run sharing the directory moves `latest`.
    let own = super::run_pointer_dir(dir, src.run_id)
        .and_then(|d| super::read_latest(d.as_path()))
        .filter(|m| m.run_id == src.run_id);
    let m = match own.or_else(|| super::read_latest(dir)) {
        Some(m) if m.run_id != src.run_id || !fallback::is_marked_bad(&m, Some(dir)) => m,
        // No pointer, an undecodable manifest, or a checkpoint that failed verification:
        // the run's newest usable manifest, if any.
        latest => {
            let m = fallback::newest_usable(dir, src.run_id)?;
            static FALLBACK: std::sync::Once = std::sync::Once::new();
            FALLBACK.call_once(|| {
                tracing::info!(
                    "{}: {}; offering the run's newest usable checkpoint, step {} (generation {})",
                    dir.display(),
                    match &latest {
                        Some(l) => format!(
                            "latest names step {} (generation {}), which failed verification",
                            l.step, l.generation
                        ),
                        None => "latest names no readable manifest of this run".into(),
                    },
                    m.step,
                    m.generation
                );
            });
            m
        }
    };
    if !src.may_resume_files {
        if src.ckpt.resume_from.is_some() {
            return None;
        }
        static FRESH: std::sync::Once = std::sync::Once::new();
        FRESH.call_once(|| {
            tracing::info!(
                "{}/latest (run {}, step {}) is not resumed: this Slurm job is not a requeued one (SLURM_RESTART_COUNT unset), and job ids are reused",
                dir.display(),
                m.run_id,
                m.step
            );
        });
        return None;
    }
    if m.run_id != src.run_id {
        if src.ckpt.resume_from.is_some() {
            return None;
        }
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::info!(
                "{}/latest is a checkpoint of run {} (step {}), not of this run {}: not resuming from it (pass --rdzv-id {} to resume that run, or --ckpt-resume-from {} to start this one from it)",
                dir.display(),
                m.run_id,
                m.step,
                src.run_id,
                m.run_id,
                dir.display()
            );
        });
        return None;
    }
    Some(Box::new(m))
}

/// How the plan's resume point turned out.
#[derive(Debug)]
pub enum Verdict {
    /// Start from it; the manifest file to hand the workers, if there is a resume point.
    Use(Option<PathBuf>),
    /// This run's checkpoint failed verification: mark manifest `id` bad, re-form onto the
    /// previous one.
    Bad {
        /// Manifest id.
        id: String,
        /// One line: which file, what differed.
        reason: String,
    },
    /// The run cannot start: `--ckpt-resume-from` was asked for and is unusable. When
    /// `mark_bad` is set, the manifest (id, reason) is marked bad first.
    Refuse {
        /// Manifest to mark bad, with the reason.
        mark_bad: Option<(String, String)>,
        /// The error the agent exits with.
        error: ConfigError,
    },
}

/// Checks the plan's resume point (`--ckpt-verify`, off the async threads) and makes sure its
/// manifest file is next to the checkpoint. `reached_before` is the step the local ranks had
/// reached in the previous generation (for the lost-work line); `adoption_failed` the reason
/// the `--ckpt-resume-from` checkpoint could not be read at the join, if it could not.
pub async fn check(
    src: Source<'_>,
    plan: &Plan,
    reached_before: Option<u64>,
    adoption_failed: Option<String>,
) -> Verdict {
    let Some(m) = plan.resume.clone() else {
        return match no_resume_point(src, plan, reached_before, adoption_failed) {
            Ok(()) => Verdict::Use(None),
            Err(error) => Verdict::Refuse {
                mark_bad: None,
                error,
            },
        };
    };
    if m.adopted_from.is_none() {
        if let Some(f) = &src.ckpt.resume_from {
            static OWN: std::sync::Once = std::sync::Once::new();
            OWN.call_once(|| {
                tracing::info!(
                    "--ckpt-resume-from {} is not used: run {} has its own checkpoint (step {})",
                    f.display(),
                    src.run_id,
                    m.step
                );
            });
        }
    }
    let mode = src.ckpt.verify;
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let checked = {
        let m = m.clone();
        tokio::task::spawn_blocking(move || verify::verify(&m, mode, threads))
            .await
            .unwrap_or_else(|e| Err(CkptError::VerifyPanicked(e.to_string())))
    };
    match checked {
        Ok(v) => {
            log_verified(&m, mode, &v);
            resuming(src, plan, &m, reached_before)
        }
        Err(e) if m.adopted_from.is_some() => {
            let reason = e.to_string();
            let why = format!(
                "checkpoint step {} of run {} failed verification: {reason}; not starting run {} from the beginning instead (fix the checkpoint, name another one, or drop the flag)",
                m.step,
                m.adopted_from.as_deref().unwrap_or_default(),
                src.run_id
            );
            Verdict::Refuse {
                mark_bad: Some((m.id(), reason)),
                error: resume_from_invalid(src, why),
            }
        }
        Err(e) => {
            crate::say!(
                "drun: checkpoint step {} (generation {}) failed verification: {e}; marked bad, falling back to the newest earlier checkpoint that verifies, if any",
                m.step, m.generation
            );
            let reason = e.to_string();
            fallback::mark_bad(&m, src.ckpt.dir.as_deref(), &reason);
            MARKED_BAD.store(true, std::sync::atomic::Ordering::Relaxed);
            Verdict::Bad { id: m.id(), reason }
        }
    }
}

fn resume_from_invalid(src: Source<'_>, why: String) -> ConfigError {
    ConfigError::Invalid {
        flag: "--ckpt-resume-from",
        value: src
            .ckpt
            .resume_from
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        why,
    }
}

/// A plan without a resume point: refused when `--ckpt-resume-from` was asked for and could
/// not be read (never a silent start from scratch); else said what is repeated.
fn no_resume_point(
    src: Source<'_>,
    plan: &Plan,
    reached_before: Option<u64>,
    adoption_failed: Option<String>,
) -> Result<(), ConfigError> {
    if let Some(f) = &src.ckpt.resume_from {
        if let Some(why) = adoption_failed {
            return Err(resume_from_invalid(
                src,
                format!(
                    "{why}; not starting run {} from the beginning instead (fix the checkpoint, name another one, or drop the flag)",
                    src.run_id
                ),
            ));
        }
        if plan.generation > 1 {
            static LATE: std::sync::Once = std::sync::Once::new();
            LATE.call_once(|| {
                tracing::warn!(
                    "--ckpt-resume-from {} is not used: run {} had already started (generation {}) without it, and has no checkpoint yet",
                    f.display(),
                    src.run_id,
                    plan.generation
                );
            });
        }
    }
    if let Some(p) = reached_before {
        tracing::warn!("no usable checkpoint: restarting from the beginning (the local ranks had reached step {p}; all of it is repeated)");
    } else if MARKED_BAD.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "no earlier checkpoint of run {} verifies (or none is left): starting from the beginning",
            src.run_id
        );
    }
    Ok(())
}

/// Set once this launch marked a checkpoint bad: a plan without a resume point then says that
/// nothing earlier was left to fall back to.
static MARKED_BAD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn log_verified(m: &Manifest, mode: VerifyMode, v: &verify::Verified) {
    if mode == VerifyMode::None {
        return;
    }
    let secs = v.took.as_secs_f64();
    tracing::info!(
        "checkpoint step {} verified ({}): {} files, {:.1} MB in {:.3} s{}",
        m.step,
        if mode == VerifyMode::Digest {
            "size and digest"
        } else {
            "sizes"
        },
        v.files,
        v.bytes as f64 / 1e6,
        secs,
        if mode == VerifyMode::Digest && secs > 0.0 {
            format!(" ({:.0} MB/s)", v.bytes as f64 / 1e6 / secs)
        } else {
            String::new()
        }
    );
}

/// Says where the workers resume (and what is repeated) and returns the manifest file to hand
/// them: the adopted run's own file, or this run's, written if missing.
fn resuming(src: Source<'_>, plan: &Plan, m: &Manifest, reached_before: Option<u64>) -> Verdict {
    let lost = match reached_before {
        Some(p) if p > m.step => {
            let samples = (p - m.step) * m.cursor.global_batch;
            format!(
                "; the local ranks had reached step {p}: {} step(s) repeated{}",
                p - m.step,
                if samples > 0 {
                    format!(", {samples} samples replayed")
                } else {
                    String::new()
                }
            )
        }
        _ => String::new(),
    };
    let from = m
        .adopted_from
        .as_deref()
        .map(|r| format!(" of run {r} (--ckpt-resume-from)"))
        .unwrap_or_default();
    tracing::info!(
        "resuming from checkpoint step {}{from} (saved by generation {} at world size {}, now {}); data: epoch {}, sample {} of its permutation{lost}",
        m.step,
        m.generation,
        m.world_size,
        plan.world_size,
        m.cursor.epoch,
        m.cursor.consumed_in_epoch
    );
    let file = if m.adopted_from.is_some() {
        // The other run's own manifest file: never rewritten under this run's id.
        src.ckpt.resume_from.clone()
    } else {
        // The manifest file again (no pointers: they may name a newer checkpoint).
        match super::publish(m, src.ckpt.dir.as_deref(), false) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        }
    };
    Verdict::Use(file)
}

/// Publishes a checkpoint this node's commit sealed (manifest file, `latest` pointers) and
/// deletes what retention dropped. Returns the manifest file, if it could be written.
pub fn sealed_here(
    step: u64,
    manifest: &Manifest,
    dropped: &[Manifest],
    garbage: &[String],
    dir: Option<&Path>,
) -> Option<PathBuf> {
    let file = match super::publish(manifest, dir, true) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!("checkpoint sealed, but {e}");
            None
        }
    };
    tracing::debug!(
        "checkpoint step {step} sealed here: {} files, {:.1} MB, world size {}",
        manifest.files.len(),
        manifest.bytes() as f64 / 1e6,
        manifest.world_size
    );
    if let Some(root) = dir {
        super::remove_garbage(root, garbage, dropped);
    }
    file
}
