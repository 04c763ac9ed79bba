//! Warm workers (`--warm-workers`): a restarted worker on a pre-started interpreter sees what a
//! cold one sees, reaches its first all_reduce much sooner, and nothing is left running.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::harness::cluster::RdzvServer;
use crate::harness::{
    drun, processes_of_run, read_json, run, stop_all, torch_python, wait_for, worker, Agent,
    DrunCmd,
};

/// What differs between two generations by design: the restart count, the generation, the new
/// MASTER_PORT of each formation, the attempt directory of the error file.
const DIFFER_BY_GENERATION: &[&str] = &[
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE",
    "DRUN_GENERATION",
    "DRUN_RESTARTS_FAILURES",
    "MASTER_PORT",
];

/// One run of `warm_dump.py` under `--standalone --nproc-per-node 2 --max-restarts 1`, whose
/// first attempt fails once the test says go (with warm workers, once both warm interpreters
/// are ready): its exit code, stderr (`-v`) and the records of attempts 0 and 1 by rank.
struct Restart {
    code: i32,
    err: String,
    attempts: [BTreeMap<u32, Value>; 2],
}

fn restart(python: &Path, dir: &Path, warm: &str, fail_warm: bool) -> Restart {
    let mut c = drun();
    c.python(python)
        .args([
            "-v",
            "--standalone",
            "--max-restarts",
            "1",
            "--warm-workers",
            warm,
        ])
        .nproc(2)
        .arg(worker("warm_dump.py"))
        .arg(dir);
    if fail_warm {
        c.arg("--fail-warm");
    }
    let agent = Agent::start(c);
    let record = |a: u32, r: u32| dir.join(format!("attempt{a}_rank{r}.json"));
    wait_for("attempt 0's records", Duration::from_secs(180), || {
        record(0, 0).is_file() && record(0, 1).is_file()
    });
    if warm == "on" {
        // The first generation's two were handed off (ready or still importing); the restart
        // starts on the two started after them.
        wait_for(
            "the restart's warm interpreters ready",
            Duration::from_secs(180),
            || {
                let err = agent.stderr_so_far();
                let pid = |l: &str| {
                    let p = l.split("pid=").nth(1)?;
                    p.split_whitespace().next().map(str::to_string)
                };
                let started: Vec<String> = err
                    .lines()
                    .filter(|l| l.contains("warm interpreter started"))
                    .filter_map(pid)
                    .collect();
                started.len() == 4
                    && started[2..].iter().all(|p| {
                        err.lines().any(|l| {
                            l.contains("warm interpreter ready") && l.contains(&format!("pid={p} "))
                        })
                    })
            },
        );
    }
    std::fs::write(dir.join("go"), "").unwrap();
    let (code, _, err) = agent.wait(Duration::from_secs(180));
    let by_rank = |a: u32| -> BTreeMap<u32, Value> {
        (0..2)
            .filter(|r| record(a, *r).is_file())
            .map(|r| (r, read_json(&record(a, r))))
            .collect()
    };
    let attempts = [by_rank(0), by_rank(1)];
    assert_eq!(attempts[1].len(), 2, "both ranks ran attempt 1:\n{err}");
    // Nothing of the run is left: workers and warm interpreters alike.
    let run_id = attempts[0][&0]["env"]["DRUN_RUN_ID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(processes_of_run(&run_id), Vec::<i32>::new(), "left running");
    Restart {
        code,
        err,
        attempts,
    }
}

/// Seconds since the epoch of an agent log line's RFC 3339 UTC timestamp
/// (`2026-12-04T20:11:20.553253Z ...`).
fn log_time(line: &str) -> f64 {
    let ts = line.split_whitespace().next().unwrap();
    let (date, time) = ts.trim_end_matches('Z').split_once('T').unwrap();
    let d: Vec<i64> = date.split('-').map(|x| x.parse().unwrap()).collect();
    let t: Vec<f64> = time.split(':').map(|x| x.parse().unwrap()).collect();
    // Days from 1970-01-01 to the date (proleptic Gregorian; H. Hinnant's days_from_civil).
    let y = if d[1] <= 2 { d[0] - 1 } else { d[0] };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (d[1] + if d[1] > 2 { -3 } else { 9 }) + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    days as f64 * 86400.0 + t[0] * 3600.0 + t[1] * 60.0 + t[2]
}

/// When the agent started attempt 1's last worker (its "worker started" debug line), and
/// when it reaped the first failed worker of attempt 0.
fn agent_times(err: &str) -> (f64, f64) {
    let started = err
        .lines()
        .filter(|l| l.contains("worker started"))
        .map(log_time)
        .collect::<Vec<_>>();
    let failed = err
        .lines()
        .find(|l| l.contains("worker exited") && l.contains("exit=Code(1)"))
        .map(log_time)
        .unwrap();
    (
        started[2..]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max),
        failed,
    )
}

