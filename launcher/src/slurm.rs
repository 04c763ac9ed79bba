//! Running inside a Slurm allocation (`srun drun ...` in a batch script).
//!
//! # Theory of operation
//!
//! When `SLURM_JOB_ID` is set (and `--slurm off` was not given), [`detect`] reads the job and
//! [`SlurmJob::fill`] completes the command line with what the user did not say: the run id
//! (`SLURM_JOB_ID`, or `<array job>_<task>` for array jobs), `--nnodes` (`SLURM_JOB_NUM_NODES`),
//! the node rank (`SLURM_NODEID`), the node's address (`SLURMD_NODENAME`), and the rendezvous:
//! the `embedded` backend, hosted by the agent on the first node of `SLURM_JOB_NODELIST` on a
//! port derived from the job id, with every other agent connecting to it. An explicit flag always
//! wins. `--shutdown-timeout` defaults to Slurm's `KillWait` minus 2 s so workers are stopped
//! (SIGTERM forwarded by drun: with proctrack/cgroup only the agent gets Slurm's SIGTERM) before
//! Slurm's SIGKILL.
//!
//! Measured Slurm behaviour is in the shared `slurm.md`.

use std::process::Command;
use std::time::Duration;

use crate::{Args, ConfigError};

mod hostlist;
pub use hostlist::{parse_hostlist, HostlistError, MAX_HOSTLIST_BYTES, MAX_HOSTS, MAX_WIDTH};

/// `--slurm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SlurmMode {
    /// Use SLURM_* when SLURM_JOB_ID is set.
    #[default]
    Auto,
    /// Ignore Slurm.
    Off,
}

/// `--on-preempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnPreempt {
    /// Relay the warning signal to the workers, nothing else.
    #[default]
    Relay,
    /// Coordinated checkpoint of the whole job, then exit 5.
    Checkpoint,
}

/// What drun takes from the Slurm environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// Run id: the job id, or `<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>`.
    pub run_id: String,
    /// `SLURM_JOB_NUM_NODES` (or `SLURM_NNODES`).
    pub nnodes: Option<u32>,
    /// `SLURM_NODEID`: this node's index in the allocation.
    pub node_id: Option<u32>,
    /// This node's name (`SLURMD_NODENAME`).
    pub node_name: Option<String>,
    /// Hosts of `SLURM_JOB_NODELIST`, in order.
    pub hosts: Vec<String>,
    /// `SLURM_RESTART_COUNT` (0 for the first run; a requeued job counts up).
    pub restart_count: u32,
    /// `SLURM_GPUS_ON_NODE`, for `--nproc-per-node auto`.
    pub procs_hint: Option<u32>,
    /// Tasks and nodes of the srun step drun runs in (`SLURM_STEP_NUM_TASKS`,
    /// `SLURM_STEP_NUM_NODES`), when inside one.
    pub step_tasks: Option<(u32, u32)>,
}

/// Default port of the embedded rendezvous: 20000 + job id mod 10000, so two jobs sharing their
/// first node do not collide.
pub fn rendezvous_port(job_id: &str) -> u16 {
    let n: u64 = job_id
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0u64, |a, b| (a * 10 + u64::from(b - b'0')) % 10_000);
    20_000 + n as u16
}

/// Reads the Slurm job from `env` (a lookup such as `std::env::var`); `None` outside Slurm.
///
/// # Errors
/// An unparsable `SLURM_JOB_NODELIST`; `SLURM_JOB_NUM_NODES` (`SLURM_NNODES`), `SLURM_NODEID`
/// or `SLURM_RESTART_COUNT` set but not a whole number.
pub fn detect(env: impl Fn(&str) -> Option<String>) -> Result<Option<SlurmJob>, ConfigError> {
    let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let Some(job_id) = get("SLURM_JOB_ID").or_else(|| get("SLURM_JOBID")) else {
        return Ok(None);
    };
    let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u32>().ok());
    // The variables that place this node in the rendezvous: one that is set but not a number
    // (an `export` by hand, a wrapper script's typo) would silently make drun guess.
    let placing = |k: &'static str| -> Result<Option<u32>, ConfigError> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<u32>()
                .map(Some)
                .map_err(|_| ConfigError::Invalid {
                    flag: k,
                    value: v,
                    why: "Slurm sets it to a whole number; unset it or fix the script that set it"
                        .into(),
                }),
        }
    };
    let run_id = match (get("SLURM_ARRAY_JOB_ID"), get("SLURM_ARRAY_TASK_ID")) {
        (Some(a), Some(t)) => format!("{a}_{t}"),
        _ => job_id.clone(),
    };
    let hosts = match get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST")) {
        Some(list) => parse_hostlist(&list).map_err(|why| ConfigError::Invalid {
            flag: "SLURM_JOB_NODELIST",
            value: list.clone(),
            why: why.to_string(),
        })?,
        None => Vec::new(),
    };
    Ok(Some(SlurmJob {
        job_id,
        run_id,
        nnodes: match placing("SLURM_JOB_NUM_NODES")? {
            Some(n) => Some(n),
            None => placing("SLURM_NNODES")?,
        },
        node_id: placing("SLURM_NODEID")?,
        node_name: get("SLURMD_NODENAME"),
        hosts,
        restart_count: placing("SLURM_RESTART_COUNT")?.unwrap_or(0),
        procs_hint: num("SLURM_GPUS_ON_NODE"),
        step_tasks: num("SLURM_STEP_NUM_TASKS").zip(num("SLURM_STEP_NUM_NODES")),
    }))
}

