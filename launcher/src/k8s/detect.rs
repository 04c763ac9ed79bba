//! [`detect`]: the pod environment in, the operator and its settings out. Pure.

use std::collections::BTreeMap;

use super::{K8sJob, Operator, RDZV_PORT};

/// The operator's view of this pod: the environment, the hostname (`HOSTNAME`, the pod's
/// `spec.hostname` or name) and the FQDN (`<hostname>.<subdomain>.<ns>.svc.<domain>`, from
/// `/etc/hosts`, when the pod has a subdomain). `None` outside a recognized operator.
///
/// Order: Trainer v2 (its pods are also JobSet pods), Volcano (its pytorch plugin also sets
/// `MASTER_ADDR`), PyTorchJob with `elasticPolicy`, PyTorchJob, JobSet, Indexed Job.
pub fn detect(
    env: &BTreeMap<String, String>,
    hostname: &str,
    fqdn: Option<&str>,
) -> Option<K8sJob> {
    let get = |k: &str| env.get(k).map(|v| v.trim().to_string());
    let set = |k: &str| get(k).is_some_and(|v| !v.is_empty());
    let host = hostname.split('.').next().unwrap_or(hostname);
    let completion_index = get("JOB_COMPLETION_INDEX").and_then(|v| v.parse::<u32>().ok());
    let mut job = if set("PET_MASTER_ADDR") && set("PET_NODE_RANK") && completion_index.is_some() {
        trainjob(&get("PET_MASTER_ADDR").unwrap_or_default())
    } else if set("VC_TASK_INDEX") {
        volcano(env, host)
    } else if set("PET_RDZV_ENDPOINT") {
        elastic(&get("PET_RDZV_ENDPOINT").unwrap_or_default(), host)
    } else if set("MASTER_ADDR") && set("RANK") && set("WORLD_SIZE") {
        pytorchjob(env)
    } else if let Some(index) = completion_index {
        indexed(env, host, fqdn, index)?
    } else {
        return None;
    };
    for k in ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"] {
        if let Some(v) = get(k).filter(|v| !v.is_empty()) {
            job.overwritten.insert(k, v);
        }
    }
    if !set("PET_NPROC_PER_NODE") {
        if let Some(n) = get("PET_N_PROC_PER_NODE").filter(|v| !v.is_empty()) {
            job.warnings.push(format!(
                "PET_N_PROC_PER_NODE={n} (a training-operator revision's spelling; torchrun \
                 ignores it) is read as --nproc-per-node {n}"
            ));
            job.nproc_per_node = Some((n, "PET_N_PROC_PER_NODE"));
        }
    }
    Some(job)
}

/// `<job>-node-0-0.<job>` → `<job>`.
fn trainjob(master: &str) -> K8sJob {
    let mut j = K8sJob::new(Operator::TrainJob);
    if let Some((_, sub)) = master.split_once('.') {
        let name = sub.split('.').next().unwrap_or(sub);
        j.job = Some((name.to_string(), "PET_MASTER_ADDR"));
    }
    j
}

/// A v1 PyTorchJob without `elasticPolicy` (or Volcano's pytorch plugin): the static
/// rendezvous from the pod-level variables.
fn pytorchjob(env: &BTreeMap<String, String>) -> K8sJob {
    let mut j = K8sJob::new(Operator::PyTorchJob);
    static_from_pod_env(&mut j, env);
    j
}

