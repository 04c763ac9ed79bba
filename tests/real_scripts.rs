//! What a fresh user hits with real scripts: workers that cannot be exec'd, descriptors the
//! agent holds, a rendezvous server that is not up yet.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::cluster::{free_port, RdzvServer};
use crate::harness::{drun, node_cmd, run, wait_for, Agent, DrunCmd};

/// A script with mode 0755 and `text`.
fn script(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

#[test]
fn a_worker_that_cannot_exec_fails_the_job_on_every_node_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let bad = script(dir.path(), "train.py", "#!/no/such/python\nprint('hi')\n");
    let server = RdzvServer::start(&["--store", "memory"]);
    let rdzv = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
    ];
    let mut healthy = node_cmd(0, "noexec", "2", &rdzv);
    healthy
        .quick_shutdown()
        .args(["--no-python", "sleep", "300"]);
    let mut broken = node_cmd(1, "noexec", "2", &rdzv);
    broken.quick_shutdown().arg("--no-python").arg(&bad);
    let healthy = Agent::start(healthy);
    let broken = Agent::start(broken);
    let (code, _, err) = broken.wait(Duration::from_secs(60));
    let broken_done = Instant::now();
    assert_eq!(code, 1, "{err}");
    let want = format!(
        "drun: error: cannot start worker: interpreter /no/such/python named in the first line of {bad} does not exist"
    );
    assert!(err.contains(&want), "{err}");
    // Not the 600 s join timeout: the failure went to the session, which ended the run.
    let (code, _, err) = healthy.wait(Duration::from_secs(30));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("run noexec failed"), "{err}");
    assert!(err.contains("/no/such/python"), "{err}");
    assert!(broken_done.elapsed() < Duration::from_secs(20));
}

#[test]
fn workers_get_no_descriptor_the_agent_inherited() {
    use std::os::fd::AsRawFd;
    // Opened without O_CLOEXEC: drun inherits it, as from a shell or a batch system.
    let held = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    assert!(held.as_raw_fd() > 2);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fds.txt");
    let fds = script(
        dir.path(),
        "fds.py",
        "import os, sys\n\
         def is_open(fd):\n    try:\n        os.fstat(fd)\n        return True\n    except OSError:\n        return False\n\
         fds = [fd for fd in range(3, 4096) if is_open(fd)]\n\
         open(sys.argv[1], 'w').write(repr(fds))\n",
    );
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "1"])
        .arg(&fds)
        .arg(&out);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "[]");
    drop(held);
}

/// One node on `--rdzv-backend drun` at `endpoint` with `join_timeout`, running `envdump.py`.
fn late_server_cmd(endpoint: &str, join_timeout: u32, dir: &Path) -> std::process::Command {
    let mut c = drun();
    c.args([
        "--nnodes",
        "1",
        "--rdzv-id",
        "late",
        "--rdzv-backend",
        "drun",
    ])
    .args(["--rdzv-endpoint", endpoint])
    .arg("--rdzv-conf")
    .arg(format!("join_timeout={join_timeout}"))
    .arg(crate::harness::worker("envdump.py"))
    .arg(dir);
    c
}

#[test]
fn an_unreachable_server_is_waited_for_up_to_the_join_timeout_then_one_line_exit_3() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (code, _, err) = run(
        late_server_cmd(&endpoint, 4, dir.path()),
        Duration::from_secs(60),
    );
    assert_eq!(code, 3, "{err}");
    assert!(started.elapsed() >= Duration::from_secs(4), "{err}");
    assert!(
        err.contains(&format!(
            "waiting for the rendezvous server at {endpoint}: connection refused; giving up in"
        )),
        "{err}"
    );
    let last = err.lines().last().unwrap();
    assert!(
        last.starts_with(&format!(
            "drun: error: rendezvous failed: cannot reach the rendezvous server at {endpoint} (connection refused) within the join timeout of 4 s;"
        )),
        "{err}"
    );
    assert!(last.contains("join_timeout="), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A node stopped (SIGTERM) while it still waits for its first connection has no session to
/// leave: it exits at once, without another "waiting for the rendezvous server" line (a new
/// user saw one after their Ctrl-C, and the exit waited out the leave's 2 s).
#[test]
fn a_node_stopped_before_it_reached_its_server_exits_at_once_and_quietly() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(late_server_cmd(&endpoint, 600, dir.path()));
    wait_for("the agent's start line", Duration::from_secs(30), || {
        agent.stderr_so_far().contains("rendezvous drun servers")
    });
    // Before the first progress line (2 s after the start).
    let stopped = Instant::now();
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, _, err) = agent.wait(Duration::from_secs(30));
    let took = stopped.elapsed();
    assert_eq!(code, 143, "{err}");
    assert!(
        took < Duration::from_millis(1500),
        "exited {took:?} after the signal:\n{err}"
    );
    assert!(
        !err.contains("waiting for the rendezvous server"),
        "no progress line after the signal:\n{err}"
    );
}

#[test]
fn a_server_that_comes_up_after_the_node_is_joined_once_it_does() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(late_server_cmd(&endpoint, 600, dir.path()));
    // Two progress lines (2 s, 12 s): longer than the fixed 10 s the link used to give up after.
    wait_for("two progress lines", Duration::from_secs(30), || {
        agent.stderr_so_far().matches("giving up in").count() >= 2
    });
    let _server = RdzvServer::start_on(&endpoint, &["--store", "memory"]);
    let (code, _, err) = agent.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "{err}");
}

#[test]
fn an_endpoint_that_is_not_a_drun_server_is_named_as_such_at_once() {
    // etcd answers HTTP/2 and gRPC, but not drun.v1: the classic missing --rdzv-backend etcd.
    // It cannot become a drun server by waiting: the agent ends at once, not at the join
    // timeout (a user waited the whole 600 s default).
    let etcd = crate::harness::etcd::Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (code, _, err) = run(
        late_server_cmd(&etcd.endpoint, 60, dir.path()),
        Duration::from_secs(90),
    );
    assert_eq!(code, 3, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "ended at once, not at the 60 s join timeout: {:?}\n{err}",
        started.elapsed()
    );
    let last = err.lines().last().unwrap();
    assert!(
        last.contains("not as a drun-rendezvous server") && last.contains("--rdzv-backend etcd"),
        "{err}"
    );
    // Backed off between attempts: a handful of log lines, not thousands.
    assert!(
        err.lines().count() < 50,
        "{} lines:\n{err}",
        err.lines().count()
    );
}
