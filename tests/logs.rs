//! Worker output: whole prefixed lines, log files, --redirects, --tee, --local-ranks-filter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{drun, run, worker};

const LINES: usize = 200;

/// Checks that every `kind` line ("out"/"err") in `text` is whole and carries the right prefix.
///
/// A worker starved between the two halves of a line for longer than the idle flush
/// (`logs::IDLE_FLUSH`, 100 ms: a loaded machine) has its first half shown as it is; when
/// another rank writes meanwhile, the rest comes on a later line with the same prefix. Such a
/// rest is put back after its head, so what is checked is that no byte is lost or lands under
/// another rank's prefix.
fn assert_whole_lines(text: &str, kind: &str, ranks: &[u32], prefix: impl Fn(u32) -> String) {
    for r in ranks {
        let p = prefix(*r);
        let head = format!("{kind} rank=");
        let mut body: Vec<String> = Vec::new();
        for b in text
            .lines()
            .filter_map(|l| l.strip_prefix(p.as_str()))
            .filter(|b| !b.starts_with("tail-without-newline"))
        {
            match body.last_mut() {
                Some(last) if !b.starts_with(&head) && last.len() < 290 => last.push_str(b),
                _ if b.starts_with(&head) => body.push(b.to_string()),
                _ => panic!("rank {r}: a piece of a {kind} line with no head before it: {b:?}"),
            }
        }
        assert_eq!(
            body.len(),
            LINES,
            "rank {r}: {LINES} whole {kind} lines expected"
        );
        for (i, b) in body.iter().enumerate() {
            assert!(
                b.starts_with(&format!("{kind} rank={r} i={i} ")),
                "rank {r} line {i}: {b:?}"
            );
            assert!(
                b.len() >= 290 && b.trim_end().ends_with('x'),
                "torn line: {b:?}"
            );
        }
    }
    for l in text.lines() {
        assert!(
            ranks.iter().any(|r| l.starts_with(&prefix(*r))) || !l.contains(" rank="),
            "unprefixed worker line {l:?}"
        );
    }
}

fn attempt_dir(log_dir: &Path) -> PathBuf {
    let run_dir = std::fs::read_dir(log_dir)
        .unwrap()
        .next()
        .expect("run dir")
        .unwrap()
        .path();
    run_dir.join("attempt_0")
}

#[test]
fn lines_are_prefixed_whole_and_partial_tails_flushed() {
    let mut c = drun();
    c.args(["--standalone", "--nproc-per-node", "2"])
        .arg(worker("printer.py"))
        .arg(LINES.to_string());
    let (code, out, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert_whole_lines(&out, "out", &[0, 1], |r| format!("[rank{r}]:"));
    assert_whole_lines(&err, "err", &[0, 1], |r| format!("[rank{r}]:"));
    for r in 0..2 {
        assert!(
            out.contains(&format!("[rank{r}]:tail-without-newline rank={r}\n")),
            "{out}"
        );
    }
}

#[test]
fn tee_writes_files_and_console_with_custom_prefix() {
    let logs = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--tee",
        "3",
        "--role",
        "trainer",
    ])
    .arg("--log-dir")
    .arg(logs.path())
    .args(["--log-line-prefix-template", "[${role_name}${local_rank}]:"])
    .arg(worker("printer.py"))
    .arg(LINES.to_string());
    let (code, out, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert_whole_lines(&out, "out", &[0, 1], |r| format!("[trainer{r}]:"));
    let attempt = attempt_dir(logs.path());
    for r in 0..2 {
        let file = std::fs::read_to_string(attempt.join(format!("{r}/stdout.log"))).unwrap();
        assert_whole_lines(&file, "out", &[r], |_| String::new());
        assert!(
            file.ends_with(&format!("tail-without-newline rank={r}")),
            "log files keep the worker's exact bytes (no newline added)"
        );
        let errf = std::fs::read_to_string(attempt.join(format!("{r}/stderr.log"))).unwrap();
        assert_eq!(errf.lines().count(), LINES);
    }
}

#[test]
fn redirects_keep_stdout_off_the_console_and_filter_limits_console_ranks() {
    let logs = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--redirects",
        "1",
        "--local-ranks-filter",
        "1",
    ])
    .arg("--log-dir")
    .arg(logs.path())
    .arg(worker("printer.py"))
    .arg(LINES.to_string());
    let (code, out, err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("out rank="),
        "stdout redirected to files only: {out}"
    );
    assert!(
        err.contains("[rank1]:err rank=1"),
        "rank 1 stderr on console"
    );
    assert!(
        !err.contains("[rank0]:"),
        "rank 0 filtered from the console"
    );
    let attempt = attempt_dir(logs.path());
    for r in 0..2 {
        let file = std::fs::read_to_string(attempt.join(format!("{r}/stdout.log"))).unwrap();
        assert_eq!(
            file.lines().filter(|l| l.starts_with("out rank=")).count(),
            LINES,
            "files keep every rank"
        );
        assert!(
            !attempt.join(format!("{r}/stderr.log")).exists(),
            "stderr not redirected"
        );
    }
}

