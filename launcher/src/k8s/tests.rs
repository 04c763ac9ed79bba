//! Table-driven: the exact environments each operator injects (cited in the module docs), the
//! settings drun resolves from them.

use std::collections::BTreeMap;

use clap::Parser;

use super::*;
use crate::config::{validate, Host};
use crate::{Args, RendezvousMode};

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut e: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    e.insert("PATH".into(), "/usr/bin:/bin".into());
    e
}

/// One operator's pod: its environment, hostname, FQDN; what `validate` must resolve.
struct Case {
    name: &'static str,
    env: &'static [(&'static str, &'static str)],
    hostname: &'static str,
    fqdn: Option<&'static str>,
    argv: &'static [&'static str],
    operator: Operator,
    /// (min, max) nodes.
    nnodes: (u32, u32),
    /// The rendezvous as printed at start.
    rendezvous: &'static str,
    run_id: &'static str,
    /// Node rank of a static launch.
    node_rank: Option<u32>,
}

const CASES: &[Case] = &[
    Case {
        // training-operator envvar.go (v1.7+), Worker replica index 1 of Master 1 + Worker 2,
        // nprocPerNode 4, no elasticPolicy.
        name: "pytorchjob v1.7 worker",
        env: &[
            ("PYTHONUNBUFFERED", "0"),
            ("MASTER_PORT", "23456"),
            ("MASTER_ADDR", "mnist-master-0"),
            ("WORLD_SIZE", "12"),
            ("RANK", "2"),
            ("PET_NPROC_PER_NODE", "4"),
            ("PET_NODE_RANK", "2"),
            ("PET_NNODES", "3"),
        ],
        hostname: "mnist-worker-1",
        fqdn: None,
        argv: &["drun", "t.py"],
        operator: Operator::PyTorchJob,
        nnodes: (3, 3),
        rendezvous: "static (master mnist-master-0:23456)",
        run_id: "mnist",
        node_rank: Some(2),
    },
    Case {
        // training-operator envvar.go before v1.7: no PET_*, WORLD_SIZE counts pods.
        name: "pytorchjob old revision master",
        env: &[
            ("PYTHONUNBUFFERED", "0"),
            ("MASTER_PORT", "23456"),
            ("MASTER_ADDR", "mnist-master-0"),
            ("WORLD_SIZE", "2"),
            ("RANK", "0"),
        ],
        hostname: "mnist-master-0",
        fqdn: None,
        argv: &["drun", "--nproc-per-node", "2", "t.py"],
        operator: Operator::PyTorchJob,
        nnodes: (2, 2),
        rendezvous: "static (master mnist-master-0:23456)",
        run_id: "mnist",
        node_rank: Some(0),
    },
    Case {
        // elastic.go: elasticPolicy {minReplicas 1, maxReplicas 3, maxRestarts 5,
        // rdzvBackend c10d}, worker port 23456, pod worker-1.
        name: "pytorchjob elastic worker 1",
        env: &[
            ("PYTHONUNBUFFERED", "0"),
            ("PET_RDZV_ENDPOINT", "elastic-worker-0:23456"),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_NNODES", "1:3"),
            ("PET_MAX_RESTARTS", "5"),
        ],
        hostname: "elastic-worker-1",
        fqdn: None,
        argv: &["drun", "t.py"],
        operator: Operator::PyTorchJobElastic,
        nnodes: (1, 3),
        rendezvous: "embedded (c10d) on elastic-worker-0:23456, hosted by another agent",
        run_id: "elastic",
        node_rank: None,
    },
    Case {
        // The same job's worker 0, with rdzvId and rdzvConf given.
        name: "pytorchjob elastic worker 0 with id",
        env: &[
            ("PET_RDZV_ENDPOINT", "elastic-worker-0:23456"),
            ("PET_RDZV_BACKEND", "c10d"),
            ("PET_NNODES", "1:3"),
            ("PET_RDZV_ID", "job-7"),
            ("PET_RDZV_CONF", "join_timeout=900"),
        ],
        hostname: "elastic-worker-0",
        fqdn: None,
        argv: &["drun", "t.py"],
        operator: Operator::PyTorchJobElastic,
        nnodes: (1, 3),
        rendezvous: "embedded (c10d) on elastic-worker-0:23456, hosted by this agent",
        run_id: "job-7",
        node_rank: None,
    },
    Case {
        // trainer torch.go: numNodes 2, numProcPerNode auto, pod index 1 of TrainJob "llm".
        name: "trainjob node 1",
        env: &[
            ("PET_NNODES", "2"),
            ("PET_NPROC_PER_NODE", "auto"),
            ("PET_NODE_RANK", "1"),
            ("PET_MASTER_ADDR", "llm-node-0-0.llm"),
            ("PET_MASTER_PORT", "29400"),
            ("JOB_COMPLETION_INDEX", "1"),
        ],
        hostname: "llm-node-0-1",
        fqdn: Some("llm-node-0-1.llm.default.svc.cluster.local"),
        argv: &["drun", "t.py"],
        operator: Operator::TrainJob,
        nnodes: (2, 2),
        rendezvous: "static (master llm-node-0-0.llm:29400)",
        run_id: "llm",
        node_rank: Some(1),
    },
    Case {
        // jobset_controller.go: JobSet "pt", replicatedJob "workers" (1 job, parallelism 4),
        // default subdomain = the JobSet name; pod index 2.
        name: "jobset pod 2",
        env: &[("JOB_COMPLETION_INDEX", "2")],
        hostname: "pt-workers-0-2",
        fqdn: Some("pt-workers-0-2.pt.default.svc.cluster.local"),
        argv: &["drun", "--nnodes", "4", "t.py"],
        operator: Operator::JobSet,
        nnodes: (4, 4),
        rendezvous: "embedded (c10d) on pt-workers-0-0.pt:29400, hosted by another agent",
        run_id: "pt-workers",
        node_rank: None,
    },
    Case {
        // JobSet with spec.network.subdomain "net" and JOBSET_NAME from the downward API.
        name: "jobset custom subdomain, index 0",
        env: &[("JOB_COMPLETION_INDEX", "0"), ("JOBSET_NAME", "pt")],
        hostname: "pt-trainer-0-0",
        fqdn: Some("pt-trainer-0-0.net.ns.svc.cluster.local"),
        argv: &["drun", "--nnodes", "2", "t.py"],
        operator: Operator::JobSet,
        nnodes: (2, 2),
        rendezvous: "embedded (c10d) on pt-trainer-0-0.net:29400, hosted by this agent",
        run_id: "pt-trainer",
        node_rank: None,
    },
    Case {
        // An Indexed Job "train" with subdomain "train-svc" (a headless Service).
        name: "indexed job",
        env: &[("JOB_COMPLETION_INDEX", "3")],
        hostname: "train-3",
        fqdn: Some("train-3.train-svc.default.svc.cluster.local"),
        argv: &["drun", "--nnodes", "4", "t.py"],
        operator: Operator::IndexedJob,
        nnodes: (4, 4),
        rendezvous: "embedded (c10d) on train-0.train-svc:29400, hosted by another agent",
        run_id: "train",
        node_rank: None,
    },
    Case {
        // volcano env.go + svc.go: Job "vj", task "worker" of 3 replicas; pod index 1.
        name: "volcano svc plugin",
        env: &[
            ("VK_TASK_INDEX", "1"),
            ("VC_TASK_INDEX", "1"),
            (
                "VC_WORKER_HOSTS",
                "vj-worker-0.vj,vj-worker-1.vj,vj-worker-2.vj",
            ),
            ("VC_WORKER_NUM", "3"),
        ],
        hostname: "vj-worker-1",
        fqdn: Some("vj-worker-1.vj.default.svc.cluster.local"),
        argv: &["drun", "t.py"],
        operator: Operator::Volcano,
        nnodes: (3, 3),
        rendezvous: "embedded (c10d) on vj-worker-0.vj:29400, hosted by another agent",
        run_id: "vj",
        node_rank: None,
    },
    Case {
        // volcano pytorch.go: task master (1) + worker (2); worker index 0 → RANK 1.
        name: "volcano pytorch plugin",
        env: &[
            ("VC_TASK_INDEX", "0"),
            ("VC_MASTER_HOSTS", "vp-master-0.vp"),
            ("VC_WORKER_HOSTS", "vp-worker-0.vp,vp-worker-1.vp"),
            ("MASTER_ADDR", "vp-master-0.vp"),
            ("MASTER_PORT", "23456"),
            ("WORLD_SIZE", "3"),
            ("RANK", "1"),
        ],
        hostname: "vp-worker-0",
        fqdn: None,
        argv: &["drun", "t.py"],
        operator: Operator::Volcano,
        nnodes: (3, 3),
        rendezvous: "static (master vp-master-0.vp:23456)",
        run_id: "vp",
        node_rank: Some(1),
    },
];

