//! Doctor's pure parts: sources of a TrainJob pod's settings, traps from synthetic probes.

use clap::Parser;

use super::*;
use crate::rdzv::foreign::Answer;

fn trainjob_host(extra: &[(&str, &str)]) -> Host {
    let mut env: BTreeMap<String, String> = [
        ("PATH", "/usr/bin:/bin"),
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("PET_MASTER_ADDR", "llm-node-0-0.llm"),
        ("PET_NODE_RANK", "1"),
        ("JOB_COMPLETION_INDEX", "1"),
        ("RANK", "1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Host {
        hostname: "llm-node-0-1".into(),
        pid: 9,
        cpu_count: 4,
        env,
        random_run_id: "rnd".into(),
        ..Host::default()
    }
}

fn origins(env: &[(&str, &str)], flags: &[&str]) -> BTreeMap<String, Origin> {
    let mut o: BTreeMap<String, Origin> = Args::command()
        .get_arguments()
        .map(|a| (a.get_id().to_string(), Origin::Default))
        .collect();
    for (id, var) in env {
        o.insert(id.to_string(), Origin::Env(var.to_string()));
    }
    for id in flags {
        o.insert(id.to_string(), Origin::Flag);
    }
    o
}

#[test]
fn each_setting_names_its_source() {
    let host = trainjob_host(&[]);
    // As clap parses PET_NNODES=2, PET_NODE_RANK=1, PET_MASTER_*; --max-restarts given.
    let raw = Args::try_parse_from([
        "drun",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=llm-node-0-0.llm",
        "--master-port=29400",
        "--max-restarts=3",
        "t.py",
    ])
    .unwrap();
    let o = origins(
        &[
            ("nnodes", "PET_NNODES"),
            ("node_rank", "PET_NODE_RANK"),
            ("master_addr", "PET_MASTER_ADDR"),
            ("master_port", "PET_MASTER_PORT"),
        ],
        &["max_restarts"],
    );
    let cfg = validate(&raw, &host).unwrap();
    let rows = rows(&raw, &o, &cfg, &host);
    let get = |name: &str| {
        let r = rows.iter().find(|r| r.setting == name).unwrap();
        (r.value.as_str(), r.source.as_str())
    };
    assert_eq!(get("nnodes"), ("2:2", "env PET_NNODES (Kubeflow TrainJob)"));
    assert_eq!(
        get("node-rank"),
        ("1", "env PET_NODE_RANK (Kubeflow TrainJob)")
    );
    assert_eq!(get("run-id"), ("llm", "Kubeflow TrainJob"));
    assert_eq!(get("max-restarts"), ("3", "flag"));
    assert_eq!(get("nproc-per-node"), ("1", "default"));
    assert_eq!(
        get("shutdown-timeout").1,
        "default in Kubernetes (25 s, inside the 30 s terminationGracePeriodSeconds)"
    );
    assert_eq!(get("shutdown-timeout").0, "25 s");
    let text = render(&cfg, &rows, &[]);
    assert!(
        text.starts_with("drun doctor: kubernetes: Kubeflow TrainJob"),
        "{text}"
    );
    assert!(text.ends_with("no known trap found\n"), "{text}");
}

#[test]
fn traps_are_named_from_the_probes() {
    let host = trainjob_host(&[]);
    let raw = Args::try_parse_from([
        "drun",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=llm-node-0-0.llm",
        "--shutdown-timeout=30",
        "t.py",
    ])
    .unwrap();
    let cfg = validate(&raw, &host).unwrap();
    let probes = Probes {
        unresolved: vec![("master", "llm-node-0-0.llm:29500".into(), "not yet".into())],
        taken: vec![("--metrics-port", 9100, "Address in use".into())],
        pid1: false,
        pid1_comm: Some("sh".into()),
        listeners: vec![],
        not_drun: vec![],
        gpus: Some(crate::gpu_health::Verdict::Unhealthy(vec![
            crate::gpu_health::Finding {
                gpu: "GPU 1 (0000:3b:00.0)".into(),
                reason: "2 uncorrectable ECC error(s) since the driver loaded".into(),
            },
        ])),
    };
    let w = traps(&cfg, &raw, &host, &probes).join("\n");
    for needle in [
        "RANK=1 in the environment",
        "will be overwritten",
        "the master name llm-node-0-0.llm:29500 does not resolve now (not yet)",
        "port 9100 (--metrics-port) is already taken",
        "--shutdown-timeout 30 s leaves drun less than 5 s",
        "PID 1 of this container is `sh`",
        "GPU health: GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s) since the driver loaded: this node's agent would end with exit 6",
    ] {
        assert!(w.contains(needle), "{needle} in:\n{w}");
    }
    assert!(
        !w.contains("--node-rank"),
        "static: the node rank is no trap"
    );
    // An elastic launch pinning a node rank.
    let raw = Args::try_parse_from([
        "drun",
        "--nnodes=1:2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=llm-node-0-0.llm:29400",
        "--rdzv-id=llm",
        "t.py",
    ])
    .unwrap();
    let cfg = validate(&raw, &host).unwrap();
    let w = traps(&cfg, &raw, &host, &Probes::default()).join("\n");
    assert!(w.contains("--node-rank 1 with a dynamic rendezvous"), "{w}");
    assert!(!w.contains("PID 1"), "{w}");
}

#[test]
fn a_rendezvous_endpoint_held_by_another_program_or_speaking_tls_is_a_trap() {
    let host = trainjob_host(&[]);
    let argv = |extra: &[&str]| {
        let mut v = vec![
            "drun",
            "--nnodes=2",
            "--rdzv-backend=drun",
            "--rdzv-endpoint=rdzv.svc:29400",
            "--rdzv-id=llm",
        ];
        v.extend_from_slice(extra);
        v.push("t.py");
        Args::try_parse_from(v).unwrap()
    };
    let raw = argv(&[]);
    let cfg = validate(&raw, &host).unwrap();
    let with = |answer: Answer| Probes {
        listeners: vec![("rdzv.svc:29400".into(), answer)],
        ..Probes::default()
    };
    let w = traps(
        &cfg,
        &raw,
        &host,
        &with(Answer::Other("HTTP/1.1 400".into())),
    )
    .join("\n");
    assert!(
        w.contains("what listens on rdzv.svc:29400 is not a drun rendezvous server")
            && w.contains("\"HTTP/1.1 400\""),
        "{w}"
    );
    let w = traps(&cfg, &raw, &host, &with(Answer::Tls)).join("\n");
    assert!(
        w.contains(
            "the rendezvous rdzv.svc:29400: the server speaks TLS: give the agent --rdzv-tls-ca"
        ),
        "{w}"
    );
    let w = traps(&cfg, &raw, &host, &with(Answer::Silent)).join("\n");
    assert!(w.contains("does not answer the gRPC handshake"), "{w}");
    // A drun server (HTTP/2) is no trap.
    let w = traps(&cfg, &raw, &host, &with(Answer::Http2)).join("\n");
    assert!(!w.contains("rdzv.svc:29400"), "{w}");
    // etcd answers HTTP/2 too, but not drun.v1: the backend flag forgotten.
    let etcd = Probes {
        not_drun: vec![(
            "rdzv.svc:29400".into(),
            "unknown service drun.v1.Rendezvous".into(),
        )],
        ..with(Answer::Http2)
    };
    let w = traps(&cfg, &raw, &host, &etcd).join("\n");
    assert!(
        w.contains("the rendezvous rdzv.svc:29400 answered, but not as a drun-rendezvous server (unknown service drun.v1.Rendezvous); for an etcd endpoint use --rdzv-backend etcd"),
        "{w}"
    );
}

#[test]
fn what_slurm_filled_is_named_slurm_and_its_pin_is_no_trap() {
    let mut host = trainjob_host(&[]);
    host.env.retain(|k, _| k == "PATH");
    for (k, v) in [
        ("SLURM_JOB_ID", "6"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_NODEID", "1"),
        ("SLURMD_NODENAME", "n2"),
        ("SLURM_JOB_NODELIST", "n[1-2]"),
    ] {
        host.env.insert(k.into(), v.into());
    }
    let raw = Args::try_parse_from(["drun", "t.py"]).unwrap();
    let cfg = validate(&raw, &host).unwrap();
    let rows = rows(&raw, &origins(&[], &[]), &cfg, &host);
    let get = |name: &str| {
        let r = rows.iter().find(|r| r.setting == name).unwrap();
        (r.value.clone(), r.source.clone())
    };
    assert_eq!(get("nnodes"), ("1:2".into(), "Slurm".into()));
    assert_eq!(get("node-rank"), ("1".into(), "Slurm".into()));
    assert_eq!(get("run-id"), ("6".into(), "Slurm".into()));
    assert_eq!(
        get("rendezvous"),
        (
            "embedded (c10d) on n1:20006, hosted by another agent".into(),
            "Slurm".into()
        )
    );
    assert_eq!(get("nproc-per-node"), ("1".into(), "default".into()));
    let w = traps(&cfg, &raw, &host, &Probes::default());
    assert!(w.is_empty(), "{w:?}");
}
