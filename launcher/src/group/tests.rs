//! Worker-group tests against [`FakeOs`]: no processes, no sleeping.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use drun_rendezvous::decisions::plan::Member;
use drun_rendezvous::Plan;
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::*;
use crate::config::{validate, Host};
use crate::os::fake::{Call, FakeOs};
use crate::os::guard::Guard;
use crate::warm::WarmPool;
use crate::LaunchConfig;

fn config(nproc: u32) -> LaunchConfig {
    let args =
        crate::Args::try_parse_from(["drun", "--nproc-per-node", &nproc.to_string(), "t.py"])
            .expect("clap parse");
    let host = Host {
        hostname: "h".into(),
        pid: 1,
        cpu_count: 1,
        random_run_id: "run".into(),
        env: [("PATH".to_string(), "/usr/bin:/bin".to_string())].into(),
        ..Host::default()
    };
    validate(&args, &host).expect("valid")
}

fn plan(cfg: &LaunchConfig, base_rank: u32) -> Plan {
    Plan {
        run_id: cfg.run_id.clone(),
        generation: 3,
        members: vec![Member {
            node_id: cfg.node_id.clone(),
            advertise_addr: "h".into(),
            node_rank: 0,
            slots: cfg.workers.nproc_per_node,
            base_rank,
            probe_port: 0,
        }]
        .into(),
        world_size: base_rank + cfg.workers.nproc_per_node,
        master_addr: "h".into(),
        master_port: 29500,
        restarts_failures: 0,
        restarts_membership: 0,
        resume: None,
        resume_memory: None,
        notes: vec![],
        formed_because: String::new(),
        node_count: 0,
    }
}

/// A fake OS, a config, a log directory, and a group started from them.
struct Fixture {
    os: Arc<FakeOs>,
    cfg: LaunchConfig,
    guard: Mutex<Guard>,
    logs: tempfile::TempDir,
    inherited: BTreeMap<OsString, OsString>,
    /// Warm interpreters, when the test gives the group some.
    warm: Option<Mutex<WarmPool>>,
}

impl Fixture {
    fn new(nproc: u32) -> Self {
        Self {
            os: Arc::new(FakeOs::new()),
            cfg: config(nproc),
            guard: Mutex::new(Guard::detached()),
            logs: tempfile::tempdir().expect("tempdir"),
            inherited: BTreeMap::new(),
            warm: None,
        }
    }

    /// Starts a group; a failure comes back with the partial group and the error's message.
    fn start(&self, restart_count: u32) -> Result<WorkerGroup, (WorkerGroup, String)> {
        let ctx = self.ctx();
        let plan = plan(&self.cfg, 4);
        block_on(WorkerGroup::start(&ctx, &plan, restart_count))
            .map_err(|(g, e)| (g, e.to_string()))
    }

    /// Starts the warm interpreters for the generation after `restart_count`'s.
    fn refill(&self, restart_count: u32) {
        block_on(crate::warm::refill(
            &self.ctx(),
            &plan(&self.cfg, 4),
            restart_count,
        ));
    }

    fn ctx(&self) -> GroupContext<'_> {
        GroupContext {
            cfg: &self.cfg,
            os: self.os.clone(),
            guard: &self.guard,
            agent_id: "agent",
            hostname: "h",
            inherited: &self.inherited,
            run_log_dir: self.logs.path(),
            agent_sock: None,
            resume_manifest: None,
            ckpt_stage: None,
            resume_staged: None,
            preflight: None,
            warm: self.warm.as_ref(),
        }
    }
}

/// Drives a future that never waits (the fake OS answers at once) to completion.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn pid(n: i32) -> Pid {
    Pid::from_raw(n)
}

fn env_of(call: &Call, key: &str) -> Option<String> {
    match call {
        Call::Spawn { env, .. } => env
            .get(&OsString::from(key))
            .map(|v| v.to_string_lossy().into_owned()),
        _ => None,
    }
}

#[test]
fn start_spawns_every_local_rank_with_its_rank_and_command() {
    let f = Fixture::new(3);
    let g = f.start(0).expect("started");
    let calls = f.os.calls();
    assert_eq!(calls.len(), 3);
    let ranks: Vec<(u32, u32, Pid)> = g
        .workers
        .iter()
        .map(|w| (w.local_rank, w.rank, w.pid))
        .collect();
    assert_eq!(
        ranks,
        [(0, 4, pid(1000)), (1, 5, pid(1001)), (2, 6, pid(1002))]
    );
    assert!(g.workers.iter().all(|w| w.state.is_running()));
    assert_eq!(env_of(&calls[1], "LOCAL_RANK").as_deref(), Some("1"));
    assert_eq!(env_of(&calls[2], "RANK").as_deref(), Some("6"));
    match &calls[0] {
        Call::Spawn { program, args, .. } => {
            assert_eq!(program, "python3");
            assert_eq!(args, &["-u", "t.py"]);
        }
        other => panic!("not a spawn: {other:?}"),
    }
    assert_eq!(g.generation, 3);
}