/// Milliseconds from the agent starting attempt 1 (and from it reaping the failure) to the
/// last rank of attempt 1 reaching `key`.
fn restart_ms(r: &Restart, key: &str) -> (f64, f64) {
    let last = r.attempts[1]
        .values()
        .map(|v| v[key].as_f64().unwrap())
        .fold(f64::NEG_INFINITY, f64::max);
    let (started, failed) = agent_times(&r.err);
    ((last - started) * 1e3, (last - failed) * 1e3)
}

fn report(what: &str, r: &Restart) -> f64 {
    let (line, line_f) = restart_ms(r, "first_line");
    let (reduce, reduce_f) = restart_ms(r, "first_all_reduce");
    eprintln!(
        "{what} restart: first line {line:.0} ms, first all_reduce {reduce:.0} ms after the \
         agent started the workers ({line_f:.0} / {reduce_f:.0} ms after it reaped the failure)"
    );
    reduce
}

#[test]
fn log_times_are_seconds_since_the_epoch() {
    assert_eq!(log_time("1970-01-01T00:00:01.5Z x"), 1.5);
    assert_eq!(log_time("2000-03-01T00:00:00Z"), 951868800.0);
}

fn without(v: &Value, keys: &[&str]) -> Value {
    let mut v = v.clone();
    let o = v.as_object_mut().unwrap();
    for k in [
        "first_line",
        "first_all_reduce",
        "failed_at",
        "sum",
        "cmdline",
    ] {
        o.remove(k);
    }
    let env = o.get_mut("env").unwrap().as_object_mut().unwrap();
    for k in keys {
        env.remove(*k);
    }
    v
}

/// What differs between two runs by design: who they are (run and agent ids, the agent's
/// socket and log directory), and the port each formation picks.
const DIFFER_BY_RUN: &[&str] = &[
    "DRUN_RUN_ID",
    "TORCHELASTIC_RUN_ID",
    "DRUN_AGENT_ID",
    "DRUN_AGENT_SOCK",
    "TORCHELASTIC_ERROR_FILE",
    "MASTER_PORT",
];

#[test]
fn warm_workers_look_cold_to_the_script_from_the_first_generation_on_and_restart_within_a_second() {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    // The same run twice in the same directory (the script's argv is the same): every worker
    // cold, then every worker warm, the first generation's too (started before the rendezvous).
    let cold = restart(&python, dir.path(), "off", true);
    std::fs::remove_dir_all(dir.path()).unwrap();
    std::fs::create_dir(dir.path()).unwrap();
    let r = restart(&python, dir.path(), "on", true);
    assert_eq!(
        cold.code, 1,
        "the second attempt fails on purpose:\n{}",
        cold.err
    );
    assert_eq!(r.code, 1, "the second attempt fails on purpose:\n{}", r.err);
    assert_eq!(cold.err.matches("warm=false").count(), 4, "{}", cold.err);
    assert!(!cold.err.contains("warm interpreter"), "{}", cold.err);
    assert!(
        cold.err
            .contains("warm workers off: --warm-workers off; restarted workers start cold"),
        "{}",
        cold.err
    );
    assert_eq!(r.err.matches("warm=true").count(), 4, "{}", r.err);
    assert_eq!(r.err.matches("warm=false").count(), 0, "{}", r.err);
    for attempt in 0..2 {
        for rank in 0..2 {
            let (c, w) = (&cold.attempts[attempt][&rank], &r.attempts[attempt][&rank]);
            assert_eq!(
                without(c, DIFFER_BY_RUN),
                without(w, DIFFER_BY_RUN),
                "attempt {attempt}, rank {rank}: what the script sees, cold (left) and warm (right)"
            );
            assert_eq!(w["name"], "__main__");
            assert_eq!(w["torchelastic_launched"], true);
            assert_eq!(
                w["torch_threads"], 1,
                "OMP_NUM_THREADS=1 with 2 local workers"
            );
            assert_eq!(w["env"]["TORCHELASTIC_RESTART_COUNT"], attempt.to_string());
            assert!(w["env"].get("DRUN_WARM_FD").is_none());
            assert!(w["env"].get("DRUN_WARM_BOOTSTRAP").is_none());
            // `ps` and `pgrep -f warm_dump.py` find a warm worker as a cold one: its script
            // and arguments, after a one-line `-c` stub, not the bootstrap's source.
            let cmdline = |v: &Value| -> Vec<String> {
                serde_json::from_value(v["cmdline"].clone()).unwrap()
            };
            let (shown, cold_shown) = (cmdline(w), cmdline(c));
            assert!(
                shown.len() == cold_shown.len() + 2
                    && shown[..2] == cold_shown[..2]
                    && shown[2] == "-c"
                    && shown[4..] == cold_shown[2..],
                "warm {shown:?}, cold {cold_shown:?}"
            );
            assert!(
                shown
                    .iter()
                    .all(|a| !a.contains("_drun_warm") && a.len() < 200),
                "{shown:?}"
            );
        }
    }
    for rank in 0..2 {
        let (first, second) = (&r.attempts[0][&rank], &r.attempts[1][&rank]);
        for k in DIFFER_BY_GENERATION {
            assert_ne!(
                first["env"][k], second["env"][k],
                "{k} differs by generation"
            );
        }
    }
    // torch's @record wrote the warm worker's error file; the summary shows its message.
    assert!(
        r.err
            .contains("RuntimeError: warm attempt fails on purpose"),
        "{}",
        r.err
    );
    assert!(r.err.contains("error_file: /"), "{}", r.err);
    report("cold", &cold);
    let all_reduce = report("warm", &r);
    // Cold, `import torch` alone takes ~2 s on the test machines.
    assert!(
        all_reduce < 1000.0,
        "{all_reduce:.0} ms to the first all_reduce"
    );
}