/// Parses `argv` as if the case's environment were the process's: clap reads `PET_*` only
/// from the real environment, so the `PET_*` of the case are given as flags here, exactly
/// as clap would take them.
const PET_FLAGS: [(&str, &str); 10] = [
    ("PET_NNODES", "--nnodes"),
    ("PET_NPROC_PER_NODE", "--nproc-per-node"),
    ("PET_NODE_RANK", "--node-rank"),
    ("PET_MASTER_ADDR", "--master-addr"),
    ("PET_MASTER_PORT", "--master-port"),
    ("PET_RDZV_ENDPOINT", "--rdzv-endpoint"),
    ("PET_RDZV_BACKEND", "--rdzv-backend"),
    ("PET_RDZV_ID", "--rdzv-id"),
    ("PET_RDZV_CONF", "--rdzv-conf"),
    ("PET_MAX_RESTARTS", "--max-restarts"),
];

fn args_with_pet(argv: &[&str], env: &BTreeMap<String, String>) -> Args {
    let mut v: Vec<String> = vec![argv[0].to_string()];
    for (k, flag) in PET_FLAGS {
        if let Some(val) = env.get(k) {
            v.push(format!("{flag}={val}"));
        }
    }
    v.extend(argv[1..].iter().map(|s| s.to_string()));
    Args::try_parse_from(v).unwrap()
}