#[test]
fn a_partial_line_is_shown_while_the_worker_waits() {
    // A prompt without a newline (think `(Pdb) ` or a `\r` progress bar) must reach the console
    // while the worker is still waiting, not only when the line ends.
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let mut c = drun();
    c.args(["--standalone", "--no-python", "sh", "-c"])
        .arg("printf 'prompt> '; while [ ! -e \"$0\" ]; do sleep 0.05; done; echo answered")
        .arg(&release);
    let agent = crate::harness::Agent::start(c);
    crate::harness::wait_for(
        "the partial prompt on the console",
        Duration::from_secs(10),
        || agent.stdout_so_far().contains("[rank0]:prompt> "),
    );
    std::fs::write(&release, b"").unwrap();
    let (code, out, err) = agent.wait(Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("[rank0]:prompt> answered\n"),
        "the rest follows without a second prefix: {out:?}"
    );
}

#[test]
fn another_ranks_lines_never_land_inside_an_open_partial_line() {
    // Rank 0 shows "loading model... " and waits; rank 1 then prints whole lines. They must
    // not continue rank 0's line on screen, and rank 0's "done" comes with its prefix again.
    let dir = tempfile::tempdir().unwrap();
    let (speak, finish) = (dir.path().join("speak"), dir.path().join("finish"));
    let mut c = drun();
    c.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--no-python",
        "sh",
        "-c",
    ])
    .arg(
        r#"if [ "$RANK" = 0 ]; then printf 'loading model... '; f="$1"; else echo ready; f="$0"; fi
while [ ! -e "$f" ]; do sleep 0.05; done
if [ "$RANK" = 0 ]; then echo done; else echo 'rank1 a'; echo 'rank1 b'; fi"#,
    )
    .arg(&speak)
    .arg(&finish);
    let agent = crate::harness::Agent::start(c);
    crate::harness::wait_for(
        "rank 0's partial line and rank 1's first line",
        Duration::from_secs(20),
        || {
            let out = agent.stdout_so_far();
            out.contains("[rank0]:loading model... ") && out.contains("[rank1]:ready")
        },
    );
    std::fs::write(&speak, b"").unwrap();
    crate::harness::wait_for("rank 1's lines", Duration::from_secs(20), || {
        agent.stdout_so_far().contains("[rank1]:rank1 b\n")
    });
    std::fs::write(&finish, b"").unwrap();
    let (code, out, err) = agent.wait(Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    for want in [
        "[rank0]:loading model... ",
        "[rank1]:rank1 a",
        "[rank1]:rank1 b",
        "[rank0]:done",
    ] {
        assert!(
            lines.contains(&want),
            "{want:?} is a line of its own: {out:?}"
        );
    }
    assert!(
        lines.iter().all(|l| l.matches("[rank").count() == 1),
        "one rank per line: {out:?}"
    );
}

#[test]
fn empty_prefix_template_prints_bare_lines() {
    let mut c = drun();
    c.args([
        "--standalone",
        "--log-line-prefix-template",
        "",
        "--no-python",
        "echo",
        "{\"json\": 1}",
    ]);
    let (code, out, err) = run(c, Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "{\"json\": 1}\n");
}

#[test]
fn without_log_dir_nothing_is_left_in_the_temp_dir() {
    let worker_args = |ok: bool| -> Vec<String> {
        if ok {
            vec!["--no-python".into(), "true".into()]
        } else {
            vec![worker("exit_code.py"), "3".into(), "1".into()]
        }
    };
    for ok in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = drun();
        c.env("TMPDIR", tmp.path())
            .args(["--standalone", "--nproc-per-node", "2"])
            .args(worker_args(ok));
        let (exit, _, err) = run(c, Duration::from_secs(60));
        assert_eq!(exit, if ok { 0 } else { 1 }, "{err}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
        assert!(left.is_empty(), "success={ok}: left behind {left:?}\n{err}");
        assert!(!err.contains("worker logs and error files"), "{err}");
    }
}

#[test]
fn a_sigkilled_agent_leaves_no_scratch_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let ready = tmp.path().join("ready");
    let mut c = drun();
    c.env("TMPDIR", tmp.path())
        .args([
            "--standalone",
            "--nproc-per-node",
            "1",
            "--no-python",
            "sh",
            "-c",
        ])
        .arg("touch \"$0\"; sleep 60")
        .arg(&ready);
    let agent = crate::harness::Agent::start(c);
    crate::harness::wait_for("the worker started", Duration::from_secs(30), || {
        ready.exists()
    });
    std::fs::remove_file(&ready).unwrap();
    agent.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = agent.wait(Duration::from_secs(10));
    crate::harness::wait_for(
        "the guard to remove the scratch log directory",
        Duration::from_secs(10),
        || std::fs::read_dir(tmp.path()).unwrap().next().is_none(),
    );
}