#[test]
fn a_non_python_entrypoint_restarts_cold_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("once.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 1\nexit 0\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = drun();
    c.args(["--standalone", "--max-restarts", "1", "--no-python"])
        .nproc(2)
        .arg(&script);
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        err.matches("warm workers off: --no-python runs an executable, not a Python script; restarted workers start cold").count(),
        1,
        "{err}"
    );
}

#[test]
fn a_script_that_sets_a_variable_before_it_imports_torch_gets_it_as_under_torchrun() {
    let Some(python) = torch_python() else { return };
    // torch reads OMP_NUM_THREADS at import: an interpreter that imported it already would
    // keep the agent's 1 thread (a user's script, found in a trial).
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("threads.py");
    std::fs::write(
        &script,
        "import os\nos.environ['OMP_NUM_THREADS'] = '2'\nimport torch\n\
         n = os.environ['TORCHELASTIC_RESTART_COUNT']\n\
         print('threads', torch.get_num_threads(), 'restart', n, flush=True)\n\
         raise SystemExit(1 if n == '0' and os.environ['LOCAL_RANK'] == '0' else 0)\n",
    )
    .unwrap();
    // What a cold interpreter makes of it on this machine (torch caps it at its cores).
    let cold = std::process::Command::new(&python)
        .args(["-c", "import torch; print(torch.get_num_threads())"])
        .env("OMP_NUM_THREADS", "2")
        .output()
        .unwrap();
    let threads = String::from_utf8_lossy(&cold.stdout).trim().to_string();
    if threads == "1" {
        eprintln!("skipped: one core, where 2 threads and the agent's 1 look alike");
        return;
    }
    let mut c = drun();
    c.python(&python)
        .args(["--standalone", "--max-restarts", "1"])
        .nproc(2)
        .arg(&script);
    let (code, out, err) = run(c, Duration::from_secs(120));
    assert_eq!(code, 0, "{err}");
    for restart in 0..2 {
        assert_eq!(
            out.matches(&format!("threads {threads} restart {restart}"))
                .count(),
            2,
            "both ranks of attempt {restart} have {threads} threads:\n{out}\n{err}"
        );
    }
    assert_eq!(
        err.matches("warm workers off: the script sets an environment variable on line 2 before it imports torch").count(),
        1,
        "{err}"
    );
}

