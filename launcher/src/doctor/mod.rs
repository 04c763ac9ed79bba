//! `drun doctor [FLAGS] [SCRIPT]`: every setting the agent would resolve, where it came from,
//! and the known traps, without starting anything.
//!
//! # Theory of operation
//!
//! The command line is parsed as the agent parses it (flags, then `PET_*`/`DRUN_*` variables,
//! then defaults; clap tells which). [`Host::probe`] reads the machine, the Slurm or
//! Kubernetes detection fills what was left unset, and [`validate`] resolves the launch, all
//! exactly as `drun` does. [`rows`] then pairs each resolved setting with its source: `flag`,
//! `env PET_NNODES` (with the operator that injected it), `Slurm`, `Kubeflow TrainJob` (or
//! the other operators) when detection filled it, or `default`. The probes that touch the
//! machine (name resolution, a test bind of each port this node would listen on, PID 1 and
//! its command) feed the pure [`traps::traps`], which returns one warning per trap.

mod traps;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

pub use traps::{traps, Probes};

use crate::config::{validate, Host};
use crate::{Args, LaunchConfig, RendezvousMode};

/// Where a flag's value came from, as clap parsed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The command line.
    Flag,
    /// This environment variable.
    Env(String),
    /// The flag's default (or absent).
    Default,
}

/// One resolved setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Its name (the flag's, without dashes, or the field's).
    pub setting: &'static str,
    /// The value the agent would use.
    pub value: String,
    /// Where it came from.
    pub source: String,
}

/// Parses `argv` (`drun FLAGS [SCRIPT ARGS]`, without `doctor`) as the agent does, with each
/// flag's [`Origin`]. A missing script is fine: doctor starts nothing.
///
/// # Errors
/// clap's message, for a command line the agent would refuse too.
pub fn parse(argv: &[String]) -> Result<(Args, BTreeMap<String, Origin>), clap::Error> {
    let cmd = Args::command();
    let matches = match cmd.clone().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => {
            let mut with_script = argv.to_vec();
            with_script.push("SCRIPT".into());
            cmd.clone().try_get_matches_from(with_script)?
        }
        Err(e) => return Err(e),
    };
    let args = Args::from_arg_matches(&matches)?;
    let mut origins = BTreeMap::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str().to_string();
        let origin = match matches.value_source(&id) {
            Some(ValueSource::CommandLine) => Origin::Flag,
            Some(ValueSource::EnvVariable) => Origin::Env(
                arg.get_env()
                    .map(|e| e.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            _ => Origin::Default,
        };
        origins.insert(id, origin);
    }
    Ok((args, origins))
}

