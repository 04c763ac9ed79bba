//! Choosing the rendezvous backend and run id from the command line, by torchrun's rules.

use std::collections::BTreeMap;

use super::{invalid, Host, RendezvousMode};
use crate::slurm::SlurmJob;
use crate::{Args, ConfigError};

/// What [`rendezvous_mode`] needs besides the command line.
pub(super) struct Nodes<'a> {
    /// `--nnodes` MIN.
    pub min: u32,
    /// `--nnodes` MAX.
    pub max: u32,
    /// Parsed `--rdzv-conf`.
    pub conf: &'a BTreeMap<String, String>,
    /// The Slurm job, if any.
    pub slurm: Option<&'a SlurmJob>,
    /// The Kubernetes job, if any.
    pub k8s: Option<&'a crate::k8s::K8sJob>,
}

/// Chooses the rendezvous mode and run id following torchrun's rules, plus drun's refusals
/// (no silent localhost fallback, no shared default run id across nodes).
pub(super) fn rendezvous_mode(
    a: &Args,
    n: &Nodes<'_>,
    host: &Host,
    notes: &mut Vec<String>,
) -> Result<(RendezvousMode, String), ConfigError> {
    let endpoint = a.rdzv_endpoint.as_deref().unwrap_or_default();
    if a.rdzv_endpoint.is_some() && endpoint.trim().is_empty() && !a.standalone {
        return Err(ConfigError::Empty {
            flag: "--rdzv-endpoint",
            why: "give HOST:PORT (the rendezvous server, the c10d host, or etcd), or drop the flag for a one-node run".into(),
        });
    }
    check_run_id(&a.rdzv_id)?;
    let backend = match a.rdzv_backend.as_deref() {
        Some(b) => b,
        None if endpoint.is_empty() => "static",
        None => "drun",
    };
    if !matches!(
        backend,
        "static" | "c10d" | "embedded" | "etcd" | "etcd-v2" | "drun"
    ) {
        return Err(invalid(
            "--rdzv-backend",
            backend,
            "expected drun, c10d, embedded, etcd, etcd-v2 or static",
        ));
    }
    // torchrun run(): static + no endpoint + no --master-port + one node = standalone.
    let implicit_standalone =
        backend == "static" && endpoint.is_empty() && a.master_port.is_none() && n.max == 1;
    if a.standalone || implicit_standalone {
        return standalone(a, n.max, host, notes);
    }
    if backend == "static" {
        return static_mode(a, n, host);
    }
    dynamic_mode(a, backend, n, host, notes)
}

/// `--standalone` (or torchrun's implicit standalone): the in-process rendezvous.
fn standalone(
    a: &Args,
    max_nodes: u32,
    host: &Host,
    notes: &mut Vec<String>,
) -> Result<(RendezvousMode, String), ConfigError> {
    if max_nodes > 1 {
        return Err(invalid(
            "--nnodes",
            a.nnodes.clone(),
            "--standalone runs one node; drop --standalone or use --nnodes 1",
        ));
    }
    if a.standalone && (a.rdzv_endpoint.is_some() || a.rdzv_backend.is_some()) {
        notes.push(
            "--standalone: ignoring the explicit --rdzv-endpoint/--rdzv-backend, as torchrun does"
                .into(),
        );
    }
    if a.standalone && a.master_port.is_some() {
        notes.push(
            "--standalone: ignoring --master-port (MASTER_PORT is a free port this agent reserves), as torchrun does; drop --standalone to use a fixed port"
                .into(),
        );
    }
    let mode = RendezvousMode::Embedded {
        master_addr: a.local_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
        fixed_port: None,
    };
    // torchrun draws a random run id; an explicit --rdzv-id is kept so that a later launch
    // with the same id resumes this run's checkpoints (from --ckpt-dir).
    let run_id = if a.rdzv_id != "none" {
        a.rdzv_id.clone()
    } else {
        host.random_run_id.clone()
    };
    Ok((mode, run_id))
}

/// A run id names the run's keys in the store (`/drun/v1/<run>/...`): it must not be empty
/// (`--rdzv-id ''`, `PET_RDZV_ID=`) nor hold a `/` (run `a` would then see run `a/waiting`'s
/// keys as its own), whitespace or control characters, nor be `.` or `..` (it names the run's
/// checkpoint and log directories).
fn check_run_id(id: &str) -> Result<(), ConfigError> {
    if id.trim().is_empty() {
        return Err(ConfigError::Empty {
            flag: "--rdzv-id",
            why: "give the run a name shared by all its nodes (e.g. --rdzv-id myjob-42), or drop the flag for a one-node run".into(),
        });
    }
    if id.len() > drun_rendezvous::server::validate::MAX_ID {
        return Err(ConfigError::Invalid {
            flag: "--rdzv-id",
            value: format!("{}...", id.chars().take(32).collect::<String>()),
            why: format!(
                "the run id is {} bytes long; a rendezvous server takes at most {}",
                id.len(),
                drun_rendezvous::server::validate::MAX_ID
            ),
        });
    }
    if id == "." || id == ".." {
        return Err(ConfigError::Invalid {
            flag: "--rdzv-id",
            value: id.to_string(),
            why: "a run id also names directories (checkpoints under --ckpt-dir, logs), where '.' and '..' are not names: use letters, digits and -_.:@".into(),
        });
    }
    if id.contains('/') || id.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::Invalid {
            flag: "--rdzv-id",
            value: id.escape_debug().to_string(),
            why: "a run id names the run's keys in the store: use letters, digits and -_.:@ (no '/', spaces or control characters)".into(),
        });
    }
    Ok(())
}