#[test]
fn the_restart_count_reaches_the_env_and_names_the_attempt_directory() {
    let f = Fixture::new(1);
    f.start(2).expect("started");
    let calls = f.os.calls();
    assert_eq!(
        env_of(&calls[0], "TORCHELASTIC_RESTART_COUNT").as_deref(),
        Some("2")
    );
    assert_eq!(
        env_of(&calls[0], "TORCHELASTIC_MAX_RESTARTS").as_deref(),
        Some("0")
    );
    let error_file = env_of(&calls[0], "TORCHELASTIC_ERROR_FILE").unwrap();
    assert!(
        error_file.ends_with("attempt_2/0/error.json"),
        "{error_file}"
    );
    assert!(f.logs.path().join("attempt_2/0").is_dir());
}

#[test]
fn a_reused_attempt_directory_is_cleared_first() {
    let f = Fixture::new(1);
    let stale = f.logs.path().join("attempt_1/0/stale.log");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, "old").unwrap();
    f.start(1).expect("started");
    assert!(!stale.exists());
}

#[test]
fn a_failed_spawn_returns_the_workers_already_started() {
    let f = Fixture::new(3);
    f.os.fail_spawn(1, io::ErrorKind::PermissionDenied);
    let (partial, e) = f.start(0).expect_err("spawn 1 fails");
    assert_eq!(
        partial.workers.len(),
        1,
        "rank 0 started, rank 2 never tried"
    );
    assert!(
        e.to_string().starts_with("cannot start worker: python3: "),
        "{e}"
    );
    assert_eq!(f.os.calls().len(), 2);
}

#[test]
fn reap_records_workers_and_reports_other_children_as_descendants() {
    let f = Fixture::new(2);
    let mut g = f.start(0).unwrap();
    f.os.exit(pid(1000), ExitKind::Code(0));
    f.os.exit(pid(77), ExitKind::Signal(Signal::SIGKILL));
    let reaped = g.reap();
    assert_eq!(
        reaped,
        [
            (pid(1000), ExitKind::Code(0), true),
            (pid(77), ExitKind::Signal(Signal::SIGKILL), false)
        ]
    );
    assert!(!g.workers[0].state.is_running() && g.workers[1].state.is_running());
    assert!(g.reap().is_empty(), "each exit is reaped once");
    assert!(
        !g.record(pid(1000), ExitKind::Code(1)),
        "an exited worker is not recorded twice"
    );
}

#[test]
fn all_zero_exits_are_success_and_one_non_zero_is_a_failure() {
    let f = Fixture::new(2);
    let mut g = f.start(0).unwrap();
    f.os.exit(pid(1000), ExitKind::Code(0));
    f.os.exit(pid(1001), ExitKind::Code(0));
    g.reap();
    assert!(g.all_succeeded() && !g.has_failure() && !g.any_running());
    let mut g = f.start(1).unwrap();
    f.os.exit(pid(1003), ExitKind::Code(3));
    g.reap();
    assert!(g.has_failure() && !g.all_succeeded());
    let failures = g.failures();
    assert_eq!(failures.len(), 1);
    assert_eq!((failures[0].rank, failures[0].pid), (5, 1003));
    assert_eq!(failures[0].exit.torch_exitcode(), 3);
}

#[test]
fn exits_after_the_group_was_told_to_stop_are_not_failures() {
    let f = Fixture::new(2);
    let mut g = f.start(0).unwrap();
    g.mark_stopping();
    f.os.exit(pid(1000), ExitKind::Signal(Signal::SIGTERM));
    g.reap();
    assert!(!g.has_failure());
    assert!(g.failures().is_empty());
}

#[test]
fn a_partial_success_is_dated_while_others_still_run() {
    let f = Fixture::new(2);
    let mut g = f.start(0).unwrap();
    assert_eq!(g.first_success_at(), None);
    f.os.exit(pid(1000), ExitKind::Code(0));
    g.reap();
    assert!(g.first_success_at().is_some());
    assert_eq!(
        g.partial_success_line(Duration::from_secs(300)),
        "ranks [4] exited 0 but ranks [5] still ran after --peer-exit-wait 300 s"
    );
    f.os.exit(pid(1001), ExitKind::Code(0));
    g.reap();
    assert_eq!(g.first_success_at(), None, "no longer partial: all done");
}

#[test]
fn signals_reach_only_running_workers_process_groups() {
    let f = Fixture::new(3);
    let mut g = f.start(0).unwrap();
    f.os.exit(pid(1001), ExitKind::Code(0));
    g.reap();
    assert_eq!(g.signal_running(Signal::SIGUSR1), 0);
    assert_eq!(
        f.os.killpgs(),
        [(pid(1000), Signal::SIGUSR1), (pid(1002), Signal::SIGUSR1)]
    );
}

#[test]
fn a_stop_continues_the_workers_after_the_signal_so_a_stopped_one_gets_it() {
    let f = Fixture::new(2);
    let g = f.start(0).unwrap();
    assert_eq!(g.stop_running(Signal::SIGTERM), 0);
    assert_eq!(
        f.os.killpgs(),
        [
            (pid(1000), Signal::SIGTERM),
            (pid(1001), Signal::SIGTERM),
            (pid(1000), Signal::SIGCONT),
            (pid(1001), Signal::SIGCONT)
        ]
    );
}