#[test]
fn each_operator_environment_resolves_to_the_right_launch() {
    for c in CASES {
        let e = env(c.env);
        let job = detect(&e, c.hostname, c.fqdn).unwrap_or_else(|| panic!("{}", c.name));
        assert_eq!(job.operator, c.operator, "{}", c.name);
        let host = Host {
            hostname: c.hostname.into(),
            fqdn: c.fqdn.map(str::to_string),
            pid: 7,
            cpu_count: 4,
            env: e.clone(),
            random_run_id: "rnd".into(),
            ..Host::default()
        };
        let cfg = validate(&args_with_pet(c.argv, &e), &host)
            .unwrap_or_else(|err| panic!("{}: {err}", c.name));
        assert_eq!(
            (cfg.rdzv.min_nodes, cfg.rdzv.max_nodes),
            c.nnodes,
            "{}",
            c.name
        );
        assert_eq!(cfg.rdzv.mode.to_string(), c.rendezvous, "{}", c.name);
        assert_eq!(cfg.run_id, c.run_id, "{}", c.name);
        let rank = match cfg.rdzv.mode {
            RendezvousMode::Static { node_rank, .. } => Some(node_rank),
            _ => None,
        };
        assert_eq!(rank, c.node_rank, "{}", c.name);
        // `drun doctor` names the source of each: the PET_* variable or the operator.
        let mut origins: BTreeMap<String, crate::doctor::Origin> = BTreeMap::new();
        for (k, flag) in PET_FLAGS {
            if e.contains_key(k) {
                let id = flag.trim_start_matches("--").replace('-', "_");
                origins.insert(id, crate::doctor::Origin::Env(k.to_string()));
            }
        }
        for flag in c.argv.iter().filter(|a| a.starts_with("--")) {
            let id = flag.trim_start_matches("--").replace('-', "_");
            origins.insert(id, crate::doctor::Origin::Flag);
        }
        let raw = args_with_pet(c.argv, &e);
        let rows = crate::doctor::rows(&raw, &origins, &cfg, &host);
        let source = |name: &str| {
            rows.iter()
                .find(|r| r.setting == name)
                .map(|r| r.source.clone())
                .unwrap()
        };
        let op = c.operator.name();
        let nnodes = source("nnodes");
        assert!(
            nnodes == format!("env PET_NNODES ({op})") || nnodes == op || nnodes == "flag",
            "{}: nnodes from {nnodes}",
            c.name
        );
        if c.run_id != "none" {
            let run = source("run-id");
            assert!(
                run == op || run == format!("env PET_RDZV_ID ({op})"),
                "{}: run id from {run}",
                c.name
            );
        }
        let line = cfg.scheduler.k8s_line.clone().unwrap_or_default();
        assert!(
            line.starts_with(&format!("kubernetes: {}", c.operator.name())),
            "{}: {line}",
            c.name
        );
    }
}