fn static_from_pod_env(j: &mut K8sJob, env: &BTreeMap<String, String>) {
    let num = |k: &str| env.get(k).and_then(|v| v.trim().parse::<u32>().ok());
    // A value the operator would never set (a hand-written manifest, a wrapper's typo) is
    // refused by name: ignoring it let a pod train alone, or on another port, and succeed.
    let mut refuse = |var: &'static str, why: String| {
        if j.invalid.is_none() {
            let value = env
                .get(var)
                .map(|v| v.trim().to_string())
                .unwrap_or_default();
            j.invalid = Some((var, value, why));
        }
    };
    let rank = num("RANK");
    if rank.is_none() && env.contains_key("RANK") {
        refuse(
            "RANK",
            "the pod's node rank: a whole number below WORLD_SIZE".into(),
        );
    }
    let world = num("WORLD_SIZE").filter(|n| *n > 0);
    if world.is_none() && env.contains_key("WORLD_SIZE") {
        refuse(
            "WORLD_SIZE",
            "the number of pods: a whole number of at least 1".into(),
        );
    }
    let port = env
        .get("MASTER_PORT")
        .and_then(|p| p.trim().parse::<u16>().ok())
        .filter(|p| *p > 0);
    if port.is_none() && env.contains_key("MASTER_PORT") {
        refuse("MASTER_PORT", "a TCP port, 1 to 65535".into());
    }
    if let (Some(r), Some(n)) = (rank, world.filter(|_| !env.contains_key("PET_NNODES"))) {
        if r >= n {
            refuse("RANK", format!("must be below WORLD_SIZE {n}"));
        }
    }
    if let Some(r) = rank {
        j.node_rank = Some((r, "RANK"));
    }
    // Older revisions set no PET_NNODES; their WORLD_SIZE counts pods (one process each).
    if !env.contains_key("PET_NNODES") {
        if let Some(n) = world {
            j.nnodes = Some((n.to_string(), "WORLD_SIZE"));
        }
    }
    if let Some(addr) = env.get("MASTER_ADDR") {
        // `<job>-master-0` (training-operator genGeneralName; Volcano MakePodName + subdomain).
        let first = addr.trim().split('.').next().unwrap_or_default();
        if let Some(name) = first.strip_suffix("-master-0") {
            j.job = Some((name.to_string(), "MASTER_ADDR"));
        }
    }
    if let (Some(addr), Some(port)) = (env.get("MASTER_ADDR"), port) {
        j.master = Some((addr.trim().to_string(), port, "MASTER_ADDR, MASTER_PORT"));
    }
}

/// `PET_RDZV_ENDPOINT=<job>-worker-0:<port>`: run id `<job>`, pod `<job>-worker-0` hosts. Any
/// other endpoint (an address, a Service name) designates no pod: whoever can bind it hosts,
/// as with the same value given as a flag.
fn elastic(endpoint: &str, host: &str) -> K8sJob {
    let mut j = K8sJob::new(Operator::PyTorchJobElastic);
    let ep_host = endpoint
        .rsplit_once(':')
        .map_or(endpoint, |(h, _)| h)
        .split('.')
        .next()
        .unwrap_or_default();
    if let Some(name) = ep_host.strip_suffix("-worker-0") {
        j.job = Some((name.to_string(), "PET_RDZV_ENDPOINT"));
        j.hosts_rendezvous = Some((ep_host.to_string(), host == ep_host));
    }
    j
}

/// Volcano: the pytorch plugin's variables when present, else the task's host list.
fn volcano(env: &BTreeMap<String, String>, host: &str) -> K8sJob {
    let mut j = K8sJob::new(Operator::Volcano);
    let index = env
        .get("VC_TASK_INDEX")
        .and_then(|v| v.trim().parse::<u32>().ok());
    if env.contains_key("MASTER_ADDR") && env.contains_key("RANK") {
        static_from_pod_env(&mut j, env);
    } else {
        // The task whose host list holds this pod: `<job>-<task>-<i>.<job>` (svc.go).
        let mine = env.iter().find(|(k, v)| {
            k.starts_with("VC_")
                && k.ends_with("_HOSTS")
                && v.split(',')
                    .any(|h| h.trim().split('.').next() == Some(host))
        });
        if let Some((_, hosts)) = mine {
            let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
            j.nnodes = Some((hosts.len().to_string(), "VC_<TASK>_HOSTS"));
            j.endpoint = Some((format!("{}:{RDZV_PORT}", hosts[0]), "VC_<TASK>_HOSTS"));
            if let Some(i) = index {
                j.node_rank = Some((i, "VC_TASK_INDEX"));
            }
            let first = hosts[0].split('.').next().unwrap_or_default();
            j.hosts_rendezvous = Some((first.to_string(), first == host));
            if let Some((_, sub)) = hosts[0].split_once('.') {
                j.job = Some((sub.to_string(), "VC_<TASK>_HOSTS"));
            }
        } else {
            j.warnings.push(format!(
                "Volcano job without a VC_<TASK>_HOSTS list naming this pod ({host}): enable the \
                 svc plugin or give --rdzv-endpoint"
            ));
        }
    }
    j
}

