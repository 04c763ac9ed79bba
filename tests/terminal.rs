//! What workers get from drun's terminal: stdin (`/dev/null` unless `--stdin-rank`), and a
//! hang-up under `nohup` (SIGHUP ignored at start stays ignored).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::harness::{clean_env, drun, drun_bin, run, wait_for, worker, Agent};

/// `drun --standalone --nproc-per-node 2 terminal.py stdin` with a pseudo-terminal as stdin;
/// returns (exit code, stdout) and what was typed.
fn with_pty(extra: &[&str], typed: Option<&[u8]>) -> (i32, String) {
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .args(extra)
        .arg(worker("terminal.py"))
        .arg("stdin")
        .stdin(Stdio::from(pty.slave.try_clone().unwrap()));
    let agent = Agent::start(c);
    let mut master = std::fs::File::from(pty.master);
    if let Some(text) = typed {
        // Typed at the terminal once the rank reading it is up (its line is buffered until then).
        master.write_all(text).unwrap();
    }
    let (code, out, err) = agent.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    drop(pty.slave);
    (code, out)
}

#[test]
fn a_worker_reading_stdin_at_a_terminal_gets_end_of_file() {
    let (_, out) = with_pty(&[], None);
    assert!(out.contains("[rank0]:rank0 read=''"), "{out}");
    assert!(out.contains("[rank1]:rank1 read=''"), "{out}");
}

#[test]
fn stdin_rank_reads_the_line_typed_at_the_terminal() {
    let (_, out) = with_pty(&["--stdin-rank", "0"], Some(b"hello drun\n"));
    assert!(out.contains("[rank0]:rank0 read='hello drun\\n'"), "{out}");
    assert!(out.contains("[rank1]:rank1 read=''"), "{out}");
}

#[test]
fn stdin_rank_outside_the_local_ranks_is_a_usage_error() {
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2", "--stdin-rank", "2"])
        .arg(worker("terminal.py"))
        .arg("stdin");
    let (code, _, err) = run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--stdin-rank") && err.contains("0..1"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

fn ready_pid(dir: &Path, rank: u32) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("ready{rank}")))
        .ok()?
        .parse()
        .ok()
}

#[test]
fn under_nohup_a_hang_up_leaves_the_run_going() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = clean_env(Command::new("nohup"));
    c.arg(drun_bin())
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(worker("terminal.py"))
        .arg("hup")
        .arg(dir.path())
        .stdin(Stdio::null())
        .process_group(0);
    let agent = Agent::start(c);
    wait_for("both workers ready", Duration::from_secs(30), || {
        ready_pid(dir.path(), 0).is_some() && ready_pid(dir.path(), 1).is_some()
    });
    // A terminal hang-up: SIGHUP to drun's process group and, for good measure, to each worker.
    killpg(Pid::from_raw(agent.pid()), Signal::SIGHUP).unwrap();
    for r in 0..2 {
        let _ = kill(
            Pid::from_raw(ready_pid(dir.path(), r).unwrap()),
            Signal::SIGHUP,
        );
    }
    std::fs::write(dir.path().join("go"), "").unwrap();
    let (code, out, err) = agent.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank{r} sighup_ignored=True")),
            "{out}"
        );
        assert!(
            out.contains(&format!("rank{r} still here after the hang-up")),
            "{out}"
        );
    }
}

/// The state letter of process `pid` (`/proc/<pid>/stat`: R, S, T for stopped, ...).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn ctrl_z_stops_the_workers_with_the_agent_and_fg_resumes_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .arg(worker("terminal.py"))
        .arg("hup")
        .arg(dir.path())
        .process_group(0);
    let agent = Agent::start(c);
    wait_for("both workers ready", Duration::from_secs(30), || {
        ready_pid(dir.path(), 0).is_some() && ready_pid(dir.path(), 1).is_some()
    });
    let workers: Vec<i32> = (0..2).map(|r| ready_pid(dir.path(), r).unwrap()).collect();
    let group = Pid::from_raw(agent.pid());
    // Ctrl-Z: the terminal sends SIGTSTP to the foreground process group (the agent's; the
    // workers run in sessions of their own).
    killpg(group, Signal::SIGTSTP).unwrap();
    wait_for("workers and agent stopped", Duration::from_secs(10), || {
        workers.iter().all(|&p| proc_state(p) == Some('T')) && proc_state(agent.pid()) == Some('T')
    });
    // fg: the shell sends SIGCONT to the job's process group.
    killpg(group, Signal::SIGCONT).unwrap();
    wait_for("workers running again", Duration::from_secs(10), || {
        workers
            .iter()
            .all(|&p| proc_state(p).is_some_and(|s| s != 'T'))
    });
    std::fs::write(dir.path().join("go"), "").unwrap();
    let (code, out, err) = agent.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("suspended (SIGTSTP)") || out.contains("suspended (SIGTSTP)"),
        "{err}"
    );
    for r in 0..2 {
        assert!(out.contains(&format!("rank{r} still here")), "{out}");
    }
}