#[test]
fn explicit_flags_win_over_what_the_operator_injected() {
    let e = env(&[("JOB_COMPLETION_INDEX", "2")]);
    let host = Host {
        hostname: "pt-workers-0-2".into(),
        fqdn: Some("pt-workers-0-2.pt.default.svc".into()),
        pid: 7,
        cpu_count: 4,
        env: e,
        ..Host::default()
    };
    let a = Args::try_parse_from([
        "drun",
        "--nnodes",
        "4",
        "--rdzv-endpoint",
        "rdzv.pt:29400",
        "--rdzv-id",
        "mine",
        "t.py",
    ])
    .unwrap();
    let cfg = validate(&a, &host).unwrap();
    assert_eq!(cfg.run_id, "mine");
    assert_eq!(cfg.rdzv.mode.to_string(), "drun servers rdzv.pt:29400");
    // The elastic PyTorchJob's hosting decision is about <job>-worker-0 only.
    let e = env(&[("PET_RDZV_ENDPOINT", "j-worker-0:23456")]);
    let job = detect(&e, "j-worker-0", None).unwrap();
    assert_eq!(job.hosts("j-worker-0:23456"), Some(true));
    assert_eq!(job.hosts("j-worker-0.j.ns.svc:1"), Some(true));
    assert_eq!(
        job.hosts("my-rdzv:29400"),
        None,
        "another endpoint: whoever binds it"
    );
    // A PET_RDZV_ENDPOINT that names no operator pod (an address) designates no host either:
    // comparing its first label ("127") with the hostname made every pod a client, and no one
    // served the rendezvous.
    for ep in ["127.0.0.1:29420", "rdzv-svc:29400", "10.0.0.5:29400"] {
        let e = env(&[("PET_RDZV_ENDPOINT", ep)]);
        let job = detect(&e, "trainer-a", None).unwrap();
        assert_eq!(job.hosts(ep), None, "{ep}");
    }
    let a = Args::try_parse_from(["drun", "--kubernetes", "off", "--nnodes", "4", "t.py"]).unwrap();
    let err = validate(&a, &host).unwrap_err().to_string();
    assert!(err.contains("--rdzv-endpoint"), "{err}");
}

#[test]
fn a_single_node_launch_takes_no_rendezvous_from_a_jobset() {
    let e = env(&[("JOB_COMPLETION_INDEX", "0")]);
    let job = detect(&e, "pt-w-0-0", Some("pt-w-0-0.pt.ns.svc")).unwrap();
    let mut a = Args::try_parse_from(["drun", "t.py"]).unwrap();
    let line = job.fill(&mut a);
    assert_eq!(a.rdzv_endpoint, None);
    assert_eq!(a.rdzv_id, "none");
    assert!(
        line.ends_with("every setting given on the command line or by PET_*"),
        "{line}"
    );
}

