//! What validation reads from the machine ([`Host`]), and the side effects after it ([`prepare`]).
//!
//! [`Host::probe`] only reads (hostname, core and GPU counts, the environment, Slurm's
//! `KillWait`) so that [`super::validate`] can be a pure function of the command line and the
//! host. [`prepare`] then does what touches the filesystem: it resolves the worker command
//! (the script and interpreter must exist), creates and canonicalizes `--ckpt-dir`, and reads
//! the `--ckpt-resume-from` manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::local_addr::AddrCheck;
use super::{invalid, LaunchConfig};
use crate::command::Entrypoint;
use crate::slurm::{self, SlurmMode};
use crate::{Args, ConfigError};

/// What was read from the machine for validation. Tests build it as a plain struct.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// Full hostname (the node id's address when `--local-addr` is absent).
    pub hostname: String,
    /// This pod's FQDN from `/etc/hosts` (`<hostname>.<subdomain>.<ns>.svc...`), when the
    /// kubelet wrote one (a pod with a subdomain); for Kubernetes detection.
    pub fqdn: Option<String>,
    /// The agent's pid (part of the node id).
    pub pid: u32,
    /// Usable CPU cores (`--nproc-per-node cpu`).
    pub cpu_count: u32,
    /// Visible NVIDIA GPUs (`--nproc-per-node gpu`).
    pub gpu_count: u32,
    /// The environment (variables whose name and value are UTF-8).
    pub env: BTreeMap<String, String>,
    /// Run id of a standalone launch without `--rdzv-id` (torchrun draws a random one).
    pub random_run_id: String,
    /// Slurm's `KillWait`, probed only inside Slurm when no shutdown timeout was given.
    pub slurm_kill_wait: Option<Duration>,
    /// What the machine says of `--local-addr`, when it was given.
    pub local_addr: Option<AddrCheck>,
}

impl Host {
    /// Reads this machine: what [`super::validate`] needs for `a`.
    pub fn probe(a: &Args) -> Self {
        let env: BTreeMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        let lookup = |k: &str| env.get(k).cloned();
        // `scontrol show config` takes up to 3 s: only when its answer is the default used.
        let needs_kill_wait = a.slurm == SlurmMode::Auto
            && !a.standalone
            && a.shutdown_timeout.is_none()
            && !env.contains_key("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
            && matches!(slurm::detect(lookup), Ok(Some(_)));
        let hostname = crate::os::hostname();
        let fqdn = std::fs::read_to_string("/etc/hosts")
            .ok()
            .and_then(|h| crate::k8s::fqdn_from_hosts(&h, &hostname));
        Host {
            fqdn,
            hostname,
            pid: std::process::id(),
            cpu_count: cpu_count(),
            gpu_count: gpu_count(env.get("CUDA_VISIBLE_DEVICES").map(String::as_str)),
            random_run_id: uuid::Uuid::new_v4().to_string(),
            slurm_kill_wait: if needs_kill_wait {
                slurm::kill_wait()
            } else {
                None
            },
            local_addr: a.local_addr.as_deref().map(check_local_addr),
            env,
        }
    }

    /// An environment variable.
    pub fn var(&self, key: &str) -> Option<&str> {
        self.env.get(key).map(String::as_str)
    }
}

/// Resolves `--local-addr` (an address stands for itself) and asks the kernel whether this host
/// holds it.
fn check_local_addr(flag: &str) -> AddrCheck {
    use std::net::ToSocketAddrs;
    let bare = flag.trim_start_matches('[').trim_end_matches(']');
    let resolved: Vec<std::net::IpAddr> = match bare.parse() {
        Ok(ip) => vec![ip],
        Err(_) => (flag, 0)
            .to_socket_addrs()
            .map(|it| it.map(|s| s.ip()).collect())
            .unwrap_or_default(),
    };
    AddrCheck {
        held: resolved
            .iter()
            .any(|ip| crate::os::ports::holds_address(*ip)),
        interfaces: crate::os::ports::interface_addresses(),
        resolved,
    }
}

/// Usable CPU cores (affinity- and cgroup-aware, like `os.sched_getaffinity`).
pub fn cpu_count() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// NVIDIA devices the workers would see: the driver's device list, narrowed by
/// `CUDA_VISIBLE_DEVICES` when set (like `torch.cuda.device_count()`).
pub fn gpu_count(cuda_visible_devices: Option<&str>) -> u32 {
    let physical = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|d| d.count() as u32)
        .unwrap_or(0);
    match cuda_visible_devices {
        Some(v) => (v.split(',').filter(|s| !s.trim().is_empty()).count() as u32).min(physical),
        None => physical,
    }
}

/// Whether the termination log can be written when drun exits: checked at start, so a wrong
/// path is said before the run rather than in a warning after it.
fn termination_log_usable(p: &Path) -> Result<(), TerminationLogError> {
    if p.is_dir() {
        return Err(TerminationLogError::Directory);
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(TerminationLogError::NoDirectory(dir.to_path_buf()));
    }
    Ok(())
}

