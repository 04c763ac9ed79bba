//! The Kubernetes examples in `examples/k8s/`: every YAML parses, has the expected kinds and the
//! fields drun relies on, and its failure policy matches drun's documented exit codes.
//!
//! Field names and allowed values are those of the operators' API types:
//! kubernetes-sigs/jobset `api/jobset/v1alpha2/jobset_types.go` (JobSet, dependsOn, network,
//! failurePolicy rules and their actions, the job failure reasons its webhook accepts),
//! kubeflow/training-operator `pkg/apis/kubeflow.org/v1/pytorch_types.go` (PyTorchJob,
//! elasticPolicy) and `common_types.go` (restartPolicy `ExitCode`: 1-127 permanent), and
//! Kubernetes batch/v1 `podFailurePolicy`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use drun_launcher::AgentExit;
use serde::Deserialize;
use serde_json::Value;

use crate::harness::root;

/// Every document of every `examples/k8s/*.yaml`, with its file name.
fn documents() -> Vec<(String, Value)> {
    let dir = root().join("examples/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {}", dir.display());
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for d in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: not valid YAML: {e}"));
            docs.push((name.clone(), v));
        }
    }
    docs
}

fn one_of_kind(kind: &str) -> (String, Value) {
    let mut found: Vec<_> = documents()
        .into_iter()
        .filter(|(_, d)| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} in examples/k8s");
    found.remove(0)
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} is a string"))
}

fn n(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} is a number"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The value of `--flag=VALUE` in a container command.
fn flag<'a>(command: &'a [String], name: &str) -> Option<&'a str> {
    command
        .iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
}

/// The fixed exit codes in the table of `docs/reference/exit-codes.md` (`128+N` is not a fixed
/// code).
fn documented_exit_codes() -> BTreeSet<u64> {
    let page = std::fs::read_to_string(root().join("docs/reference/exit-codes.md")).unwrap();
    let table = page
        .split("# Exit codes")
        .nth(1)
        .expect("docs/reference/exit-codes.md opens with its Exit codes title");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1)?.trim().parse().ok())
        .collect()
}

#[test]
fn every_example_is_valid_yaml_of_a_known_kind() {
    let docs = documents();
    let kinds: BTreeSet<&str> = docs.iter().map(|(_, d)| s(d, "/kind")).collect();
    assert_eq!(kinds, BTreeSet::from(["JobSet", "PyTorchJob"]));
    for (file, d) in &docs {
        let expected_api = match s(d, "/kind") {
            "JobSet" => "jobset.x-k8s.io/v1alpha2",
            _ => "kubeflow.org/v1",
        };
        assert_eq!(s(d, "/apiVersion"), expected_api, "{file}");
        assert!(!s(d, "/metadata/name").is_empty(), "{file}");
    }
}

#[test]
fn the_jobset_starts_an_etcd_backed_rendezvous_first_and_points_the_trainer_at_it() {
    let (_, js) = one_of_kind("JobSet");
    let name = s(&js, "/metadata/name");
    assert_eq!(
        js.pointer("/spec/network/enableDNSHostnames"),
        Some(&Value::Bool(true))
    );
    let subdomain = s(&js, "/spec/network/subdomain");
    let jobs = js["spec"]["replicatedJobs"].as_array().unwrap();
    let job = |n: &str| {
        jobs.iter()
            .find(|j| j["name"] == n)
            .unwrap_or_else(|| panic!("job {n}"))
    };
    let (rdzv, trainer) = (job("rdzv"), job("trainer"));
    assert_eq!(
        jobs[0]["name"], "rdzv",
        "the rendezvous job is listed first"
    );
    assert_eq!(trainer["dependsOn"][0]["name"], "rdzv");
    assert_eq!(trainer["dependsOn"][0]["status"], "Ready");

    // The rendezvous pods: an etcd member and a drun-rendezvous replica each.
    let members = n(rdzv, "/template/spec/completions");
    assert!(
        members >= 3 && members % 2 == 1,
        "an odd etcd quorum of at least 3"
    );
    assert_eq!(n(rdzv, "/template/spec/parallelism"), members);
    assert_eq!(s(rdzv, "/template/spec/completionMode"), "Indexed");
    let containers = rdzv
        .pointer("/template/spec/template/spec/containers")
        .unwrap();
    let container = |n: &str| {
        let c = containers
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == n);
        strings(&c.unwrap_or_else(|| panic!("container {n}"))["command"])
    };
    let (etcd, server) = (container("etcd"), container("rendezvous"));
    assert_eq!(server[..2], ["drun-rendezvous", "serve"]);
    assert_eq!(flag(&server, "--store"), Some("etcd"));
    assert_eq!(flag(&server, "--listen"), Some("0.0.0.0:29400"));
    assert!(rdzv
        .pointer("/template/spec/template/spec/containers/1/readinessProbe")
        .is_some());

    // Pod hostnames are <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>.
    let host = |i: u64| format!("{name}-rdzv-0-{i}.{subdomain}");
    let peers: Vec<String> = (0..members)
        .map(|i| format!("rdzv-{i}=http://{}:2380", host(i)))
        .collect();
    assert_eq!(
        flag(&etcd, "--initial-cluster"),
        Some(peers.join(",").as_str())
    );
    let endpoints: Vec<String> = (0..members).map(|i| format!("{}:29400", host(i))).collect();

    // The trainer: drun with every rendezvous replica as an endpoint.
    let pod = trainer.pointer("/template/spec/template/spec").unwrap();
    let command = strings(&pod["containers"][0]["command"]);
    assert_eq!(command[0], "drun");
    assert_eq!(
        flag(&command, "--rdzv-endpoint"),
        Some(endpoints.join(",").as_str())
    );
    assert!(
        flag(&command, "--rdzv-id").is_some(),
        "a multi-node run needs a run id"
    );
    let (min, max) = flag(&command, "--nnodes").unwrap().split_once(':').unwrap();
    assert_eq!(
        max.parse::<u64>().unwrap(),
        n(trainer, "/template/spec/parallelism")
    );
    assert!(min.parse::<u64>().unwrap() <= max.parse().unwrap());
    let shutdown: u64 = flag(&command, "--shutdown-timeout")
        .unwrap_or("30")
        .parse()
        .unwrap();
    assert!(
        n(pod, "/terminationGracePeriodSeconds") > shutdown,
        "drun must finish its shutdown inside the pod's termination grace period"
    );
}