#[test]
fn traps_in_the_environment_are_named() {
    let empty = env(&[("PET_STANDALONE", ""), ("PET_MODULE", "1")]);
    let unset = unset_empty(|k| empty.get(k).cloned());
    assert_eq!(unset.len(), 1);
    assert_eq!(unset[0].0, "PET_STANDALONE");
    assert!(unset[0].1.contains("read as unset"));
    let e = env(&[
        ("PET_RDZV_ENDPOINT", "j-worker-0:23456"),
        ("PET_N_PROC_PER_NODE", "8"),
    ]);
    let job = detect(&e, "j-worker-0", None).unwrap();
    assert_eq!(
        job.nproc_per_node,
        Some(("8".into(), "PET_N_PROC_PER_NODE"))
    );
    assert!(job.warnings[0].contains("PET_N_PROC_PER_NODE=8"));
    let e = env(&[("JOB_COMPLETION_INDEX", "1")]);
    let job = detect(&e, "solo-1", None).unwrap();
    assert_eq!(job.operator, Operator::IndexedJob);
    assert!(job.warnings[0].contains("subdomain"), "{:?}", job.warnings);
    assert!(detect(&env(&[("HOME", "/root")]), "laptop", None).is_none());
    assert!(
        detect(&env(&[("JOB_COMPLETION_INDEX", "1")]), "web-7", None).is_none(),
        "a hostname whose index is not the completion index is no Indexed Job pod"
    );
}

#[test]
fn the_fqdn_comes_from_the_kubelets_hosts_file() {
    let hosts =
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n\
                 10.1.2.3\tpt-w-0-1.pt.default.svc.cluster.local\tpt-w-0-1\n";
    assert_eq!(
        fqdn_from_hosts(hosts, "pt-w-0-1").as_deref(),
        Some("pt-w-0-1.pt.default.svc.cluster.local")
    );
    assert_eq!(fqdn_from_hosts(hosts, "other"), None);
    assert_eq!(fqdn_from_hosts("10.0.0.1 plain\n", "plain"), None);
}

#[test]
fn a_pytorchjob_variable_the_operator_never_sets_is_refused_by_name() {
    let pod = |pairs: &[(&str, &str)]| Host {
        hostname: "pj-worker-1".into(),
        pid: 7,
        cpu_count: 4,
        env: env(pairs),
        ..Host::default()
    };
    let base = [
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29511"),
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
    ];
    for (var, value, says) in [
        ("WORLD_SIZE", "abc", "at least 1"),
        ("WORLD_SIZE", "0", "at least 1"),
        ("RANK", "abc", "below WORLD_SIZE"),
        ("RANK", "2", "must be below WORLD_SIZE 2"),
        ("MASTER_PORT", "abc", "1 to 65535"),
        ("MASTER_PORT", "99999", "1 to 65535"),
    ] {
        let mut pairs = base.to_vec();
        pairs.retain(|(k, _)| *k != var);
        pairs.push((var, value));
        let a = Args::try_parse_from(["drun", "--nproc-per-node", "1", "t.py"]).unwrap();
        let err = validate(&a, &pod(&pairs)).unwrap_err().to_string();
        assert!(
            err.contains(&format!("invalid {var} '{value}'")) && err.contains(says),
            "{var}={value}: {err}"
        );
    }
    // The well-formed pod still launches.
    let a = Args::try_parse_from(["drun", "--nproc-per-node", "1", "t.py"]).unwrap();
    let cfg = validate(&a, &pod(&base)).unwrap();
    assert_eq!((cfg.rdzv.min_nodes, cfg.rdzv.max_nodes), (2, 2));
}

#[test]
fn a_multi_node_indexed_job_without_a_subdomain_says_so_in_its_one_error_line() {
    let host = Host {
        hostname: "train-1".into(),
        pid: 7,
        cpu_count: 4,
        env: env(&[("JOB_COMPLETION_INDEX", "1")]),
        ..Host::default()
    };
    let a = Args::try_parse_from(["drun", "--nnodes", "2", "t.py"]).unwrap();
    let err = validate(&a, &host).unwrap_err().to_string();
    assert!(err.contains("--rdzv-endpoint"), "{err}");
    assert!(
        err.contains("Indexed Job pod train-1 has no subdomain"),
        "the detection's hint is in the line: {err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
