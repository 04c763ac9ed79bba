//! Pure tests of [`validate`]: command lines against synthetic hosts, no filesystem.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::*;
use crate::command::EntryKind;

pub(super) fn host() -> Host {
    Host {
        hostname: "node-a.example".into(),
        fqdn: None,
        pid: 42,
        cpu_count: 8,
        gpu_count: 0,
        env: BTreeMap::from([("PATH".into(), "/usr/bin:/bin".into())]),
        random_run_id: "random-id".into(),
        slurm_kill_wait: None,
        local_addr: None,
    }
}

pub(super) fn with_env(pairs: &[(&str, &str)]) -> Host {
    let mut h = host();
    for (k, v) in pairs {
        h.env.insert((*k).into(), (*v).into());
    }
    h
}

pub(super) fn args(v: &[&str]) -> Args {
    Args::try_parse_from(std::iter::once("drun").chain(v.iter().copied())).expect("clap parse")
}

pub(super) fn ok(v: &[&str]) -> LaunchConfig {
    validate(&args(v), &host()).expect("valid")
}

fn ok_with(v: &[&str], h: &Host) -> LaunchConfig {
    validate(&args(v), h).expect("valid")
}

pub(super) fn err(v: &[&str], h: &Host) -> String {
    validate(&args(v), h).expect_err("invalid").to_string()
}

#[test]
fn a_bare_script_is_a_standalone_run_on_this_host() {
    let c = ok(&["train.py", "--lr", "1"]);
    assert_eq!(
        c.rdzv.mode,
        RendezvousMode::Embedded {
            master_addr: "127.0.0.1".into(),
            fixed_port: None
        }
    );
    assert_eq!(
        (c.run_id.as_str(), c.node_id.as_str()),
        ("random-id", "node-a.example_42")
    );
    assert_eq!(
        (c.rdzv.min_nodes, c.rdzv.max_nodes, c.workers.nproc_per_node),
        (1, 1, 1)
    );
    assert_eq!(c.supervision.shutdown_timeout, Duration::from_secs(30));
    assert_eq!(c.workers.entrypoint.kind, EntryKind::Script);
    assert_eq!(c.workers.entrypoint.program, PathBuf::from("python3"));
    assert_eq!(
        c.workers.entrypoint.argv(0),
        ["-u", "train.py", "--lr", "1"]
    );
    assert!(
        c.notes.is_empty() && c.scheduler.slurm.is_none() && c.rdzv.requested_node_rank.is_none()
    );
}

#[test]
fn nproc_words_use_the_host_counts() {
    assert_eq!(
        ok(&["--nproc-per-node", "cpu", "t.py"])
            .workers
            .nproc_per_node,
        8
    );
    assert_eq!(
        ok(&["--nproc-per-node", "auto", "t.py"])
            .workers
            .nproc_per_node,
        8
    );
    let gpus = Host {
        gpu_count: 4,
        ..host()
    };
    let c = validate(&args(&["--nproc-per-node", "gpu", "t.py"]), &gpus).unwrap();
    assert_eq!(c.workers.nproc_per_node, 4);
    assert!(err(&["--nproc-per-node", "gpu", "t.py"], &host()).contains("no NVIDIA GPU"));
    assert!(err(&["--nproc-per-node", "xpu", "t.py"], &host()).contains("Intel XPUs"));
    // More than a rendezvous server accepts is refused here, not by the server or the kernel.
    assert_eq!(
        ok(&["--nproc-per-node", "4096", "t.py"])
            .workers
            .nproc_per_node,
        4096
    );
    let e = err(&["--nproc-per-node", "99999999", "t.py"], &host());
    assert!(e.contains("at most 4096 workers per node"), "{e}");
}

