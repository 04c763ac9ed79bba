//! `--standalone`: torchrun's worker environment, command construction and argument pass-through.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{drun, read_json, root, run, worker};

fn env_of(dir: &std::path::Path, rank: u32) -> Value {
    read_json(&dir.join(format!("env_{rank}.json")))
}

#[test]
fn workers_get_torchrun_environment_and_inherited_rank_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.env("RANK", "77")
        .env("WORLD_SIZE", "99")
        .env("KEEP_ME", "yes");
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "4",
        "--role",
        "trainer",
    ])
    .arg(worker("envdump.py"))
    .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let e0 = env_of(dir.path(), 0);
    let e1 = env_of(dir.path(), 1);
    for (e, rank) in [(&e0, "0"), (&e1, "1")] {
        let env = &e["env"];
        assert_eq!(env["RANK"], rank);
        assert_eq!(env["LOCAL_RANK"], rank);
        assert_eq!(env["ROLE_RANK"], rank);
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(env["ROLE_WORLD_SIZE"], "2");
        assert_eq!(env["GROUP_RANK"], "0");
        assert_eq!(env["GROUP_WORLD_SIZE"], "1");
        assert_eq!(env["ROLE_NAME"], "trainer");
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(env["TORCHELASTIC_RESTART_COUNT"], "0");
        assert_eq!(env["TORCHELASTIC_MAX_RESTARTS"], "4");
        assert_eq!(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
        assert_eq!(
            env["TORCHELASTIC_SIGNALS_TO_HANDLE"],
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        );
        assert_eq!(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
        assert_eq!(env["OMP_NUM_THREADS"], "1");
        assert_eq!(env["DRUN_GENERATION"], "1");
        assert_eq!(
            env["KEEP_ME"], "yes",
            "the agent's environment is inherited"
        );
        assert!(env["TORCHELASTIC_ERROR_FILE"]
            .as_str()
            .unwrap()
            .ends_with(&format!("attempt_0/{rank}/error.json")));
        // Own session and process group, like torchrun's start_new_session=True.
        assert_eq!(e["pid"], e["pgid"]);
        assert_eq!(e["pid"], e["sid"]);
    }
    assert_eq!(e0["env"]["MASTER_PORT"], e1["env"]["MASTER_PORT"]);
    assert_eq!(
        e0["env"]["TORCHELASTIC_RUN_ID"],
        e1["env"]["TORCHELASTIC_RUN_ID"]
    );
    assert_eq!(e0["env"]["TORCHELASTIC_RUN_ID"], e0["env"]["DRUN_RUN_ID"]);
    let run_id = e0["env"]["TORCHELASTIC_RUN_ID"].as_str().unwrap();
    assert_eq!(run_id.len(), 36, "standalone run id is a UUID4: {run_id}");
}

#[test]
fn single_worker_leaves_omp_unset_and_user_value_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "1"])
        .arg(worker("envdump.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    assert!(env_of(dir.path(), 0)["env"]
        .get("OMP_NUM_THREADS")
        .is_none());

    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.env("OMP_NUM_THREADS", "3")
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(worker("envdump.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    assert_eq!(env_of(dir.path(), 1)["env"]["OMP_NUM_THREADS"], "3");
}

#[test]
fn script_arguments_pass_through_untouched_with_local_rank_macro() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .arg(worker("envdump.py"))
        .arg(dir.path())
        .args([
            "--nproc-per-node",
            "7",
            "--out=${local_rank}.log",
            "$local_rank",
            "$$HOME",
            "-m",
        ]);
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let argv = env_of(dir.path(), 1)["argv"].clone();
    let argv: Vec<&str> = argv
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        &argv[2..],
        ["--nproc-per-node", "7", "--out=1.log", "1", "$HOME", "-m"]
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "2 workers, not 7"
    );
}

#[test]
fn module_mode_runs_python_dash_m() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.current_dir(root().join("tests/workers"))
        .args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "drunpkg.envmod",
        ])
        .arg(dir.path())
        .arg("--x");
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let e = env_of(dir.path(), 1);
    assert_eq!(e["package"], "drunpkg");
    assert_eq!(e["env"]["RANK"], "1");
    assert_eq!(e["argv"].as_array().unwrap().last().unwrap(), "--x");
}

#[test]
fn no_python_runs_an_executable_with_the_same_environment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--no-python",
        "sh",
        "-c",
    ])
    .arg(format!(
        "echo \"$RANK/$WORLD_SIZE/$0\" > {}_$LOCAL_RANK",
        out.display()
    ))
    .arg("${local_rank}");
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    for r in 0..2 {
        let text = std::fs::read_to_string(format!("{}_{r}", out.display())).unwrap();
        assert_eq!(text.trim(), format!("{r}/2/{r}"));
    }
}

#[test]
fn run_path_runs_the_script_via_runpy() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--run-path"])
        .arg(worker("envdump.py"))
        .arg(dir.path())
        .arg("extra");
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let argv = env_of(dir.path(), 0)["argv"].clone();
    assert_eq!(argv[0].as_str().unwrap(), worker("envdump.py"));
    assert_eq!(argv.as_array().unwrap().last().unwrap(), "extra");
}

#[test]
fn double_dash_right_after_the_script_is_dropped_like_argparse() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone"])
        .arg(worker("envdump.py"))
        .args(["--"])
        .arg(dir.path())
        .arg("--x");
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let argv = env_of(dir.path(), 0)["argv"].clone();
    assert_eq!(argv.as_array().unwrap().len(), 3, "{argv}");
    assert_eq!(argv[2], "--x");
}

#[test]
fn static_endpoint_is_the_master_address() {
    let dir = tempfile::tempdir().unwrap();
    let port = crate::harness::cluster::free_port().to_string();
    let mut c = drun();
    c.args(["--rdzv-backend", "static", "--rdzv-endpoint"])
        .arg(format!("localhost:{port}"))
        .arg(worker("envdump.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let env = &env_of(dir.path(), 0)["env"];
    assert_eq!(env["MASTER_ADDR"], "localhost");
    assert_eq!(env["MASTER_PORT"], port.as_str());
}

#[test]
fn static_backend_uses_master_addr_and_port() {
    let dir = tempfile::tempdir().unwrap();
    // Now the agent listens on a fixed --master-port (it hosts the worker store): a free one.
    let port = crate::harness::cluster::free_port().to_string();
    let mut c = drun();
    c.args(["--master-port", &port])
        .args(["--master-addr", "127.0.0.1", "--rdzv-id", "job7"])
        .arg(worker("envdump.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    let env = &env_of(dir.path(), 0)["env"];
    assert_eq!(env["MASTER_PORT"], port.as_str());
    assert_eq!(env["TORCHELASTIC_RUN_ID"], "job7");
}

#[test]
fn a_taken_master_port_is_a_usage_error_naming_the_fix() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut c = drun();
    c.args(["--master-port", &port, "--master-addr", "127.0.0.1"])
        .args(["--no-python", "true"]);
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("drun: error:"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains(&format!("--master-port '{port}'")) && line.contains("--worker-store rank0"),
        "{line}"
    );
    assert!(
        !err.contains("world formed"),
        "no world is announced that cannot start:\n{err}"
    );
}