/// The resolved settings with their sources. Pure: `raw` is the parse, `cfg` what
/// [`validate`] made of it on `host`, `origins` from [`parse`].
pub fn rows(
    raw: &Args,
    origins: &BTreeMap<String, Origin>,
    cfg: &LaunchConfig,
    host: &Host,
) -> Vec<Row> {
    let detected = match (&cfg.scheduler.slurm, &cfg.scheduler.k8s) {
        (Some(_), _) => Some("Slurm".to_string()),
        (None, Some(k)) => Some(k.operator.name().to_string()),
        (None, None) => None,
    };
    // A value the user left unset that validation filled came from the detection.
    let source = |ids: &[&str], filled: bool| -> String {
        let from_user: Vec<String> = ids
            .iter()
            .filter_map(|id| match origins.get(*id) {
                Some(Origin::Flag) => Some("flag".to_string()),
                Some(Origin::Env(v)) => Some(match &cfg.scheduler.k8s {
                    Some(k) if v.starts_with("PET_") => format!("env {v} ({})", k.operator.name()),
                    _ => format!("env {v}"),
                }),
                _ => None,
            })
            .collect();
        match (filled, &detected) {
            (true, Some(d)) if from_user.is_empty() => d.clone(),
            (true, Some(d)) => format!("{} + {d}", from_user.join(", ")),
            _ if !from_user.is_empty() => from_user.join(", "),
            _ => "default".into(),
        }
    };
    let nnodes = format!("{}:{}", cfg.rdzv.min_nodes, cfg.rdzv.max_nodes);
    let raw_nnodes = crate::config::parse_nnodes(&raw.nnodes).ok();
    let node_rank = match &cfg.rdzv.mode {
        RendezvousMode::Static { node_rank, .. } => Some(*node_rank),
        _ => cfg.rdzv.requested_node_rank,
    };
    let (master, master_filled) = match &cfg.rdzv.mode {
        RendezvousMode::Static {
            master_addr,
            master_port,
            ..
        } => (
            format!("{master_addr}:{master_port}"),
            *master_addr != raw.master_addr || Some(*master_port) != raw.master_port,
        ),
        _ => ("(from the rendezvous)".to_string(), false),
    };
    let rdzv_filled = !matches!(cfg.rdzv.mode, RendezvousMode::Static { .. })
        && raw.rdzv_endpoint.is_none()
        && !raw.standalone;
    let shutdown_source = if origins.get("shutdown_timeout") != Some(&Origin::Default) {
        source(&["shutdown_timeout"], false)
    } else if host.var("TORCH_ELASTIC_SHUTDOWN_TIMEOUT").is_some() {
        "env TORCH_ELASTIC_SHUTDOWN_TIMEOUT".into()
    } else if cfg.scheduler.slurm.is_some() && host.slurm_kill_wait.is_some() {
        "Slurm (KillWait - 2 s)".into()
    } else if crate::container::in_kubernetes(|k| host.var(k).map(str::to_string)) {
        "default in Kubernetes (25 s, inside the 30 s terminationGracePeriodSeconds)".into()
    } else {
        "default".into()
    };
    let none = || "-".to_string();
    vec![
        Row {
            setting: "nnodes",
            value: nnodes,
            source: source(
                &["nnodes"],
                raw_nnodes != Some((cfg.rdzv.min_nodes, cfg.rdzv.max_nodes)),
            ),
        },
        Row {
            setting: "nproc-per-node",
            value: cfg.workers.nproc_per_node.to_string(),
            source: source(
                &["nproc_per_node"],
                cfg.scheduler
                    .k8s
                    .as_ref()
                    .is_some_and(|k| k.nproc_per_node.is_some())
                    || cfg
                        .scheduler
                        .slurm
                        .as_ref()
                        .is_some_and(|s| s.procs_hint.is_some())
                        && raw.nproc_per_node.trim() == "auto",
            ),
        },
        Row {
            setting: "node-rank",
            value: node_rank.map_or_else(none, |r| r.to_string()),
            source: source(
                &["node_rank"],
                node_rank.is_some() && raw.node_rank.is_none(),
            ),
        },
        Row {
            setting: "rendezvous",
            value: cfg.rdzv.mode.to_string(),
            source: match source(
                &["rdzv_backend", "rdzv_endpoint", "standalone"],
                rdzv_filled && detected.is_some(),
            ) {
                s if s == "default" && cfg.rdzv.mode.is_static() => {
                    "default (static: no --rdzv-endpoint)".into()
                }
                s => s,
            },
        },
        Row {
            setting: "run-id",
            value: cfg.run_id.clone(),
            source: if raw.rdzv_id == "none" && cfg.run_id == host.random_run_id {
                "default (random, one node)".into()
            } else {
                source(&["rdzv_id"], raw.rdzv_id != cfg.run_id)
            },
        },
        Row {
            setting: "master",
            value: master,
            source: source(&["master_addr", "master_port"], master_filled),
        },
        Row {
            setting: "max-restarts",
            value: cfg.supervision.max_restarts.to_string(),
            source: source(&["max_restarts"], false),
        },
        Row {
            setting: "join-timeout",
            value: drun_rendezvous::human::duration(cfg.rdzv.timing.join_timeout),
            source: source(&["rdzv_conf"], false),
        },
        Row {
            setting: "shutdown-timeout",
            value: drun_rendezvous::human::duration(cfg.supervision.shutdown_timeout),
            source: shutdown_source,
        },
        Row {
            setting: "termination-log",
            value: cfg.scheduler.termination_log.as_ref().map_or_else(
                || {
                    if std::path::Path::new(crate::container::DEFAULT_TERMINATION_LOG).exists() {
                        crate::container::DEFAULT_TERMINATION_LOG.to_string()
                    } else {
                        "- (/dev/termination-log is not mounted)".to_string()
                    }
                },
                |p| p.display().to_string(),
            ),
            source: source(&["termination_log"], false),
        },
        Row {
            setting: "state-dir",
            value: cfg
                .scheduler
                .state_dir
                .as_ref()
                .map_or_else(none, |p| p.display().to_string()),
            source: source(&["state_dir"], false),
        },
    ]
}

/// The report as printed: the detection line, the settings table, then the warnings.
pub fn render(cfg: &LaunchConfig, rows: &[Row], warnings: &[String]) -> String {
    let mut s = String::new();
    let env = match (&cfg.scheduler.slurm_line, &cfg.scheduler.k8s_line) {
        (Some(l), _) | (None, Some(l)) => l.clone(),
        _ => "no Slurm job or Kubernetes operator detected".into(),
    };
    let _ = writeln!(s, "drun doctor: {env}");
    let width = rows
        .iter()
        .map(|r| r.value.len())
        .max()
        .unwrap_or(0)
        .min(60);
    let _ = writeln!(s, "  {:<17} {:<width$}  source", "setting", "value");
    for r in rows {
        let _ = writeln!(s, "  {:<17} {:<width$}  {}", r.setting, r.value, r.source);
    }
    if warnings.is_empty() {
        let _ = writeln!(s, "no known trap found");
    } else {
        for w in warnings {
            let _ = writeln!(s, "warning: {w}");
        }
    }
    s
}

/// `drun doctor`: prints the report; exit 0, or 2 (one line) for a command line the agent would
/// refuse. `unset`: the empty `PET_*` variables the binary removed, with their warnings.
pub async fn run(argv: &[String], unset: &[(&'static str, String)]) -> u8 {
    let (raw, origins) = match parse(argv) {
        Ok(p) => p,
        Err(e) => {
            crate::say!(
                "drun doctor: {}",
                e.to_string().lines().next().unwrap_or("")
            );
            return crate::AgentExit::Usage.code();
        }
    };
    let host = Host::probe(&raw);
    let cfg = match validate(&raw, &host) {
        Ok(c) => c,
        Err(e) => {
            crate::say!("drun doctor: error: {e}");
            return crate::AgentExit::Usage.code();
        }
    };
    let probes = Probes::gather(&cfg).await;
    let rows = rows(&raw, &origins, &cfg, &host);
    let mut warnings: Vec<String> = unset.iter().map(|(_, w)| w.clone()).collect();
    warnings.extend(traps(&cfg, &raw, &host, &probes));
    print!("{}", render(&cfg, &rows, &warnings));
    0
}

#[cfg(test)]
mod tests;
