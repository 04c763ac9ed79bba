//! [`validate`]: the command line and the host in, a [`LaunchConfig`] or one error out. Pure.

use super::backend::{rendezvous_mode, Nodes};
use super::entry::entrypoint;
use super::parse::{
    check_stdin_rank, parse_nnodes, parse_nproc, parse_ranks_filter, parse_signals,
    ranks_filter_note,
};
use super::timing::{parse_rdzv_conf, seconds, shutdown_timeout, unused_conf_notes, Timing};
use super::unsupported::refuse_unsupported;
use super::RendezvousMode;
use super::{invalid, Host, LaunchConfig};
use crate::k8s::K8sMode;
use crate::slurm::{self, SlurmMode};
use crate::std_spec::StdSpec;
use crate::worker_store::WorkerStoreMode;
use crate::{Args, ConfigError};
use drun_rendezvous::envcheck::EnvCheck;

/// Validates the command line against what was read from the host. Touches nothing: no
/// filesystem, no environment, no clock, no randomness (all of those come in `host`). Inside
/// Slurm (`--slurm auto`, `SLURM_JOB_ID` in `host.env`) the flags the user left unset are
/// filled from the job first.
///
/// # Errors
/// [`ConfigError`] naming the flag and the fix; the first problem found, in flag order.
pub fn validate(args: &Args, host: &Host) -> Result<LaunchConfig, ConfigError> {
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
    let a = &filled;
    refuse_unsupported(a)?;
    let (min_nodes, max_nodes) = parse_nnodes(&a.nnodes)?;
    let nproc_per_node = parse_nproc(&a.nproc_per_node, host.cpu_count, host.gpu_count)?;
    let monitor_interval = seconds("--monitor-interval", a.monitor_interval, false)?;
    let in_k8s = crate::container::in_kubernetes(|k| host.var(k).map(str::to_string));
    let shutdown_timeout = shutdown_timeout(a.shutdown_timeout, slurm.is_some(), in_k8s, host)?;
    let peer_exit_wait = seconds("--peer-exit-wait", a.peer_exit_wait, true)?;
    let hang_timeout = super::timing::hang_timeout(&a.hang_timeout)?;
    check_stdin_rank(a.stdin_rank, nproc_per_node)?;
    let redirects = StdSpec::parse("--redirects", &a.redirects)?;
    let tee = StdSpec::parse("--tee", &a.tee)?;
    let local_ranks_filter = parse_ranks_filter(&a.local_ranks_filter)?;
    let signals = parse_signals(&a.signals_to_handle)?;
    let rdzv_conf = parse_rdzv_conf(&a.rdzv_conf)?;
    // An explicit empty template means "no prefix"; the environment variable only counts
    // when non-empty (torchrun treats it so).
    let prefix_template = a.log_line_prefix_template.clone().or_else(|| {
        host.var("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    });
    let mut notes = unused_conf_notes(&rdzv_conf);
    notes.extend(ranks_filter_note(
        local_ranks_filter.as_ref(),
        nproc_per_node,
    ));
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
        slurm: slurm.as_ref(),
        k8s: k8s.as_ref(),
    };
    let (rendezvous, run_id) =
        rendezvous_mode(a, &nodes, host, &mut notes).map_err(|e| with_k8s_hint(e, k8s.as_ref()))?;
    let rdzv_host_tls = host_tls(a, &rendezvous)?;
    scheme_agrees_with_tls(&rendezvous, a.rdzv_tls_ca.is_some())?;
    let requested_node_rank = a.node_rank.filter(|_| !rendezvous.is_static());
    if a.start_method != "spawn" {
        notes.push(format!(
            "--start-method {} only affects function entrypoints in torchrun; drun starts processes directly",
            a.start_method
        ));
    }
    let (python, python_source) = super::python::interpreter(a, host)?;
    let entrypoint = entrypoint(a, python.as_deref())?;
    super::python::check_path(entrypoint.kind, &entrypoint.script, python.as_deref(), host)?;
    // Like torchrun's node descriptor (address, pid): unique even for several agents per host,
    // and sorted first by address so ranks follow hosts.
    let address = a.local_addr.as_deref().unwrap_or(&host.hostname);
    let node_id = format!("{address}_{}", host.pid);
    let (ckpt, preempt_signal) = super::ckpt::checkpoint_flags(a, &rendezvous)?;
    let worker_store = WorkerStoreMode::parse(&a.worker_store).ok_or_else(|| {
        invalid(
            "--worker-store",
            a.worker_store.clone(),
            "expected agent or rank0",
        )
    })?;
    Ok(LaunchConfig {
        min_nodes,
        max_nodes,
        nproc_per_node,
        rendezvous,
        log_format: a.log_format,
        run_id,
        node_id,
        max_restarts: a.max_restarts,
        monitor_interval,
        role: a.role.clone(),
        entrypoint,
        python,
        python_source,
        log_dir: a.log_dir.clone(),
        redirects,
        tee,
        local_ranks_filter,
        prefix_template,
        signals,
        signals_to_handle: a.signals_to_handle.clone(),
        shutdown_timeout,
        peer_exit_wait,
        hang_timeout,
        stdin_rank: a.stdin_rank,
        warm_workers: a.warm_workers,
        worker_store,
        rdzv_conf,
        timing,
        requested_node_rank,
        advertise_addr: a.local_addr.clone(),
        notes,
        ckpt,
        slurm_secret: slurm.as_ref().and_then(|_| {
            crate::slurm_token::secret_path(
                host.var(crate::slurm_token::SECRET_VAR),
                host.var("HOME"),
            )
        }),
        slurm,
        slurm_line,
        k8s,
        k8s_line,
        termination_log: a.container.termination_log.clone(),
        state_dir: a.container.state_dir.clone(),
        container_restarts: None,
        on_preempt: a.on_preempt,
        preempt_signal,
        requeue: a.requeue,
        env_check: EnvCheck::parse(&a.env_check).ok_or_else(|| {
            invalid(
                "--env-check",
                a.env_check.clone(),
                "expected off, warn or strict",
            )
        })?,
        fingerprint_cmd: a.fingerprint_cmd.clone().filter(|c| !c.trim().is_empty()),
        metrics_port: a.observe.metrics_port,
        straggler_factor: straggler_factor(a.observe.straggler_factor)?,
        preflight: preflight(a)?,
        rdzv_token_file: a.rdzv_token_file.clone(),
        rdzv_token: crate::rdzv::token::resolve(None, host.var(crate::rdzv::token::TOKEN_VAR))?,
        rdzv_tls_files: match (&a.rdzv_tls_ca, &a.rdzv_tls_cert, &a.rdzv_tls_key) {
            (None, Some(f), _) | (None, None, Some(f)) => {
                return Err(invalid(
                    "--rdzv-tls-cert/--rdzv-tls-key",
                    f.display().to_string(),
                    "a client certificate is sent only over TLS: give --rdzv-tls-ca CA.pem too",
                ))
            }
            (ca, cert, key) => ca.clone().map(|ca| (ca, cert.clone(), key.clone())),
        },
        rdzv_tls: None,
        rdzv_host_tls,
        etcd_access_files: a.etcd.files(),
        etcd_access: Default::default(),
    })
}

/// A `https://` drun or c10d endpoint needs `--rdzv-tls-ca` (the scheme alone cannot say which CA
/// to trust), and an `http://` one contradicts it: both said at start, not at the join timeout.
fn scheme_agrees_with_tls(mode: &RendezvousMode, tls: bool) -> Result<(), ConfigError> {
    let eps: &[String] = match mode {
        RendezvousMode::Server { endpoints } => endpoints,
        RendezvousMode::C10d { endpoint, .. } => std::slice::from_ref(endpoint),
        _ => &[],
    };
    for e in eps {
        if e.starts_with("https://") && !tls {
            return Err(ConfigError::Missing {
                flag: "--rdzv-tls-ca",
                why: format!(
                    "{e} asks for TLS: give --rdzv-tls-ca with the CA of the server's certificate"
                ),
            });
        }
        if e.starts_with("http://") && tls {
            return Err(invalid(
                "--rdzv-endpoint",
                e.clone(),
                "http:// is plaintext but --rdzv-tls-ca asks for TLS: write HOST:PORT or https://HOST:PORT",
            ));
        }
    }
    Ok(())
}

/// `--rdzv-host-tls-cert`/`-key`: the TLS identity of a c10d host. Under c10d any node may host,
/// and its clients (itself included) reach it as `--rdzv-tls-ca` says, so the two come
/// together; other backends host nothing.
fn host_tls(
    a: &crate::cli::Args,
    mode: &RendezvousMode,
) -> Result<Option<drun_rendezvous::tls::ServerTlsFiles>, ConfigError> {
    let c10d = matches!(mode, RendezvousMode::C10d { .. });
    let h = &a.host_tls;
    match (&h.rdzv_host_tls_cert, &h.rdzv_host_tls_key) {
        (Some(cert), Some(key)) => {
            if !c10d {
                return Err(ConfigError::Conflict(
                    "--rdzv-host-tls-cert",
                    "a --rdzv-backend other than c10d (only a c10d agent hosts the rendezvous)",
                ));
            }
            let Some(ca) = &a.rdzv_tls_ca else {
                return Err(ConfigError::Missing {
                    flag: "--rdzv-tls-ca",
                    why: "a c10d host serving TLS is reached over TLS by every node, itself included: give every node --rdzv-tls-ca with the CA of --rdzv-host-tls-cert".into(),
                });
            };
            let files = drun_rendezvous::tls::ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                // With client certificates of their own the nodes require them of each other.
                client_ca: a.rdzv_tls_cert.as_ref().map(|_| ca.clone()),
            };
            Ok(Some(files))
        }
        _ if c10d && a.rdzv_tls_ca.is_some() => Err(ConfigError::Missing {
            flag: "--rdzv-host-tls-cert",
            why: "with --rdzv-backend c10d and --rdzv-tls-ca any node may host the rendezvous and must serve it over TLS: give every node --rdzv-host-tls-cert and --rdzv-host-tls-key for the --rdzv-endpoint host".into(),
        }),
        _ => Ok(None),
    }
}

/// `--preflight` and `--preflight-min-gbps` (a positive, finite number; only with `--preflight`).
fn preflight(a: &crate::cli::Args) -> Result<Option<super::Preflight>, ConfigError> {
    if let Some(v) = a.observe.preflight_min_gbps {
        if !(v.is_finite() && v > 0.0) {
            return Err(invalid(
                "--preflight-min-gbps",
                v.to_string(),
                "expected a bandwidth in Gbit/s above 0, e.g. 10",
            ));
        }
        if !a.observe.preflight {
            return Err(invalid(
                "--preflight-min-gbps",
                v.to_string(),
                "it only applies with --preflight; add --preflight",
            ));
        }
    }
    Ok(a.observe.preflight.then_some(super::Preflight {
        min_gbps: a.observe.preflight_min_gbps,
    }))
}

/// `--straggler-factor`: 0 (off) or a finite factor > 1.
fn straggler_factor(v: f64) -> Result<f64, ConfigError> {
    if v == 0.0 || (v.is_finite() && v > 1.0) {
        return Ok(v);
    }
    Err(invalid(
        "--straggler-factor",
        v.to_string(),
        "expected 0 (off) or a factor above 1, e.g. 1.5",
    ))
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
