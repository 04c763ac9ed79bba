//! The known traps of a launch in a pod or an allocation: a pure function of the resolved
//! launch, the host and what the probes found ([`Probes`]).

use std::time::Duration;

use crate::config::Host;
use crate::container::{K8S_GRACE_PERIOD, K8S_SHUTDOWN_TIMEOUT};
use crate::rdzv::foreign::{probe, verdict, Answer};
use crate::{LaunchConfig, RendezvousMode};

/// What doctor read from the machine beyond [`Host`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probes {
    /// Names that do not resolve now: (what, endpoint, why).
    pub unresolved: Vec<(&'static str, String, String)>,
    /// Ports this node would listen on that another process holds: (what, port, error).
    pub taken: Vec<(&'static str, u16, String)>,
    /// Whether doctor is PID 1.
    pub pid1: bool,
    /// The command of PID 1 when doctor is not it (`sh`, `bash`, `tini`, ...).
    pub pid1_comm: Option<String>,
    /// What answered on each rendezvous endpoint this node dials (`--rdzv-backend drun`, or
    /// c10d where another node hosts): (endpoint, answer); nothing listening is left out.
    pub listeners: Vec<(String, Answer)>,
    /// Endpoints that answered HTTP/2 but not drun.v1 (etcd, another gRPC service): (endpoint,
    /// what the server said).
    pub not_drun: Vec<(String, String)>,
    /// The GPU health check's verdict (`--gpu-health` on and an NVIDIA GPU on this node).
    pub gpus: Option<crate::gpu_health::Verdict>,
}

impl Probes {
    /// Resolves the rendezvous/master names once (no wait) and test-binds the ports this node
    /// would listen on: the c10d host's port when it may host, the static master port on node
    /// rank 0, `--metrics-port`.
    pub async fn gather(cfg: &LaunchConfig) -> Probes {
        let mut p = Probes {
            pid1: crate::container::is_pid1(),
            pid1_comm: std::fs::read_to_string("/proc/1/comm")
                .ok()
                .map(|s| s.trim().to_string()),
            ..Probes::default()
        };
        let mut names: Vec<(&'static str, String)> = Vec::new();
        let mut ports: Vec<(&'static str, u16)> = Vec::new();
        // Rendezvous servers this node dials: is it a drun server that listens there?
        let mut dialed: Vec<String> = Vec::new();
        match &cfg.rdzv.mode {
            RendezvousMode::Static {
                node_rank,
                master_addr,
                master_port,
            } => {
                names.push(("master", format!("{master_addr}:{master_port}")));
                if *node_rank == 0 {
                    ports.push((
                        "the master port (node rank 0 serves the workers' store)",
                        *master_port,
                    ));
                }
            }
            RendezvousMode::C10d { endpoint, is_host } => {
                names.push(("rendezvous", endpoint.clone()));
                if *is_host == Some(true) {
                    if let Ok((_, port)) = crate::dns::split(endpoint) {
                        ports.push(("the rendezvous port this node hosts", port));
                    }
                } else {
                    dialed.push(endpoint.clone());
                }
            }
            RendezvousMode::Server { endpoints } => {
                names.extend(endpoints.iter().map(|e| ("rendezvous", e.clone())));
                dialed.extend(endpoints.iter().cloned());
            }
            RendezvousMode::Etcd { endpoints } => {
                names.extend(endpoints.iter().map(|e| ("rendezvous", e.clone())));
            }
            RendezvousMode::Embedded {
                fixed_port: Some(port),
                ..
            } => ports.push(("--master-port", *port)),
            RendezvousMode::Embedded { .. } => {}
        }
        if let Some(port) = cfg.observe.metrics_port.filter(|p| *p != 0) {
            ports.push(("--metrics-port", port));
        }
        for (what, ep) in names {
            if let Err(why) = crate::dns::resolve(&ep).await {
                p.unresolved.push((what, ep, why.to_string()));
            }
        }
        for ep in dialed {
            let Ok(addr) = crate::dns::resolve(&ep).await else {
                continue; // named above as unresolved
            };
            if let Some(answer) = probe(&addr.to_string()).await {
                if answer == Answer::Http2 && cfg.security.rdzv_tls.is_none() {
                    if let Some(said) = not_drun(&addr.to_string()).await {
                        p.not_drun.push((ep.clone(), said));
                    }
                }
                p.listeners.push((ep, answer));
            }
        }
        for (what, port) in ports {
            if let Err(e) = std::net::TcpListener::bind(("0.0.0.0", port)) {
                p.taken.push((what, port, e.to_string()));
            }
        }
        if cfg.observe.gpu_health.is_some() && crate::gpu_health::probe::has_nvidia() {
            let probe = tokio::task::spawn_blocking(crate::gpu_health::probe::probe)
                .await
                .unwrap_or_default();
            let one_per_rank = cfg.workers.numa.is_some() || cfg.workers.virtual_local_rank;
            p.gpus = Some(crate::gpu_health::judge::judge(
                &probe,
                std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
                one_per_rank.then_some(cfg.workers.nproc_per_node as usize),
                &crate::gpu_health::Rules::default(),
            ));
        }
        p
    }
}

/// What a plaintext HTTP/2 server at `addr` says to a drun.v1 status call when it does not serve
/// drun.v1 (`Unimplemented`: etcd, another gRPC service); `None` for a drun server or no answer
/// within 2 s.
async fn not_drun(addr: &str) -> Option<String> {
    use drun_proto::v1::rendezvous_client::RendezvousClient;
    let call = async {
        let mut client = RendezvousClient::connect(format!("http://{addr}"))
            .await
            .ok()?;
        let request = drun_proto::v1::StatusRequest {
            run_id: "drun-doctor".into(),
        };
        match client.status(request).await {
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                Some(s.message().trim().to_string())
            }
            _ => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .ok()
        .flatten()
}

/// One warning per trap found. `raw`: the command line as parsed (flags and `PET_*`), before
/// Slurm or Kubernetes detection filled it.
pub fn traps(cfg: &LaunchConfig, raw: &crate::Args, host: &Host, probes: &Probes) -> Vec<String> {
    let mut w: Vec<String> = Vec::new();
    if let Some(k) = &cfg.scheduler.k8s {
        w.extend(k.warnings.iter().cloned());
    }
    let pod_level: Vec<String> = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ]
    .iter()
    .filter_map(|k| host.var(k).map(|v| format!("{k}={v}")))
    .collect();
    if !pod_level.is_empty() {
        w.push(format!(
            "{} in the environment (set for the pod by the operator or the shell) will be overwritten: \
             drun gives each worker its own RANK, LOCAL_RANK, WORLD_SIZE ({} workers in all at full size) \
             and the group's MASTER_ADDR/MASTER_PORT",
            pod_level.join(", "),
            cfg.rdzv.max_nodes * cfg.workers.nproc_per_node
        ));
    }
    // Slurm's SLURM_NODEID pin is deliberate; a --node-rank or PET_NODE_RANK given to an
    // elastic launch usually is not.
    if let Some(r) = cfg
        .rdzv
        .requested_node_rank
        .filter(|_| raw.node_rank.is_some())
    {
        w.push(format!(
            "--node-rank {r} with a dynamic rendezvous ({}) only orders the nodes; ranks are \
             assigned at each formation and change when nodes leave or join. An operator's \
             PET_NODE_RANK is meant for the static backend",
            cfg.rdzv.mode
        ));
    }
    for (what, ep, why) in &probes.unresolved {
        w.push(format!(
            "the {what} name {ep} does not resolve now ({why}); drun will wait for it up to the \
             join timeout ({}), which is normal while the other pods start",
            drun_rendezvous::human::duration(cfg.rdzv.timing.join_timeout)
        ));
    }
    for (what, port, e) in &probes.taken {
        w.push(format!(
            "port {port} ({what}) is already taken on this machine ({e}): pick a free port"
        ));
    }
    for (ep, said) in &probes.not_drun {
        w.push(format!(
            "the rendezvous {ep} answered, but not as a drun-rendezvous server ({said}); for an \
             etcd endpoint use --rdzv-backend etcd"
        ));
    }
    for (ep, answer) in &probes.listeners {
        match verdict(answer, ep) {
            Err(line) => w.push(line.to_string()),
            Ok(Some(_)) if *answer == Answer::Tls && cfg.security.rdzv_tls_files.is_some() => {}
            Ok(Some(reason)) => w.push(format!("the rendezvous {ep}: {reason}")),
            Ok(None) => {}
        }
    }
    let in_k8s = crate::container::in_kubernetes(|k| host.var(k).map(str::to_string));
    if in_k8s
        && cfg.supervision.shutdown_timeout + K8S_GRACE_PERIOD - K8S_SHUTDOWN_TIMEOUT
            > K8S_GRACE_PERIOD
    {
        w.push(format!(
            "--shutdown-timeout {} leaves drun less than 5 s of the default \
             terminationGracePeriodSeconds (30 s): the kubelet would SIGKILL drun before the \
             workers are stopped; set terminationGracePeriodSeconds to at least {} s",
            drun_rendezvous::human::duration(cfg.supervision.shutdown_timeout),
            (cfg.supervision.shutdown_timeout + Duration::from_secs(5)).as_secs()
        ));
    }
    // A shell as PID 1 (`command: ["sh", "-c", "drun ..."]`) gets the kubelet's SIGTERM and,
    // having no handler, the kernel drops it: drun never hears it, the workers die by SIGKILL.
    if !probes.pid1
        && matches!(
            probes.pid1_comm.as_deref(),
            Some("sh" | "bash" | "dash" | "ash")
        )
    {
        w.push(format!(
            "PID 1 of this container is `{}`: a shell does not forward SIGTERM to drun, so the \
             workers are SIGKILLed without a grace period; use `exec drun ...` or make drun the \
             container command (as PID 1 drun handles signals and reaps orphans itself)",
            probes.pid1_comm.as_deref().unwrap_or_default()
        ));
    }
    match &probes.gpus {
        Some(crate::gpu_health::Verdict::Unhealthy(f)) => {
            let then = if cfg.rdzv.min_nodes == cfg.rdzv.max_nodes {
                "this node's agent would end with exit 6 before starting a worker"
            } else {
                "this node would stand by until they pass"
            };
            for finding in f {
                w.push(format!("GPU health: {finding}: {then}"));
            }
        }
        Some(crate::gpu_health::Verdict::Unknown(why)) => {
            w.push(format!("GPU health cannot be checked: {why}"));
        }
        _ => {}
    }
    w
}
