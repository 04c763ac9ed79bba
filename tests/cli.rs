//! Command-line surface: bad input is one line and exit 2 with nothing spawned; PET_* fallbacks.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::harness::{drun, run, worker};

/// Runs drun with `args` followed by the env-dump worker, and asserts: exit 2, exactly one
/// non-empty stderr line containing `needle`, and no worker ran.
fn rejects(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = drun();
    cmd.args(args).arg(worker("envdump.py")).arg(dir.path());
    let (code, out, err) = run(cmd, Duration::from_secs(20));
    assert_eq!(code, 2, "args {args:?}: stderr {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "args {args:?}: want one line, got {err:?}");
    assert!(
        lines[0].contains(needle),
        "args {args:?}: {:?} lacks {needle:?}",
        lines[0]
    );
    assert!(out.is_empty(), "nothing on stdout: {out}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a worker ran for {args:?}"
    );
}

#[test]
fn bad_nnodes_is_one_line_exit_2() {
    rejects(&["--nnodes", "3:2"], "--nnodes '3:2'");
}

#[test]
fn zero_nproc_is_one_line_exit_2() {
    rejects(&["--nproc-per-node", "0"], "must be at least 1");
}

#[test]
fn unknown_flag_is_one_line_exit_2() {
    rejects(&["--no-such-flag"], "--no-such-flag");
}

#[test]
fn unimplemented_torchrun_flag_is_named() {
    rejects(&["--logs-specs", "x"], "--logs-specs");
    rejects(&["--print-completion", "bash"], "--print-completion");
    // Implemented now: an unknown mode is named with the ones there are.
    rejects(
        &["--numa-binding", "cores"],
        "node, socket, exclusive, core-complex",
    );
}

#[test]
fn module_with_no_python_is_rejected() {
    rejects(&["--no-python", "-m"], "cannot be combined");
}

#[test]
fn missing_script_is_one_line_exit_2() {
    let (code, out, err) = run(
        {
            let mut c = drun();
            c.args(["--standalone", "/nonexistent/train.py", "--lr", "1"]);
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/train.py not found"), "{err}");
    assert!(out.is_empty());
}

#[test]
fn help_lists_torchrun_flags_and_exit_codes() {
    let (code, out, _) = run(
        {
            let mut c = drun();
            c.arg("--help");
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(code, 0);
    for flag in [
        "--nproc-per-node",
        "--rdzv-endpoint",
        "--max-restarts",
        "--shutdown-timeout",
        "Exit codes:",
        "128+N",
    ] {
        assert!(out.contains(flag), "--help lacks {flag}");
    }
}

/// Every `--name` in `text`, in order: `` `--watch[=INTERVAL]` `` gives `--watch`; a table rule
/// (`|---|`) or a word with dashes inside gives nothing.
fn long_flags(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|t| t.starts_with("--") && t[2..].starts_with(|c: char| c.is_ascii_lowercase()))
        .map(String::from)
        .collect()
}

/// `drun --help` and `docs/reference/flags.md` name the same flags: the long flag of every option
/// line of the help (`  -m, --module`, `      --nnodes <N|MIN:MAX>`: indented at most 6 columns;
/// help text, `[aliases: ...]` and the exit-code table are indented further or start otherwise)
/// is a row of the page's table of every flag, and every row's flags are in the help.
#[test]
fn help_and_the_flags_reference_name_the_same_flags() {
    let (code, out, err) = run(
        {
            let mut c = drun();
            c.arg("--help");
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(code, 0, "{err}");
    let help: BTreeSet<String> = out
        .lines()
        .filter(|l| l.len() - l.trim_start().len() <= 6 && l.trim_start().starts_with('-'))
        .filter_map(|l| long_flags(l).into_iter().next())
        .collect();
    for flag in ["--nproc-per-node", "--ckpt-dir", "--etcd-cacert", "--help"] {
        assert!(
            help.contains(flag),
            "{flag} not found in drun --help: {help:?}"
        );
    }

    let page = std::fs::read_to_string(crate::harness::root().join("docs/reference/flags.md"))
        .expect("docs/reference/flags.md");
    let table: BTreeSet<String> = page
        .split("## Every flag of `drun --help`")
        .nth(1)
        .expect("docs/reference/flags.md has a section \"Every flag of `drun --help`\"")
        .split("\n## ")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|row| row.trim_start_matches('|').split(" | ").next())
        .flat_map(long_flags)
        .collect();
    let undocumented: Vec<&String> = help.difference(&table).collect();
    let not_in_help: Vec<&String> = table.difference(&help).collect();
    assert!(
        undocumented.is_empty() && not_in_help.is_empty(),
        "drun --help and docs/reference/flags.md disagree: in the help only {undocumented:?}, \
         in the page's table only {not_in_help:?}"
    );
}

#[test]
fn pet_environment_fallback_and_command_line_wins() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.env("PET_NPROC_PER_NODE", "3")
        .env("PET_MAX_RESTARTS", "2")
        .args(["--standalone"])
        .arg(worker("envdump.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        3,
        "PET_NPROC_PER_NODE=3 honoured"
    );
    let env = crate::harness::read_json(&dir.path().join("env_2.json"));
    assert_eq!(env["env"]["TORCHELASTIC_MAX_RESTARTS"], "2");

    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.env("PET_NPROC_PER_NODE", "3")
        .args(["--standalone", "--nproc_per_node", "1"])
        .arg(worker("envdump.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "command line wins over PET_*"
    );
}

/// A bad value that came from a `PET_*` variable (Kubeflow sets them) names the variable, not
/// only the flag the command line never held; given as a flag, the line stays as it was.
#[test]
fn a_bad_pet_value_names_its_variable() {
    for (var, value, flag) in [
        ("PET_MAX_RESTARTS", "abc", "--max-restarts"),
        ("PET_NNODES", "x", "--nnodes"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = drun();
        c.env(var, value)
            .arg("--standalone")
            .arg(worker("envdump.py"))
            .arg(dir.path());
        let (code, _, err) = run(c, Duration::from_secs(20));
        assert_eq!(code, 2, "{var}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{var}: {err}");
        assert!(
            lines[0].contains(flag) && lines[0].contains(&format!("set by {var}={value}")),
            "{}",
            lines[0]
        );
        rejects(&["--standalone", flag, value], flag);
        let mut c = drun();
        c.args(["--standalone", flag, value]).arg("x.py");
        let (_, _, err) = run(c, Duration::from_secs(20));
        assert!(!err.contains("set by"), "{err}");
    }
}

#[test]
fn multi_node_without_endpoint_is_refused_not_localhost() {
    rejects(
        &[
            "--nnodes",
            "2",
            "--rdzv-id",
            "job",
            "--rdzv-backend",
            "c10d",
        ],
        "--rdzv-endpoint",
    );
    rejects(&["--nnodes", "2"], "--rdzv-endpoint");
    rejects(
        &["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"],
        "--rdzv-id",
    );
    rejects(
        &["--nnodes", "2", "--standalone"],
        "--standalone runs one node",
    );
}

#[test]
fn unreachable_rendezvous_is_one_line_exit_3() {
    let port = crate::harness::cluster::free_port();
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args([
        "-q",
        "--nnodes",
        "2",
        "--rdzv-id",
        "job",
        "--rdzv-backend",
        "etcd",
        // The first connection waits up to the join timeout (nodes and etcd start in any order).
        "--rdzv-conf",
        "join_timeout=2",
    ])
    .arg("--rdzv-endpoint")
    .arg(format!("127.0.0.1:{port}"))
    .arg(worker("envdump.py"))
    .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 3, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(&format!("127.0.0.1:{port}")), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn flag_typo_before_the_script_is_named_not_taken_for_the_script() {
    rejects(
        &["--nproc-per-nodes", "2"],
        "unknown flag '--nproc-per-nodes'; did you mean --nproc-per-node?",
    );
}

#[test]
fn bad_rendezvous_values_are_refused() {
    rejects(
        &["--rdzv-endpoint", "host:notaport", "--rdzv-id", "j"],
        "must be an integer in 1-65535",
    );
    rejects(&["--rdzv-conf", "join_timeout=abc"], "join_timeout=abc");
    rejects(&["--nproc-per-node", "99999999999"], "far more workers");
}

#[test]
fn boolean_pet_variables_take_1_and_0_and_repeated_flags_take_the_last_value() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.env("PET_STANDALONE", "1")
        .args(["--nproc-per-node", "3", "--nproc_per_node", "2"])
        .arg(worker("envdump.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "last --nproc-per-node wins"
    );
    let env = crate::harness::read_json(&dir.path().join("env_0.json"));
    assert_eq!(
        env["env"]["TORCHELASTIC_RUN_ID"].as_str().unwrap().len(),
        36,
        "PET_STANDALONE=1 means standalone"
    );
}

#[test]
fn bad_checkpoint_and_preemption_flags_are_one_line_exit_2() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let file = f.path().to_str().unwrap();
    rejects(&["--ckpt-dir", file], "exists and is not a directory");
    rejects(&["--ckpt-keep-last", "2"], "needs --ckpt-dir DIR");
    rejects(
        &["--ckpt-dir", "/tmp", "--ckpt-keep-every", "10"],
        "needs --ckpt-keep-last",
    );
    rejects(&["--ckpt-verify", "bogus"], "--ckpt-verify");
    rejects(&["--requeue"], "needs --on-preempt checkpoint");
    rejects(
        &["--standalone", "--on-preempt", "checkpoint"],
        "needs --ckpt-dir DIR with an in-memory rendezvous",
    );
    rejects(&["--preempt-signal", "SIGNOPE"], "--preempt-signal");
    // Seconds: huge, infinite and sub-millisecond values are refused, never a panic.
    rejects(
        &["--scale-up-save-timeout", "1e30"],
        "at most 2592000 seconds",
    );
    rejects(
        &["--scale-up-save-timeout", "inf"],
        "a finite number of seconds",
    );
    rejects(
        &["--scale-up-save-timeout", "0.0001"],
        "at least 0.001 seconds",
    );
    rejects(&["--shutdown-timeout", "1e300"], "at most 2592000 seconds");
    rejects(
        &["--rdzv-conf", "join_timeout=1e30"],
        "expected a number of seconds, at most 2592000",
    );
    // --ckpt-resume-from: nothing there, not a manifest, a file of it missing or cut short.
    let empty = tempfile::tempdir().unwrap();
    let dir = empty.path().to_str().unwrap();
    rejects(
        &["--ckpt-resume-from", dir],
        "has no readable `latest` pointer",
    );
    rejects(
        &["--ckpt-resume-from", file],
        "is not a drun checkpoint manifest",
    );
    let shard = empty.path().join("rank0.pt");
    std::fs::write(&shard, b"weights").unwrap();
    let manifest = empty.path().join("drun-manifest-4-1.json");
    std::fs::write(
        &manifest,
        serde_json::json!({
            "run_id": "old", "step": 4, "generation": 1, "world_size": 1,
            "cursor": {"consumed_in_epoch": 32},
            "files": [{"rank": 0, "path": shard, "bytes": 8, "sha256": ""}],
            "sealed_at_ms": 0
        })
        .to_string(),
    )
    .unwrap();
    rejects(
        &["--ckpt-resume-from", manifest.to_str().unwrap()],
        "has 7 bytes, the manifest says 8",
    );
    std::fs::remove_file(&shard).unwrap();
    rejects(
        &["--ckpt-resume-from", manifest.to_str().unwrap()],
        "rank0.pt (rank 0) of step 4: No such file",
    );
}

#[test]
fn an_empty_drun_python_or_path_is_one_line_exit_2() {
    for (var, value, needle) in [
        ("DRUN_PYTHON", Some(""), "DRUN_PYTHON is empty: unset it"),
        (
            "PATH",
            Some(""),
            "PATH is empty: python3 is looked up on PATH",
        ),
        (
            "PATH",
            None,
            "PATH is missing: python3 is looked up on PATH",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = drun();
        match value {
            Some(v) => c.env(var, v),
            None => c.env_remove(var),
        };
        c.env_remove("PYTHON_EXEC")
            .args(["--standalone"])
            .arg(worker("envdump.py"))
            .arg(dir.path());
        let (code, _, err) = run(c, Duration::from_secs(20));
        assert_eq!(code, 2, "{var}={value:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains(needle), "{var}={value:?}: {err}");
    }
    rejects(
        &["--nnodes", "2", "--rdzv-id", "j", "--rdzv-endpoint", ""],
        "--rdzv-endpoint is empty",
    );
}

#[test]
fn a_script_argument_that_is_not_utf8_is_named_exit_2() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = drun();
    cmd.arg("--standalone")
        .arg(worker("envdump.py"))
        .arg(dir.path())
        .arg(std::ffi::OsStr::from_bytes(b"ok-\xff"));
    let (code, _, err) = run(cmd, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("the argument 'ok-\u{fffd}' is not valid UTF-8"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn an_unwritable_termination_log_is_refused_at_start_not_warned_about_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/termination.json");
    rejects(
        &[
            "--standalone",
            "--termination-log",
            missing.to_str().unwrap(),
        ],
        "does not exist; name a file in an existing directory",
    );
    rejects(
        &[
            "--standalone",
            "--termination-log",
            dir.path().to_str().unwrap(),
        ],
        "that is a directory",
    );
}
