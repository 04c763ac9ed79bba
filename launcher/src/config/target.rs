//! [`status_target`]: the rendezvous and run id a `drun --status` asks, chosen from the same
//! flags (and `PET_*`/Slurm variables) by the same rules as the agent's own, and the token
//! it sends inside a Slurm job ([`slurm_status_token`]).

use super::backend::{rendezvous_mode, Nodes};
use super::parse::parse_nnodes;
use super::timing::parse_rdzv_conf;
use super::{Host, RendezvousMode};
use crate::slurm::{self, SlurmMode};
use crate::{Args, ConfigError};

/// The rendezvous an agent started with `args` on `host` would join, and its run id. Pure,
/// like [`super::validate`]; the training script is not needed.
///
/// # Errors
/// [`ConfigError`] for a rendezvous flag the agent would refuse too (bad endpoint, `/` in the
/// run id, a malformed `--nnodes` or `--rdzv-conf`).
pub fn status_target(args: &Args, host: &Host) -> Result<(RendezvousMode, String), ConfigError> {
    let slurm = match args.slurm {
        SlurmMode::Auto if !args.standalone => slurm::detect(|k| host.var(k).map(str::to_string))?,
        _ => None,
    };
    let mut filled = args.clone();
    if let Some(job) = &slurm {
        job.fill(&mut filled)?;
    }
    let k8s = match args.kubernetes {
        crate::k8s::K8sMode::Auto if !args.standalone && slurm.is_none() => {
            crate::k8s::detect(&host.env, &host.hostname, host.fqdn.as_deref())
        }
        _ => None,
    };
    if let Some(job) = &k8s {
        job.fill(&mut filled);
    }
    let (min, max) = parse_nnodes(&filled.nnodes)?;
    let conf = parse_rdzv_conf(&filled.rdzv_conf)?;
    let nodes = Nodes {
        min,
        max,
        conf: &conf,
        slurm: slurm.as_ref(),
        k8s: k8s.as_ref(),
    };
    rendezvous_mode(&filled, &nodes, host, &mut Vec::new())
}

/// The token `drun --status` sends inside a Slurm job whose rendezvous an agent hosts, when none
/// is given: the job's derived one ([`crate::slurm_token`]), if its secret file exists and is
/// sound (`status` never creates it).
pub fn slurm_status_token(
    args: &Args,
    host: &Host,
    mode: &RendezvousMode,
) -> Option<drun_rendezvous::server::auth::Secret> {
    if args.slurm != SlurmMode::Auto || args.standalone {
        return None;
    }
    let job = slurm::detect(|k| host.var(k).map(str::to_string)).ok()??;
    if !matches!(mode, RendezvousMode::C10d { .. }) {
        return None;
    }
    let path = crate::slurm_token::secret_path(
        host.var(crate::slurm_token::SECRET_VAR),
        host.var("HOME"),
    )?;
    if !path.exists() {
        return None;
    }
    let secret = crate::slurm_token::read_or_create(&path).ok()?;
    Some(crate::slurm_token::derive(&secret, &job.job_id))
}