#[test]
fn esrch_counts_as_success_and_other_errors_are_counted() {
    let f = Fixture::new(2);
    let g = f.start(0).unwrap();
    f.os.killpg_fails(pid(1000), Errno::ESRCH);
    assert_eq!(
        g.signal_running(Signal::SIGTERM),
        0,
        "a group already gone is stopped"
    );
    f.os.killpg_fails(pid(1001), Errno::EPERM);
    assert_eq!(g.signal_running(Signal::SIGTERM), 1);
}

#[test]
fn a_restart_hands_off_to_the_warm_interpreters_and_starts_cold_where_one_died() {
    use std::io::Read;
    let mut f = Fixture::new(2);
    let script = f.logs.path().join("train.py");
    std::fs::write(&script, "print(1)\n").expect("script");
    f.cfg.workers.entrypoint.script = script.display().to_string();
    f.cfg.workers.entrypoint.leading = vec!["-u".into(), f.cfg.workers.entrypoint.script.clone()];
    // A restart needs budget: without it no warm interpreter is started (the test below).
    f.cfg.supervision.max_restarts = 1;
    f.warm = Some(Mutex::new(WarmPool::new(&f.cfg, f.os.clone())));
    let first = f.start(0).expect("started");
    f.refill(0);
    let calls = f.os.calls();
    assert_eq!(calls.len(), 4, "2 workers, then 2 warm interpreters");
    for (i, c) in calls.iter().enumerate() {
        let Call::Spawn { args, handoff, .. } = c else {
            panic!("spawn expected: {c:?}")
        };
        assert_eq!(
            *handoff,
            i >= 2,
            "only the warm interpreters get a hand-off socket"
        );
        assert_eq!(args[..2] == ["-u", "-c"], i >= 2, "{args:?}");
    }
    assert_eq!(env_of(&calls[2], "DRUN_WARM_FD").as_deref(), Some("3"));
    let warm: Vec<Pid> = first
        .workers
        .iter()
        .map(|w| Pid::from_raw(w.pid.as_raw() + 2))
        .collect();
    // Local rank 1's interpreter died before the restart: that rank starts cold.
    f.warm
        .as_ref()
        .expect("pool")
        .lock()
        .expect("pool")
        .exited(warm[1], ExitKind::Signal(Signal::SIGKILL));
    let second = f.start(1).expect("restarted");
    assert_eq!(
        second.workers[0].pid, warm[0],
        "rank 0 is its warm interpreter"
    );
    assert_eq!(second.workers[1].pid, pid(1004), "rank 1 is a new process");
    assert_eq!(
        f.os.calls().len(),
        6,
        "one cold spawn, one SIGKILL of the dead interpreter"
    );
    let mut line = String::new();
    std::os::unix::net::UnixStream::from(f.os.take_handoff(warm[0]).expect("hand-off socket"))
        .read_to_string(&mut line)
        .expect("hand-off");
    let msg: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let env: BTreeMap<String, String> = msg["env"]
        .as_array()
        .expect("env pairs")
        .iter()
        .map(|kv| {
            (
                kv[0].as_str().unwrap().into(),
                kv[1].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(env["TORCHELASTIC_RESTART_COUNT"], "1");
    assert_eq!(env["LOCAL_RANK"], "0");
    assert!(!env.contains_key("DRUN_WARM_FD"));
    assert_eq!(msg["argv"][0], f.cfg.workers.entrypoint.script.as_str());
}

#[test]
fn one_node_starts_no_warm_interpreter_for_a_generation_that_cannot_come() {
    let mut f = Fixture::new(2);
    let script = f.logs.path().join("train.py");
    std::fs::write(&script, "print(1)\n").expect("script");
    f.cfg.workers.entrypoint.script = script.display().to_string();
    f.cfg.workers.entrypoint.leading = vec!["-u".into(), f.cfg.workers.entrypoint.script.clone()];
    // One node (the in-process rendezvous) and the default --max-restarts 0: the first
    // generation is the last.
    f.warm = Some(Mutex::new(WarmPool::new(&f.cfg, f.os.clone())));
    f.start(0).expect("started");
    f.refill(0);
    assert_eq!(f.os.calls().len(), 2, "2 workers and no warm interpreter");
    // With one restart: warm interpreters for the second generation, none after it.
    f.cfg.supervision.max_restarts = 1;
    f.refill(0);
    assert_eq!(f.os.calls().len(), 4, "2 warm interpreters for the restart");
    let mut g = Fixture::new(2);
    g.cfg = f.cfg.clone();
    g.warm = Some(Mutex::new(WarmPool::new(&g.cfg, g.os.clone())));
    g.start(1).expect("restarted");
    g.refill(1);
    assert_eq!(
        g.os.calls().len(),
        2,
        "the restart used the budget: none for a third"
    );
}