/// torchrun's static backend: one node on a fixed port, or several with `--node-rank`.
fn static_mode(
    a: &Args,
    n: &Nodes<'_>,
    host: &Host,
) -> Result<(RendezvousMode, String), ConfigError> {
    let endpoint = a.rdzv_endpoint.as_deref().unwrap_or_default();
    let run_id = if a.rdzv_id != "none" {
        a.rdzv_id.clone()
    } else {
        host.var("SLURM_JOB_ID")
            .filter(|j| !j.is_empty())
            .map_or_else(|| a.rdzv_id.clone(), str::to_string)
    };
    // torchrun: a static launch's endpoint, when given, is the master address and port.
    let (master_addr, master_port) = if endpoint.trim().is_empty() {
        (a.master_addr.clone(), a.master_port.unwrap_or(29500))
    } else {
        let ep = crate::rdzv::endpoints(endpoint, a.master_port.unwrap_or(29500))?.remove(0);
        let (host, port) = ep.rsplit_once(':').expect("endpoints() adds a port");
        (
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port.parse().expect("endpoints() validated the port"),
        )
    };
    if n.max == 1 {
        let mode = RendezvousMode::Embedded {
            master_addr,
            fixed_port: Some(master_port),
        };
        return Ok((mode, run_id));
    }
    if n.min != n.max {
        return Err(invalid(
            "--nnodes",
            a.nnodes.clone(),
            "the static backend needs a fixed node count; use --rdzv-endpoint for MIN:MAX",
        ));
    }
    let node_rank = a.node_rank.ok_or_else(|| {
        invalid(
            "--nnodes",
            a.nnodes.clone(),
            "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (dynamic rendezvous), or --node-rank with --master-addr/--master-port on every node (static); drun never assumes localhost",
        )
    })?;
    if node_rank >= n.max {
        return Err(invalid(
            "--node-rank",
            node_rank.to_string(),
            format!("must be below --nnodes {}", n.max),
        ));
    }
    let mode = RendezvousMode::Static {
        node_rank,
        master_addr,
        master_port,
    };
    Ok((mode, run_id))
}

/// A dynamic backend (drun, embedded, c10d, etcd): needs an endpoint and a shared run id.
fn dynamic_mode(
    a: &Args,
    backend: &str,
    n: &Nodes<'_>,
    host: &Host,
    notes: &mut Vec<String>,
) -> Result<(RendezvousMode, String), ConfigError> {
    let endpoint = a.rdzv_endpoint.as_deref().unwrap_or_default();
    let run_id = if a.rdzv_id != "none" {
        a.rdzv_id.clone()
    } else if let Some(job) = host.var("SLURM_JOB_ID").filter(|j| !j.is_empty()) {
        job.to_string()
    } else if n.max > 1 && matches!(backend, "c10d" | "embedded") {
        // torchrun's default: the store lives in this job's host agent and starts empty, so no
        // earlier job's state is found under "none" (failure case 8 is a persistent store's).
        notes.push(
            "no --rdzv-id: the run id is 'none', as torchrun's; two jobs on one --rdzv-endpoint need ids of their own".into(),
        );
        a.rdzv_id.clone()
    } else if n.max > 1 {
        return Err(ConfigError::Missing {
            flag: "--rdzv-id",
            why: "a multi-node run needs a run id shared by all its nodes; pass the same one on every node (e.g. --rdzv-id myjob-42)".into(),
        });
    } else {
        a.rdzv_id.clone()
    };
    if endpoint.trim().is_empty() {
        return Err(ConfigError::Missing {
            flag: "--rdzv-endpoint",
            why: format!(
                "--rdzv-backend {backend} needs --rdzv-endpoint HOST:PORT (a drun-rendezvous server, the c10d host, or etcd); drun never falls back to localhost"
            ),
        });
    }
    if a.master_port.is_some() {
        notes.push("--master-port only applies to the static backend; MASTER_PORT comes from the rendezvous".into());
    }
    let mode = match backend {
        "drun" => RendezvousMode::Server {
            endpoints: crate::rdzv::endpoints(endpoint, 29400)?,
        },
        "embedded" => {
            // The agent on the endpoint's host serves the rendezvous (Slurm: the first node).
            let endpoint = crate::rdzv::endpoints(endpoint, 29400)?.remove(0);
            let is_host = n
                .slurm
                .map(SlurmJob::hosts_rendezvous)
                .or_else(|| n.k8s.and_then(|k| k.hosts(&endpoint)));
            RendezvousMode::C10d { endpoint, is_host }
        }
        "c10d" => {
            let is_host = match n.conf.get("is_host").map(|v| v.trim().to_ascii_lowercase()) {
                None => n.k8s.and_then(|k| k.hosts(endpoint)),
                Some(v) if matches!(v.as_str(), "1" | "true" | "yes" | "on") => Some(true),
                Some(v) if matches!(v.as_str(), "0" | "false" | "no" | "off") => Some(false),
                Some(v) => {
                    return Err(invalid(
                        "--rdzv-conf",
                        format!("is_host={v}"),
                        "expected 1 or 0",
                    ))
                }
            };
            let endpoint = crate::rdzv::endpoints(endpoint, 29400)?.remove(0);
            RendezvousMode::C10d { endpoint, is_host }
        }
        _ => RendezvousMode::Etcd {
            endpoints: crate::rdzv::endpoints(endpoint, 2379)?,
        },
    };
    Ok((mode, run_id))
}