#[test]
fn inside_slurm_the_job_fills_unset_flags_and_kill_wait_sets_the_grace() {
    let mut h = with_env(&[
        ("SLURM_JOB_ID", "6"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_NODEID", "0"),
        ("SLURMD_NODENAME", "n1"),
        ("SLURM_JOB_NODELIST", "n[1-2]"),
    ]);
    h.slurm_kill_wait = Some(Duration::from_secs(10));
    let c = validate(&args(&["t.py"]), &h).unwrap();
    assert_eq!(
        (c.run_id.as_str(), c.rdzv.min_nodes, c.rdzv.max_nodes),
        ("6", 1, 2)
    );
    assert_eq!(
        c.rdzv.mode,
        RendezvousMode::C10d {
            endpoint: "n1:20006".into(),
            is_host: Some(true)
        }
    );
    assert_eq!(c.node_id, "n1_42");
    assert_eq!(c.supervision.shutdown_timeout, Duration::from_secs(8));
    assert!(c
        .scheduler
        .slurm_line
        .unwrap()
        .starts_with("slurm job 6: run id 6"));
    let c = validate(&args(&["--standalone", "t.py"]), &h).unwrap();
    assert!(c.scheduler.slurm.is_none(), "--standalone ignores Slurm");
    assert_eq!(c.supervision.shutdown_timeout, Duration::from_secs(30));
}

#[test]
fn shutdown_timeout_flag_then_torch_variable_then_default() {
    let h = with_env(&[("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", " 7 ")]);
    let c = validate(&args(&["t.py"]), &h).unwrap();
    assert_eq!(c.supervision.shutdown_timeout, Duration::from_secs(7));
    let c = validate(&args(&["--shutdown-timeout", "2.5", "t.py"]), &h).unwrap();
    assert_eq!(c.supervision.shutdown_timeout, Duration::from_millis(2500));
    let bad = with_env(&[("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon")]);
    assert!(err(&["t.py"], &bad).contains("is not a number"));
    assert!(err(&["--shutdown-timeout", "-1", "t.py"], &host()).contains(">= 0 seconds"));
    assert!(err(&["--monitor-interval", "0", "t.py"], &host()).contains("at least 0.001"));
}

#[test]
fn prefix_template_from_flag_else_non_empty_variable() {
    let h = with_env(&[("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}>")]);
    let c = validate(&args(&["t.py"]), &h).unwrap();
    assert_eq!(c.output.prefix_template.as_deref(), Some("${rank}>"));
    let c = validate(&args(&["--log-line-prefix-template", "", "t.py"]), &h).unwrap();
    assert_eq!(
        c.output.prefix_template.as_deref(),
        Some(""),
        "an explicit empty template wins"
    );
    let empty = with_env(&[("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "")]);
    assert_eq!(
        validate(&args(&["t.py"]), &empty)
            .unwrap()
            .output
            .prefix_template,
        None
    );
}

#[test]
fn rdzv_conf_sets_timing_and_notes_unknown_keys() {
    let c = ok(&[
        "--rdzv-conf",
        "join_timeout=5,lease_ttl=6,colour=red",
        "t.py",
    ]);
    assert_eq!(c.rdzv.timing.join_timeout, Duration::from_secs(5));
    assert_eq!(c.rdzv.timing.keep_alive_interval, Duration::from_secs(2));
    assert_eq!(c.notes.len(), 1);
    assert!(c.notes[0].starts_with("--rdzv-conf colour is not used"));
    let e = err(
        &["--rdzv-conf", "lease_ttl=3,keep_alive_interval=3", "t.py"],
        &host(),
    );
    assert!(e.contains("below lease_ttl"), "{e}");
    assert!(err(&["--rdzv-conf", "lonely", "t.py"], &host()).contains("has no value"));
    let e = err(&["--rdzv-conf", "join_timeout=0", "t.py"], &host());
    assert!(
        e.contains("join_timeout=0") && e.contains("must be > 0"),
        "{e}"
    );
}

#[test]
fn unsupported_torchrun_flags_are_refused_by_name() {
    assert!(err(&["--logs-specs", "x", "t.py"], &host()).starts_with("--logs-specs"));
    assert!(err(&["--print-completion", "bash", "t.py"], &host()).contains("completion"));
    // torchrun's flag needs no script: the refusal, not a missing script, is what is said.
    assert!(err(&["--print-completion", "bash"], &host()).starts_with("--print-completion"));
    assert!(err(&["--event-log-handler", "console", "t.py"], &host()).contains("got 'console'"));
    ok(&["--event-log-handler", "null", "t.py"]);
}

#[test]
fn entrypoint_kinds_and_the_script_position() {
    assert!(err(&["--no-python", "-m", "t.py"], &host()).contains("cannot be combined"));
    assert!(err(&["--nproc-per-nodes", "2"], &host()).contains("unknown flag '--nproc-per-nodes'"));
    let c = ok(&["-m", "pkg.mod", "--", "x"]);
    assert_eq!(
        c.workers.entrypoint.argv(0),
        ["-u", "-m", "pkg.mod", "x"],
        "one `--` is dropped"
    );
    let c = ok(&["--no-python", "./bin", "${local_rank}"]);
    assert_eq!(c.workers.entrypoint.program, PathBuf::from("./bin"));
    assert_eq!(c.workers.entrypoint.argv(3), ["3"]);
    let c = ok(&["--python", "/opt/py", "--run-path", "--no-python", "t.py"]);
    assert_eq!(
        c.workers.entrypoint.kind,
        EntryKind::RunPath,
        "--run-path wins"
    );
    assert_eq!(c.workers.entrypoint.program, PathBuf::from("/opt/py"));
}

#[test]
fn checkpoint_flags_are_checked_without_touching_the_directory() {
    let dir = "/nonexistent/drun-validate-test/ckpt";
    let c = ok(&["--ckpt-dir", dir, "--ckpt-keep-last", "2", "t.py"]);
    assert_eq!(c.ckpt.dir.as_deref(), Some(std::path::Path::new(dir)));
    assert_eq!(c.ckpt.retention.keep_last, 2);
    assert!(
        !std::path::Path::new(dir).exists(),
        "validate creates nothing"
    );
    assert!(err(&["--ckpt-keep-last", "2", "t.py"], &host()).contains("needs --ckpt-dir DIR"));
    assert!(err(&["--ckpt-keep-every", "5", "t.py"], &host()).contains("needs --ckpt-keep-last"));
    assert!(err(&["--requeue", "t.py"], &host()).contains("needs --on-preempt checkpoint"));
    let e = err(&["--ckpt-replicas", "1", "t.py"], &host());
    assert!(
        e.contains("--ckpt-replicas")
            && e.contains("give --ckpt-memory SIZE|auto")
            && !e.contains('\n'),
        "{e}"
    );
    let e = err(
        &[
            "--ckpt-dir",
            dir,
            "--ckpt-memory",
            "1M",
            "--ckpt-replicas",
            "2",
            "t.py",
        ],
        &host(),
    );
    assert!(e.contains("give 0 or 1"), "{e}");
    let c = ok(&[
        "--ckpt-dir",
        dir,
        "--ckpt-memory",
        "1M",
        "--ckpt-replicas",
        "1",
        "t.py",
    ]);
    assert_eq!((c.ckpt.memory, c.ckpt.replicas), (Some(1 << 20), 1));
    assert_eq!(ok(&["t.py"]).ckpt.replicas, 0, "off by default");
    // A size asked for without --ckpt-dir stages nothing, and says so; `auto` goes unsaid.
    let c = ok(&["--ckpt-memory", "1M", "t.py"]);
    assert_eq!(c.ckpt.memory, None);
    assert!(
        c.notes
            .iter()
            .any(|n| n.starts_with("--ckpt-memory 1M is ignored without --ckpt-dir")),
        "{:?}",
        c.notes
    );
    assert!(ok(&["t.py"]).notes.is_empty());
    assert!(err(&["--on-preempt", "checkpoint", "t.py"], &host()).contains("in-memory"));
    assert!(err(&["--preempt-signal", "SIGNOPE", "t.py"], &host()).contains("--preempt-signal"));
    let c = ok(&[
        "--on-scale-up",
        "checkpoint",
        "--scale-up-save-timeout",
        "9",
        "t.py",
    ]);
    assert_eq!(c.ckpt.scale_up_save, Some(Duration::from_secs(9)));
}

#[test]
fn checkpoint_interval_flags() {
    use drun_rendezvous::decisions::ckpt_interval::IntervalMode;
    let c = ok(&["t.py"]);
    assert_eq!(c.ckpt.interval.mode, IntervalMode::Off, "off by default");
    assert_eq!(c.ckpt.interval.expected_mtbf, Duration::from_secs(4 * 3600));
    let c = ok(&["--ckpt-interval", "auto", "--expected-mtbf", "600", "t.py"]);
    assert_eq!(c.ckpt.interval.mode, IntervalMode::Auto);
    assert_eq!(c.ckpt.interval.expected_mtbf, Duration::from_secs(600));
    let c = ok(&["--ckpt-interval", "90", "t.py"]);
    assert_eq!(
        c.ckpt.interval.mode,
        IntervalMode::Fixed(Duration::from_secs(90))
    );
    let e = err(&["--ckpt-interval", "often", "t.py"], &host());
    assert!(
        e.contains("--ckpt-interval") && e.contains("auto, off or a number of seconds"),
        "{e}"
    );
    let e = err(
        &["--ckpt-interval", "auto", "--expected-mtbf", "0", "t.py"],
        &host(),
    );
    assert!(e.contains("--expected-mtbf"), "{e}");
}

#[test]
fn stdin_rank_and_filters_name_local_ranks() {
    let e = err(
        &["--nproc-per-node", "2", "--stdin-rank", "2", "t.py"],
        &host(),
    );
    assert!(e.contains("local ranks 0..1 (--nproc-per-node 2)"), "{e}");
    let c = ok(&["--nproc-per-node", "2", "--local-ranks-filter", "1", "t.py"]);
    assert_eq!(c.output.local_ranks_filter, Some([1].into()));
    assert!(err(&["--local-ranks-filter", "x", "t.py"], &host()).contains("comma-separated"));
    assert!(err(
        &["--worker-store", "rank0", "--redirects", "9", "t.py"],
        &host()
    )
    .contains("--redirects"));
}

#[test]
fn a_local_addr_the_host_does_not_hold_is_a_warning_at_start() {
    use super::local_addr::AddrCheck;
    let mut h = host();
    h.local_addr = Some(AddrCheck {
        resolved: vec!["10.9.9.9".parse().unwrap()],
        held: false,
        interfaces: vec!["127.0.0.1".parse().unwrap()],
    });
    let c = validate(&args(&["--local-addr", "10.9.9.9", "t.py"]), &h).expect("valid");
    assert!(
        c.notes.iter().any(|n| n.starts_with(
            "--local-addr 10.9.9.9 is not an address of this host (it has 127.0.0.1)"
        )),
        "{:?}",
        c.notes
    );
    h.local_addr.as_mut().unwrap().held = true;
    let c = validate(&args(&["--local-addr", "10.9.9.9", "t.py"]), &h).expect("valid");
    assert!(
        !c.notes.iter().any(|n| n.contains("--local-addr")),
        "{:?}",
        c.notes
    );
}

#[test]
fn local_addr_names_the_node_and_the_standalone_master() {
    let c = ok(&["--local-addr", "10.0.0.5", "--rdzv-id", "keep", "t.py"]);
    assert_eq!(c.node_id, "10.0.0.5_42");
    assert_eq!(c.run_id, "keep", "an explicit id survives standalone");
    assert!(
        matches!(c.rdzv.mode, RendezvousMode::Embedded { ref master_addr, .. } if master_addr == "10.0.0.5")
    );
    let c = ok(&["--standalone", "--rdzv-endpoint", "x:1", "t.py"]);
    assert!(c.notes[0].contains("ignoring the explicit --rdzv-endpoint"));
    // A flag that changes nothing is said (a user's --master-port went silently unused).
    let c = ok(&["--standalone", "--master-port", "2379", "t.py"]);
    assert!(
        c.notes.iter().any(|n| n.contains("ignoring --master-port")),
        "{:?}",
        c.notes
    );
    assert!(err(&["--standalone", "--nnodes", "2", "t.py"], &host()).contains("runs one node"));
}

#[test]
fn session_config_has_no_last_call_for_a_fixed_size_group() {
    let fixed = ok(&[
        "--rdzv-conf",
        "last_call_timeout=7",
        "--max-restarts",
        "3",
        "t.py",
    ]);
    let s = fixed.session_config();
    assert_eq!(s.round.last_call, Duration::ZERO);
    assert_eq!(
        (s.round.min_nodes, s.round.max_nodes, s.max_restarts),
        (1, 1, 3)
    );
    assert_eq!((s.run_id, s.node_id), (fixed.run_id, fixed.node_id));
    assert!(s.auto_keep_alive);
    let elastic = ok(&[
        "--nnodes",
        "1:2",
        "--rdzv-id",
        "j",
        "--rdzv-endpoint",
        "h",
        "--rdzv-conf",
        "last_call_timeout=7",
        "t.py",
    ]);
    let s = elastic.session_config();
    assert_eq!(s.round.last_call, Duration::from_secs(7));
    assert_eq!(s.lease_ttl, Duration::from_secs(10));
    assert_eq!(s.round.join_timeout, Duration::from_secs(600));
}

#[test]
fn the_interpreter_comes_from_the_flag_then_drun_python_then_python_exec() {
    use crate::command::PythonSource;
    let h = with_env(&[
        ("DRUN_PYTHON", "/venv/bin/python"),
        ("PYTHON_EXEC", "/x/py"),
    ]);
    let c = validate(&args(&["t.py"]), &h).unwrap();
    assert_eq!(
        (c.workers.python.as_deref(), c.workers.python_source),
        (
            Some(std::path::Path::new("/venv/bin/python")),
            PythonSource::DrunPython
        )
    );
    assert_eq!(
        c.workers.entrypoint.program,
        PathBuf::from("/venv/bin/python")
    );
    let c = validate(&args(&["--python", "/f/py", "t.py"]), &h).unwrap();
    assert_eq!(c.workers.python_source, PythonSource::Flag);
    let c = validate(&args(&["t.py"]), &with_env(&[("PYTHON_EXEC", "/x/py")])).unwrap();
    assert_eq!(c.workers.python_source, PythonSource::PythonExec);
    let e = err(&["t.py"], &with_env(&[("DRUN_PYTHON", "")]));
    assert!(
        e.starts_with("DRUN_PYTHON is empty: unset it, or name"),
        "{e}"
    );
    let e = err(
        &["t.py"],
        &with_env(&[("PATH", "/bin"), ("PYTHON_EXEC", " ")]),
    );
    assert!(e.starts_with("PYTHON_EXEC is empty"), "{e}");
}

#[test]
fn a_program_looked_up_on_an_unset_or_empty_path_is_refused_up_front() {
    let mut no_path = host();
    no_path.env.clear();
    let e = err(&["t.py"], &no_path);
    assert!(
        e.starts_with("PATH is missing: python3 is looked up on PATH; set it"),
        "{e}"
    );
    assert!(e.contains("--python /path/to/python"), "{e}");
    let e = err(&["--no-python", "trainer"], &with_env(&[("PATH", "")]));
    assert!(e.starts_with("PATH is empty: trainer is looked up"), "{e}");
    assert!(e.contains("full path"), "{e}");
    let e = err(
        &["t.py"],
        &with_env(&[("PATH", ":"), ("DRUN_PYTHON", "python3.11")]),
    );
    assert!(e.starts_with("PATH is empty: python3.11"), "{e}");
    // Nothing to look up: no PATH needed.
    validate(&args(&["--python", "/usr/bin/python3", "t.py"]), &no_path).unwrap();
    validate(&args(&["--no-python", "./bin/train"]), &no_path).unwrap();
}

#[test]
fn straggler_factor_is_1_5_by_default_0_turns_it_off_and_1_or_less_is_refused() {
    assert_eq!(ok(&["t.py"]).observe.straggler_factor, 1.5);
    assert_eq!(
        ok(&["--straggler-factor", "0", "t.py"])
            .observe
            .straggler_factor,
        0.0
    );
    assert_eq!(
        ok(&["--straggler-factor", "2", "t.py"])
            .observe
            .straggler_factor,
        2.0
    );
    for bad in ["1", "0.5", "-1", "inf", "NaN"] {
        let e = err(&["--straggler-factor", bad, "t.py"], &host());
        assert!(e.contains("--straggler-factor"), "{bad}: {e}");
    }
}

#[test]
fn hang_timeout_is_off_by_default_and_takes_seconds_a_suffix_or_auto() {
    assert_eq!(ok(&["t.py"]).observe.hang_timeout, None);
    assert_eq!(
        ok(&["--hang-timeout", "off", "t.py"]).observe.hang_timeout,
        None
    );
    let secs = |v: &str| ok(&["--hang-timeout", v, "t.py"]).observe.hang_timeout;
    let fixed = |d| Some(crate::agent::hang::Timeout::Fixed(d));
    assert_eq!(secs("5"), fixed(Duration::from_secs(5)));
    assert_eq!(secs("2.5s"), fixed(Duration::from_millis(2500)));
    assert_eq!(secs("10m"), fixed(Duration::from_secs(600)));
    assert_eq!(secs("1h"), fixed(Duration::from_secs(3600)));
    assert_eq!(secs("auto"), Some(crate::agent::hang::Timeout::Auto));
    for bad in ["0", "-1", "soon", "5x"] {
        let e = err(&["--hang-timeout", bad, "t.py"], &host());
        assert!(e.contains("--hang-timeout"), "{bad}: {e}");
    }
}

#[test]
fn numa_binding_reads_the_topology_and_refuses_a_node_without_gpus_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let e = err(
        &["--numa-binding", "node", "t.py"],
        &with_env(&[("DRUN_TOPOLOGY_ROOT", root)]),
    );
    assert!(
        e.starts_with("invalid --numa-binding 'node': this node has no NVIDIA GPU"),
        "{e}"
    );
    let allowed: Vec<usize> = crate::numa::allowed_cpus().into_iter().collect();
    let cpu = allowed[0];
    crate::numa::tests::write_fixture(
        dir.path(),
        &[(&cpu.to_string(), 0)],
        &[("0000:01:00.0", 0), ("0000:02:00.0", 0)],
    );
    let h = with_env(&[("DRUN_TOPOLOGY_ROOT", root)]);
    let c = ok_with(
        &["--nproc-per-node", "2", "--numa-binding", "node", "t.py"],
        &h,
    );
    let b = c.workers.numa.expect("bound");
    assert_eq!(b.for_rank(1), Some(&[cpu].into()));
    let e = err(
        &["--nproc-per-node", "3", "--numa-binding", "node", "t.py"],
        &h,
    );
    assert!(e.contains("local rank 2 has no GPU"), "{e}");
}

#[test]
fn virtual_local_rank_needs_a_device_for_every_local_rank() {
    let h = with_env(&[("CUDA_VISIBLE_DEVICES", "4,5")]);
    let c = ok_with(
        &["--nproc-per-node", "2", "--virtual-local-rank", "t.py"],
        &h,
    );
    assert!(c.workers.virtual_local_rank);
    let e = err(
        &["--nproc-per-node", "3", "--virtual-local-rank", "t.py"],
        &h,
    );
    assert!(
        e.starts_with(
            "invalid --virtual-local-rank 'CUDA_VISIBLE_DEVICES=4,5': 3 local ranks need 3 devices"
        ),
        "{e}"
    );
    assert!(
        !ok(&["--nproc-per-node", "3", "t.py"])
            .workers
            .virtual_local_rank
    );
}

#[test]
fn an_unambiguous_prefix_of_a_flag_is_that_flag_as_under_torchrun() {
    let v = ["--stand", "--nproc", "2", "t.py", "--nnodes", "5"];
    let a = args(&v);
    assert!(a.standalone, "--stand is --standalone");
    let c = ok(&v);
    assert_eq!(c.workers.nproc_per_node, 2);
    assert_eq!(
        c.workers.entrypoint.argv(0),
        ["-u", "t.py", "--nnodes", "5"],
        "the script's own flags stay its own"
    );
    // `--rdzv` could be any of four flags: not taken for one.
    assert!(err(&["--rdzv", "x", "t.py"], &host()).contains("'--rdzv'"));
}