/// JobSet (`<jobset>-<rjob>-<jobIdx>-<podIdx>`) or a plain Indexed Job (`<job>-<index>`).
fn indexed(
    env: &BTreeMap<String, String>,
    host: &str,
    fqdn: Option<&str>,
    index: u32,
) -> Option<K8sJob> {
    let subdomain = fqdn
        .and_then(|f| f.strip_prefix(host))
        .and_then(|rest| rest.strip_prefix('.'))
        .and_then(|rest| rest.split('.').next())
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let (base, last) = split_index(host)?;
    if last != index {
        return None;
    }
    let jobset_name = env.get("JOBSET_NAME").map(|s| s.trim().to_string());
    if let Some((prefix, job_idx)) = split_index(base) {
        // JobSet: the hostname starts with the JobSet name, which is also the default
        // subdomain (GetSubdomain).
        let name = jobset_name.clone().or_else(|| subdomain.clone());
        if name
            .as_deref()
            .is_some_and(|n| prefix.starts_with(&format!("{n}-")))
        {
            let mut j = K8sJob::new(Operator::JobSet);
            let sub = subdomain.or(jobset_name)?;
            j.endpoint = Some((
                format!("{prefix}-0-0.{sub}:{RDZV_PORT}"),
                "hostname, JOB_COMPLETION_INDEX",
            ));
            j.hosts_rendezvous = Some((format!("{prefix}-0-0"), job_idx == 0 && index == 0));
            j.job = Some((prefix.to_string(), "hostname"));
            return Some(j);
        }
    }
    let mut j = K8sJob::new(Operator::IndexedJob);
    j.job = Some((base.to_string(), "hostname"));
    j.hosts_rendezvous = Some((format!("{base}-0"), index == 0));
    match subdomain {
        Some(sub) => {
            j.endpoint = Some((
                format!("{base}-0.{sub}:{RDZV_PORT}"),
                "hostname, JOB_COMPLETION_INDEX",
            ));
        }
        None => j.warnings.push(format!(
            "Indexed Job pod {host} has no subdomain: set spec.template.spec.subdomain to a \
             headless Service so the pods can reach index 0, or give --rdzv-endpoint"
        )),
    }
    Some(j)
}

/// `name-12` → (`name`, 12).
fn split_index(s: &str) -> Option<(&str, u32)> {
    let (base, n) = s.rsplit_once('-')?;
    if base.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base, n.parse().ok()?))
}

/// This pod's FQDN from `/etc/hosts` (the kubelet writes `IP <fqdn> <hostname>` for a pod with
/// a subdomain): the first name on a line naming `hostname` that starts with `hostname.`.
pub fn fqdn_from_hosts(hosts: &str, hostname: &str) -> Option<String> {
    let prefix = format!("{hostname}.");
    hosts
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .filter(|l| {
            l.split_whitespace()
                .skip(1)
                .any(|n| n == hostname || n.starts_with(&prefix))
        })
        .flat_map(|l| l.split_whitespace().skip(1))
        .find(|n| n.starts_with(&prefix))
        .map(str::to_string)
}