/// Why `--termination-log` cannot be written when drun exits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum TerminationLogError {
    /// It names a directory.
    #[error("that is a directory; name a file (Kubernetes: /dev/termination-log)")]
    Directory,
    /// Its directory does not exist.
    #[error("its directory {} does not exist; name a file in an existing directory (Kubernetes: /dev/termination-log)", .0.display())]
    NoDirectory(std::path::PathBuf),
}

/// The side effects of a validated launch: resolves the worker command, creates
/// `--ckpt-dir` (and checks it is writable), reads the `--ckpt-resume-from` manifest; paths
/// become absolute.
///
/// # Errors
/// A missing script or interpreter, an unusable checkpoint directory, an unreadable manifest.
pub fn prepare(mut cfg: LaunchConfig) -> Result<LaunchConfig, ConfigError> {
    let e = &cfg.workers.entrypoint;
    let script_and_args: Vec<String> = std::iter::once(e.script.clone())
        .chain(e.args.iter().cloned())
        .collect();
    let python = cfg
        .workers
        .python
        .as_deref()
        .map(|p| (p, cfg.workers.python_source));
    cfg.workers.entrypoint = Entrypoint::resolve(e.kind, &script_and_args, python)?;
    if let Some(d) = cfg.ckpt.dir.take() {
        cfg.ckpt.dir = Some(checkpoint_dir(d)?);
    }
    if let Some(p) = &cfg.scheduler.termination_log {
        termination_log_usable(p).map_err(|why| {
            invalid(
                "--termination-log",
                p.display().to_string(),
                why.to_string(),
            )
        })?;
    }
    if let Some(dir) = &cfg.scheduler.state_dir {
        let n = crate::container::count_restart(dir)
            .map_err(|why| invalid("--state-dir", dir.display().to_string(), why.to_string()))?;
        cfg.scheduler.container_restarts = Some(n);
    }
    if let Some(p) = cfg.ckpt.resume_from.take() {
        let (file, _) = crate::ckpt::read_adoptable(&p).map_err(|why| {
            invalid(
                "--ckpt-resume-from",
                p.display().to_string(),
                why.to_string(),
            )
        })?;
        cfg.ckpt.resume_from = Some(std::fs::canonicalize(&file).unwrap_or(file));
    }
    if let Some(f) = &cfg.security.rdzv_token_file {
        cfg.security.rdzv_token = crate::rdzv::token::resolve(Some(f), None).map_err(|why| {
            invalid(
                "--rdzv-token-file",
                f.display().to_string(),
                why.to_string(),
            )
        })?;
    }
    if let Some(files) = &cfg.security.rdzv_host_tls {
        files.load_named(super::HOST_TLS_FLAGS)?;
    }
    if let Some((ca, cert, key)) = &cfg.security.rdzv_tls_files {
        cfg.security.rdzv_tls = Some(drun_rendezvous::server::tls::ClientTls::from_files(
            ca,
            cert.as_deref(),
            key.as_deref(),
        )?);
    }
    slurm_token(&mut cfg);
    if !cfg.security.etcd_access_files.is_empty() {
        let env = std::env::var(drun_rendezvous::store::etcd::access::PASSWORD_VAR).ok();
        cfg.security.etcd_access = cfg.security.etcd_access_files.load(env.as_deref())?;
    }
    Ok(cfg)
}

/// Under Slurm, with a rendezvous hosted by an agent of the job and no token given: the token
/// derived from the job id ([`crate::slurm_token`]), said in the Slurm line; when the secret
/// cannot be had, a note that the rendezvous stays open.
fn slurm_token(cfg: &mut LaunchConfig) {
    let (Some(job), Some(path)) = (&cfg.scheduler.slurm, &cfg.security.slurm_secret) else {
        return;
    };
    if cfg.security.rdzv_token.is_some()
        || !matches!(cfg.rdzv.mode, crate::RendezvousMode::C10d { .. })
    {
        return;
    }
    match crate::slurm_token::read_or_create(path) {
        Ok(secret) => {
            cfg.security.rdzv_token = Some(crate::slurm_token::derive(&secret, &job.job_id));
            if let Some(line) = &mut cfg.scheduler.slurm_line {
                line.push_str(&format!(
                    ", rendezvous token derived from the job id and {} ({})",
                    path.display(),
                    crate::slurm_token::SECRET_VAR
                ));
            }
        }
        Err(why) => cfg.notes.push(format!(
            "the rendezvous of this Slurm job is open to anyone who can reach it: {why}; or give --rdzv-token-file"
        )),
    }
}

/// Creates `--ckpt-dir`, checks that files can be written in it, returns it absolute.
fn checkpoint_dir(d: PathBuf) -> Result<PathBuf, ConfigError> {
    let path_err = |source| ConfigError::Path {
        what: "checkpoint directory (--ckpt-dir)",
        path: d.clone(),
        source,
    };
    if d.exists() && !d.is_dir() {
        return Err(invalid(
            "--ckpt-dir",
            d.display().to_string(),
            "exists and is not a directory",
        ));
    }
    std::fs::create_dir_all(&d).map_err(path_err)?;
    // Checkpoints, manifests and the `latest` pointer are written here: fail now, not at the
    // first commit.
    tempfile::tempfile_in(&d).map_err(path_err)?;
    std::fs::canonicalize(&d).map_err(path_err)
}