#[test]
fn the_jobset_failure_policies_follow_drun_exit_codes() {
    let (_, js) = one_of_kind("JobSet");
    let trainer = js["spec"]["replicatedJobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "trainer")
        .unwrap();
    let spec = &trainer["template"]["spec"];
    assert_eq!(
        s(spec, "/template/spec/restartPolicy"),
        "Never",
        "podFailurePolicy needs Never"
    );
    let container = s(spec, "/template/spec/containers/0/name");

    let codes_for = |action: &str| -> BTreeSet<u64> {
        let rules = spec["podFailurePolicy"]["rules"].as_array().unwrap();
        let mut out = BTreeSet::new();
        for r in rules.iter().filter(|r| r["action"] == action) {
            if let Some(on) = r.get("onExitCodes") {
                assert_eq!(on["containerName"], container);
                assert_eq!(on["operator"], "In");
                out.extend(
                    on["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap()),
                );
            }
        }
        out
    };
    let code = |e: AgentExit| u64::from(e.code());
    assert_eq!(
        codes_for("FailJob"),
        BTreeSet::from([code(AgentExit::WorkerFailure), code(AgentExit::Usage)])
    );
    assert_eq!(
        codes_for("Count"),
        BTreeSet::from([
            code(AgentExit::Rendezvous),
            code(AgentExit::Fenced),
            code(AgentExit::GpuUnhealthy)
        ])
    );
    assert_eq!(
        codes_for("Ignore"),
        BTreeSet::from([code(AgentExit::Preempted)])
    );
    let documented = documented_exit_codes();
    let handled: BTreeSet<u64> = ["FailJob", "Count", "Ignore"]
        .iter()
        .flat_map(|a| codes_for(a))
        .collect();
    let failures: BTreeSet<u64> = documented.iter().copied().filter(|c| *c != 0).collect();
    assert_eq!(
        handled, failures,
        "every documented failure code has a rule, and only those"
    );
    let disruption = spec["podFailurePolicy"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r.get("onPodConditions").is_some())
        .expect("a rule for pods the cluster disrupted");
    assert_eq!(disruption["action"], "Ignore");
    assert_eq!(disruption["onPodConditions"][0]["type"], "DisruptionTarget");

    // JobSet level: a fatal exit fails the set, spent retries restart it.
    let rules = js["spec"]["failurePolicy"]["rules"].as_array().unwrap();
    let action_on = |reason: &str| {
        rules
            .iter()
            .find(|r| {
                strings(&r["onJobFailureReasons"])
                    .iter()
                    .any(|x| x == reason)
            })
            .map(|r| s(r, "/action").to_string())
    };
    assert_eq!(action_on("PodFailurePolicy").as_deref(), Some("FailJobSet"));
    assert_eq!(
        action_on("BackoffLimitExceeded").as_deref(),
        Some("RestartJobSet")
    );
    for r in rules {
        assert!(strings(&r["targetReplicatedJobs"])
            .iter()
            .all(|t| t == "trainer"));
    }
}

#[test]
fn the_pytorchjob_leaves_the_rendezvous_to_the_operator_and_retries_in_place() {
    let (_, job) = one_of_kind("PyTorchJob");
    let elastic = &job["spec"]["elasticPolicy"];
    assert!(["c10d", "etcd", "etcd-v2"].contains(&s(elastic, "/rdzvBackend")));
    assert!(n(elastic, "/minReplicas") <= n(elastic, "/maxReplicas"));
    assert!(
        !s(elastic, "/rdzvId").is_empty(),
        "drun needs a run id (PET_RDZV_ID)"
    );
    let worker = &job["spec"]["pytorchReplicaSpecs"]["Worker"];
    assert_eq!(n(worker, "/replicas"), n(elastic, "/maxReplicas"));
    // `ExitCode` would make drun's retryable exits (3, 4: below 128) permanent.
    assert_eq!(s(worker, "/restartPolicy"), "OnFailure");
    assert!(AgentExit::Rendezvous.code() < 128 && AgentExit::Fenced.code() < 128);

    let pod = worker.pointer("/template/spec").unwrap();
    assert_eq!(
        s(pod, "/containers/0/name"),
        "pytorch",
        "the operator's container name"
    );
    let command = strings(&pod["containers"][0]["command"]);
    assert_eq!(command[0], "drun");
    for from_operator in [
        "--nnodes",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id",
        "--max-restarts",
    ] {
        assert!(
            !command.iter().any(|a| a.starts_with(from_operator)),
            "{from_operator} comes from the operator's PET_* variables"
        );
    }
    let shutdown: u64 = flag(&command, "--shutdown-timeout")
        .unwrap_or("30")
        .parse()
        .unwrap();
    assert!(n(pod, "/terminationGracePeriodSeconds") > shutdown);
}