impl SlurmJob {
    /// Completes `a` with what the user did not set; returns one line saying what was taken.
    ///
    /// # Errors
    /// More than one task per node in the srun step (drun is the one task of its node and starts
    /// the workers itself); a multi-node job without a node list and no `--rdzv-endpoint`.
    pub fn fill(&self, a: &mut Args) -> Result<String, ConfigError> {
        if let Some((tasks, nodes)) = self.step_tasks.filter(|(t, n)| t > n) {
            return Err(ConfigError::Invalid {
                flag: "srun",
                value: format!("{tasks} tasks on {nodes} nodes"),
                why: "run one drun per node (srun --ntasks-per-node=1); drun starts the workers itself (--nproc-per-node)".into(),
            });
        }
        let mut taken = Vec::new();
        if a.rdzv_id == "none" {
            a.rdzv_id = self.run_id.clone();
            taken.push(format!("run id {}", self.run_id));
        }
        if a.nnodes == "1:1" {
            if let Some(n) = self.nnodes.filter(|n| *n > 1) {
                // Elastic down to one node: Slurm never replaces a lost node, so the survivors
                // carry on (from the last checkpoint) instead of waiting for it.
                a.nnodes = format!("1:{n}");
                taken.push(format!("--nnodes 1:{n}"));
            }
        }
        if a.node_rank.is_none() {
            if let Some(r) = self.node_id {
                a.node_rank = Some(r);
                taken.push(format!("node rank {r}"));
            }
        }
        if a.local_addr.is_none() {
            if let Some(n) = &self.node_name {
                a.local_addr = Some(n.clone());
                taken.push(format!("address {n}"));
            }
        }
        if a.nproc_per_node.trim() == "auto" {
            if let Some(p) = self.procs_hint {
                a.nproc_per_node = p.to_string();
                taken.push(format!("--nproc-per-node {p} (SLURM_GPUS_ON_NODE)"));
            }
        }
        let multi = self.nnodes.unwrap_or(1) > 1;
        if a.rdzv_endpoint.is_none() && a.rdzv_backend.is_none() && multi {
            let Some(first) = self.hosts.first() else {
                return Err(ConfigError::Invalid {
                    flag: "SLURM_JOB_NODELIST",
                    value: String::new(),
                    why:
                        "a multi-node Slurm job without a node list: give --rdzv-endpoint HOST:PORT"
                            .into(),
                });
            };
            let endpoint = format!("{first}:{}", rendezvous_port(&self.job_id));
            a.rdzv_backend = Some("embedded".into());
            taken.push(format!(
                "rendezvous embedded (c10d) on {endpoint} (hosted by the agent on {first})"
            ));
            a.rdzv_endpoint = Some(endpoint);
        }
        let restart = if self.restart_count > 0 {
            format!(" (requeued, restart {})", self.restart_count)
        } else {
            String::new()
        };
        let what = if taken.is_empty() {
            "every setting given on the command line".to_string()
        } else {
            taken.join(", ")
        };
        Ok(format!("slurm job {}{restart}: {what}", self.job_id))
    }

    /// Whether checkpoint files of an earlier job may be resumed: only by a requeued job (same
    /// id, `SLURM_RESTART_COUNT` > 0). A fresh job whose id was used before (ids restart after a
    /// controller state loss, or on another cluster sharing the filesystem) starts fresh.
    pub fn may_resume_files(&self) -> bool {
        self.restart_count > 0
    }

    /// Whether this agent hosts the embedded rendezvous: it runs on the allocation's first node.
    pub fn hosts_rendezvous(&self) -> bool {
        match (&self.node_name, self.hosts.first(), self.node_id) {
            (Some(me), Some(first), _) => me == first,
            (_, _, Some(id)) => id == 0,
            _ => false,
        }
    }
}

/// Slurm's `KillWait` (seconds between SIGTERM and SIGKILL), from `scontrol show config`;
/// `None` when scontrol is missing or does not answer within 3 s.
pub fn kill_wait() -> Option<Duration> {
    let out = Command::new("timeout")
        .args(["3", "scontrol", "show", "config"])
        .output()
        .ok()?;
    parse_kill_wait(&String::from_utf8_lossy(&out.stdout))
}

