//! [`validate`]: the command line and the host in, a [`LaunchConfig`] or one error out. Pure.

use super::backend::{rendezvous_mode, Nodes};
use super::entry::entrypoint;
use super::observe::observe;
use super::output::output;
use super::parse::{check_stdin_rank, parse_nnodes, parse_nproc};
use super::security::security;
use super::supervision::supervision;
use super::timing::{parse_rdzv_conf, unused_conf_notes, Timing};
use super::unsupported::refuse_unsupported;
use super::{invalid, Host, LaunchConfig};
use super::{RdzvConfig, SchedulerConfig, WorkersConfig};
use crate::k8s::K8sMode;
use crate::slurm::{self, SlurmMode};
use crate::worker_store::WorkerStoreMode;
use crate::{Args, ConfigError};
use drun_rendezvous::decisions::envcheck::EnvCheck;

/// Validates the command line against what was read from the host. Touches nothing: no
/// filesystem, no environment, no clock, no randomness (all of those come in `host`). Inside
/// Slurm (`--slurm auto`, `SLURM_JOB_ID` in `host.env`) the flags the user left unset are
/// filled from the job first.
///
/// # Errors
/// [`ConfigError`] naming the flag and the fix; the first problem found, in flag order.
pub fn validate(args: &Args, host: &Host) -> Result<LaunchConfig, ConfigError> {
    let job = detect_job(args, host)?;
    let a = &job.args;
    refuse_unsupported(a)?;
    let (min_nodes, max_nodes) = parse_nnodes(&a.nnodes)?;
    let nproc_per_node = parse_nproc(&a.nproc_per_node, host.cpu_count, host.gpu_count)?;
    let supervision = supervision(a, host, job.slurm.is_some())?;
    let observe = observe(a)?;
    check_stdin_rank(a.stdin_rank, nproc_per_node)?;
    let numa = super::gpu::numa_binding(a.numa_binding.as_deref(), nproc_per_node, host)?;
    super::gpu::virtual_devices(a.virtual_local_rank, nproc_per_node, host)?;
    let (output, filter_note) = output(a, host, nproc_per_node)?;
    let rdzv_conf = parse_rdzv_conf(&a.rdzv_conf)?;
    let mut notes = unused_conf_notes(&rdzv_conf);
    notes.extend(filter_note);
    notes.extend(
        a.local_addr
            .as_deref()
            .zip(host.local_addr.as_ref())
            .and_then(|(flag, check)| super::local_addr::note(flag, check)),
    );
    let timing = Timing::from_conf(&rdzv_conf)?;
    let nodes = Nodes {
        min: min_nodes,
        max: max_nodes,
        conf: &rdzv_conf,
        slurm: job.slurm.as_ref(),
        k8s: job.k8s.as_ref(),
    };
    let (rendezvous, run_id) = rendezvous_mode(a, &nodes, host, &mut notes)
        .map_err(|e| with_k8s_hint(e, job.k8s.as_ref()))?;
    let security = security(a, host, &rendezvous, job.slurm.is_some())?;
    let requested_node_rank = a.node_rank.filter(|_| !rendezvous.is_static());
    notes.extend(start_method_note(&a.start_method));
    let (python, python_source) = super::python::interpreter(a, host)?;
    let entrypoint = entrypoint(a, python.as_deref())?;
    super::python::check_path(entrypoint.kind, &entrypoint.script, python.as_deref(), host)?;
    // Like torchrun's node descriptor (address, pid): unique even for several agents per host,
    // and sorted first by address so ranks follow hosts.
    let address = a.local_addr.as_deref().unwrap_or(&host.hostname);
    let node_id = format!("{address}_{}", host.pid);
    let (ckpt, preempt_signal) = super::ckpt::checkpoint_flags(a, &rendezvous, &mut notes)?;
    let worker_store = worker_store(&a.worker_store)?;
    let env_check = env_check(&a.env_check)?;
    Ok(LaunchConfig {
        workers: WorkersConfig {
            nproc_per_node,
            role: a.role.clone(),
            entrypoint,
            python,
            python_source,
            stdin_rank: a.stdin_rank,
            warm_workers: a.warm_workers,
            numa,
            virtual_local_rank: a.virtual_local_rank,
            worker_store,
        },
        rdzv: RdzvConfig {
            min_nodes,
            max_nodes,
            mode: rendezvous,
            conf: rdzv_conf,
            timing,
            requested_node_rank,
            advertise_addr: a.local_addr.clone(),
            env_check,
            fingerprint_cmd: a.fingerprint_cmd.clone().filter(|c| !c.trim().is_empty()),
        },
        log_format: a.log_format,
        run_id,
        node_id,
        supervision,
        output,
        observe,
        notes,
        ckpt,
        scheduler: SchedulerConfig {
            slurm: job.slurm,
            slurm_line: job.slurm_line,
            k8s: job.k8s,
            k8s_line: job.k8s_line,
            termination_log: a.container.termination_log.clone(),
            state_dir: a.container.state_dir.clone(),
            container_restarts: None,
            on_preempt: a.on_preempt,
            preempt_signal,
            requeue: a.requeue,
        },
        security,
    })
}