#[test]
fn a_keyboard_interrupt_in_a_warm_worker_reads_as_in_a_cold_one() {
    let Some(python) = torch_python() else { return };
    // A trial's finding: the traceback began with three frames of the warm stub.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("interrupted.py");
    std::fs::write(
        &script,
        "import atexit\nimport torch\n\
         atexit.register(lambda: print('exit handlers ran', flush=True))\n\
         def stop():\n    raise KeyboardInterrupt('stop')\n\
         stop()\n",
    )
    .unwrap();
    let mut c = drun();
    c.python(&python)
        .args(["-v", "--standalone"])
        .nproc(1)
        .arg(&script);
    let (code, out, err) = run(c, Duration::from_secs(120));
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("warm=true").count(), 1, "{err}");
    let both = format!("{out}{err}");
    let frames: Vec<&str> = both
        .lines()
        .filter(|l| l.starts_with("[rank0]:") && l.contains("File \""))
        .collect();
    let path = script.display().to_string();
    assert_eq!(
        frames.len(),
        2,
        "the script's two frames only (the worker's own output):\n{both}"
    );
    assert!(
        frames
            .iter()
            .all(|f| f.contains(&format!("File \"{path}\""))),
        "{both}"
    );
    assert!(both.contains("KeyboardInterrupt: stop"), "{both}");
    assert!(both.contains("exit handlers ran"), "{both}");
    assert!(err.contains("SIGINT"), "it died by SIGINT:\n{err}");
    assert!(err.contains("uncaught KeyboardInterrupt"), "{err}");
}

#[test]
fn a_worker_interpreter_without_torch_still_restarts() {
    // The stdlib workers' python3 has no torch here (CI's may): the warm interpreter either
    // says so before the restart (cold start) or execs the cold command at its hand-off.
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["-v", "--standalone", "--max-restarts", "1"])
        .nproc(2)
        .arg(worker("flaky.py"))
        .arg(dir.path());
    let (code, _, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    for r in 0..2 {
        let a = read_json(&dir.path().join(format!("attempt1_rank{r}")));
        assert_eq!(a["TORCHELASTIC_RESTART_COUNT"], "1", "{err}");
    }
}

/// Rank 0's steps in `paced_steps.py`'s log: (unix time, world size).
fn steps(dir: &Path) -> Vec<(f64, u32)> {
    std::fs::read_to_string(dir.join("steps_rank0.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .collect()
}

/// A newcomer to a running torch job joins once its warm interpreters imported torch: the
/// world of 2 trains on while the newcomer imports, and the pause of the re-form that admits
/// it (the world of 2's last step to the world of 3's first) is shorter than that import.
#[test]
fn a_newcomer_joins_ready_to_train_so_the_running_world_pauses_less_than_its_import() {
    let Some(python) = torch_python() else { return };
    let server = RdzvServer::start(&["--store", "memory"]);
    let dir = tempfile::tempdir().unwrap();
    let start = |i: usize| {
        let mut c = drun();
        c.arg("-v")
            .job("newcomer", "2:3")
            .nproc(1)
            .node(i)
            .quick_shutdown()
            .python(&python)
            .args(["--rdzv-endpoint", &server.endpoint])
            .arg(worker("paced_steps.py"))
            .arg(dir.path());
        Agent::start(c)
    };
    let mut agents: Vec<Agent> = (0..2).map(start).collect();
    wait_for("the world of 2 training", Duration::from_secs(180), || {
        steps(dir.path()).iter().any(|(_, w)| *w == 2)
    });
    agents.push(start(2));
    wait_for("the world of 3 training", Duration::from_secs(180), || {
        steps(dir.path()).iter().any(|(_, w)| *w == 3)
    });
    let all = steps(dir.path());
    let last2 = all
        .iter()
        .filter(|(_, w)| *w == 2)
        .map(|(t, _)| *t)
        .fold(f64::NEG_INFINITY, f64::max);
    let first3 = all
        .iter()
        .filter(|(_, w)| *w == 3)
        .map(|(t, _)| *t)
        .fold(f64::INFINITY, f64::min);
    let newcomer = agents[2].stderr_so_far();
    let import_ms: f64 = newcomer
        .lines()
        .find(|l| l.contains("warm interpreter ready"))
        .and_then(|l| l.split("import_ms=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("the newcomer's interpreter imported torch:\n{newcomer}"));
    let pause_ms = (first3 - last2) * 1e3;
    eprintln!(
        "the newcomer imported torch in {import_ms:.0} ms; the training paused {pause_ms:.0} ms"
    );
    assert!(
        newcomer.contains("warm=true"),
        "the newcomer's worker started on its warm interpreter:\n{newcomer}"
    );
    assert!(
        pause_ms < import_ms,
        "the training paused {pause_ms:.0} ms, the newcomer's import took {import_ms:.0} ms:\n{newcomer}"
    );
    stop_all(agents);
}