fn parse_kill_wait(config: &str) -> Option<Duration> {
    config.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        if k.trim() != "KillWait" {
            return None;
        }
        let n: u64 = v.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_secs(n))
    })
}

/// `scontrol requeue $SLURM_JOB_ID`, after a preemption checkpoint (node rank 0 only, with
/// `--requeue`). Problems are said on stderr, never fatal: the checkpoint is sealed either way.
pub fn requeue(job: Option<&SlurmJob>) {
    let Some(job) = job.map(|j| j.job_id.as_str()) else {
        crate::say!("drun: --requeue: not inside a Slurm job; nothing to requeue");
        return;
    };
    match Command::new("scontrol").args(["requeue", job]).output() {
        Ok(o) if o.status.success() => {
            tracing::info!("requeued Slurm job {job} (scontrol requeue)");
        }
        Ok(o) => crate::say!(
            "drun: scontrol requeue {job} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => crate::say!("drun: cannot run scontrol requeue {job}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn detection_fills_only_what_the_user_left_unset() {
        let job = detect(env(&[
            ("SLURM_JOB_ID", "6"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURMD_NODENAME", "n2"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_NTASKS_PER_NODE", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert!(!job.hosts_rendezvous());
        use clap::Parser;
        let mut a = Args::try_parse_from(["drun", "--nproc-per-node", "2", "t.py"]).unwrap();
        let line = job.fill(&mut a).unwrap();
        assert_eq!(
            (a.rdzv_id.as_str(), a.nnodes.as_str(), a.node_rank),
            ("6", "1:2", Some(1))
        );
        assert_eq!(a.rdzv_endpoint.as_deref(), Some("n1:20006"));
        assert_eq!(a.rdzv_backend.as_deref(), Some("embedded"));
        assert_eq!(a.local_addr.as_deref(), Some("n2"));
        assert_eq!(a.nproc_per_node, "2", "an explicit --nproc-per-node wins");
        assert!(
            line.starts_with("slurm job 6: run id 6, --nnodes 1:2, node rank 1"),
            "{line}"
        );
        let mut b = Args::try_parse_from([
            "drun",
            "--rdzv-id",
            "mine",
            "--nnodes",
            "1:2",
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            "e:2379",
            "t.py",
        ])
        .unwrap();
        job.fill(&mut b).unwrap();
        assert_eq!(
            (
                b.rdzv_id.as_str(),
                b.nnodes.as_str(),
                b.rdzv_endpoint.as_deref()
            ),
            ("mine", "1:2", Some("e:2379"))
        );
        let array = detect(env(&[
            ("SLURM_JOB_ID", "41"),
            ("SLURM_ARRAY_JOB_ID", "40"),
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_GPUS_ON_NODE", "8"),
            ("SLURM_RESTART_COUNT", "1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (array.run_id.as_str(), array.procs_hint, array.restart_count),
            ("40_3", Some(8), 1)
        );
        assert_eq!(detect(env(&[])).unwrap(), None);
        let crowded = detect(env(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_STEP_NUM_NODES", "2"),
        ]))
        .unwrap()
        .unwrap();
        let mut c = Args::try_parse_from(["drun", "t.py"]).unwrap();
        assert!(crowded
            .fill(&mut c)
            .unwrap_err()
            .to_string()
            .contains("srun --ntasks-per-node=1"));
        let listless = detect(env(&[("SLURM_JOB_ID", "8"), ("SLURM_JOB_NUM_NODES", "2")]))
            .unwrap()
            .unwrap();
        let mut d = Args::try_parse_from(["drun", "t.py"]).unwrap();
        assert!(listless.fill(&mut d).is_err());
    }

    #[test]
    fn a_placing_variable_that_is_not_a_number_is_refused_by_name() {
        for (k, v) in [
            ("SLURM_NNODES", "abc"),
            ("SLURM_JOB_NUM_NODES", "2x"),
            ("SLURM_NODEID", "-1"),
            ("SLURM_RESTART_COUNT", "one"),
        ] {
            let e = detect(env(&[("SLURM_JOB_ID", "6"), (k, v)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(k) && e.contains(v), "{e}");
            assert!(e.contains("unset it or fix"), "{e}");
        }
        let job = detect(env(&[("SLURM_JOB_ID", "6"), ("SLURM_NNODES", " 3 ")]))
            .unwrap()
            .unwrap();
        assert_eq!(job.nnodes, Some(3));
    }

    #[test]
    fn kill_wait_parses_scontrol_output() {
        assert_eq!(
            parse_kill_wait("JobCompType = jobcomp/none\nKillWait                = 10 sec\n"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(parse_kill_wait("nothing"), None);
    }
}