/// The batch job drun runs in, and the command line with the flags the user left unset
/// filled from it.
struct Job {
    /// The flags, filled.
    args: Args,
    /// The Slurm job (`--slurm auto` and `SLURM_JOB_ID`), if any.
    slurm: Option<crate::slurm::SlurmJob>,
    /// What was taken from it, one line.
    slurm_line: Option<String>,
    /// The Kubernetes job (`--kubernetes auto`, outside Slurm), if one was recognized.
    k8s: Option<crate::k8s::K8sJob>,
    /// What was taken from it, one line.
    k8s_line: Option<String>,
}

/// Detects the Slurm or Kubernetes job (none with `--standalone`) and fills the flags the user
/// left unset from it.
///
/// # Errors
/// A Slurm variable that does not parse (`SLURM_JOB_NODELIST`, ...), or a Kubernetes variable
/// the operator set to something drun cannot use.
fn detect_job(args: &Args, host: &Host) -> Result<Job, ConfigError> {
    let slurm = match args.slurm {
        SlurmMode::Auto if !args.standalone => slurm::detect(|k| host.var(k).map(str::to_string))?,
        _ => None,
    };
    let mut filled = args.clone();
    let slurm_line = match &slurm {
        Some(job) => Some(job.fill(&mut filled)?),
        None => None,
    };
    let k8s = match args.kubernetes {
        K8sMode::Auto if !args.standalone && slurm.is_none() => {
            crate::k8s::detect(&host.env, &host.hostname, host.fqdn.as_deref())
        }
        _ => None,
    };
    if let Some((var, value, why)) = k8s.as_ref().and_then(|job| job.invalid.clone()) {
        return Err(ConfigError::Invalid {
            flag: var,
            value,
            why,
        });
    }
    let k8s_line = k8s.as_ref().map(|job| job.fill(&mut filled));
    Ok(Job {
        args: filled,
        slurm,
        slurm_line,
        k8s,
        k8s_line,
    })
}

/// `--start-method` other than `spawn` changes nothing for drun: a note saying so.
fn start_method_note(method: &str) -> Option<String> {
    (method != "spawn").then(|| {
        format!(
            "--start-method {method} only affects function entrypoints in torchrun; drun starts processes directly"
        )
    })
}

/// `--worker-store`: `agent` or `rank0`.
fn worker_store(v: &str) -> Result<WorkerStoreMode, ConfigError> {
    WorkerStoreMode::parse(v).ok_or_else(|| invalid("--worker-store", v, "expected agent or rank0"))
}

/// `--env-check`: `off`, `warn` or `strict`.
fn env_check(v: &str) -> Result<EnvCheck, ConfigError> {
    EnvCheck::parse(v).ok_or_else(|| invalid("--env-check", v, "expected off, warn or strict"))
}

/// A rendezvous error inside a pod whose operator setup was incomplete carries what detection
/// found (an Indexed Job without a subdomain, a Volcano job without the svc plugin): the
/// warnings that would otherwise be printed only once the agent starts, which it never does.
fn with_k8s_hint(e: ConfigError, k8s: Option<&crate::k8s::K8sJob>) -> ConfigError {
    match (e, k8s.filter(|j| !j.warnings.is_empty())) {
        (ConfigError::Invalid { flag, value, why }, Some(job)) => ConfigError::Invalid {
            flag,
            value,
            why: format!("{why} ({})", job.warnings.join("; ")),
        },
        (e, _) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, host, with_env};
    use super::*;

    #[test]
    fn unknown_worker_store_and_env_check_modes_are_refused() {
        assert_eq!(
            worker_store("both").unwrap_err().to_string(),
            "invalid --worker-store 'both': expected agent or rank0"
        );
        assert!(worker_store("rank0").is_ok());
        assert_eq!(
            env_check("loud").unwrap_err().to_string(),
            "invalid --env-check 'loud': expected off, warn or strict"
        );
        assert!(env_check("strict").is_ok());
    }

    #[test]
    fn only_a_start_method_other_than_spawn_is_noted() {
        assert_eq!(start_method_note("spawn"), None);
        assert!(start_method_note("fork")
            .unwrap()
            .contains("--start-method fork"));
    }

    #[test]
    fn a_slurm_job_fills_the_flags_and_a_bad_nodelist_is_refused() {
        let job = [
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
        ];
        let found = detect_job(&args(&["t.py"]), &with_env(&job)).expect("a job");
        assert!(found.slurm.is_some() && found.k8s.is_none());
        let standalone = detect_job(&args(&["--standalone", "t.py"]), &with_env(&job)).unwrap();
        assert!(standalone.slurm.is_none());
        let bad = [job[0], job[1], job[2], ("SLURM_JOB_NODELIST", "n[1-")];
        let e = detect_job(&args(&["t.py"]), &with_env(&bad))
            .err()
            .expect("refused")
            .to_string();
        assert!(e.starts_with("invalid SLURM_JOB_NODELIST 'n[1-'"), "{e}");
        assert!(detect_job(&args(&["t.py"]), &host())
            .unwrap()
            .slurm
            .is_none());
    }
}
