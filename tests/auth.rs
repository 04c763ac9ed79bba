//! Token authentication of the rendezvous (issue 15): real `drun-rendezvous` servers with
//! `--token-file`, real agents and `status` clients. A missing or wrong token is refused on the
//! Session stream and the Status RPC with one clear line and exit 3, and the store is left as it
//! was; run-scoped tokens keep two runs on one server apart; the token shows nowhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::harness::cluster::{rendezvous_bin, RdzvServer};
use crate::harness::{node_cmd, run, wait_for, worker, Agent};

const TOKEN_A: &str = "tokA-7f3c9a1e5b";
const TOKEN_B: &str = "tokB-2d8e6f0a4c";

/// A token file `name` in `dir` holding `text`.
fn token_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// How a client is given its token.
#[derive(Clone, Copy)]
enum Tok<'a> {
    None,
    Env(&'a str),
    File(&'a Path),
}

fn with_token(c: &mut Command, tok: Tok<'_>) {
    c.env_remove("DRUN_RDZV_TOKEN")
        .env_remove("DRUN_RDZV_TOKEN_FILE");
    match tok {
        Tok::None => {}
        Tok::Env(t) => {
            c.env("DRUN_RDZV_TOKEN", t);
        }
        Tok::File(f) => {
            c.arg("--rdzv-token-file").arg(f);
        }
    }
}

/// A one-node agent of `run` on `server` (2 workers of `script args`), with `tok`.
fn agent(server: &RdzvServer, run: &str, tok: Tok<'_>, script: &str, args: &[&Path]) -> Command {
    let rdzv = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
        "--rdzv-conf",
        "join_timeout=30",
    ];
    let mut c = node_cmd(0, run, "1", &rdzv);
    c.args(["--shutdown-timeout", "3"]);
    with_token(&mut c, tok);
    c.arg(worker(script));
    for a in args {
        c.arg(a);
    }
    c
}

/// `drun-rendezvous status RUN --json --endpoint E` with `tok`: (exit code, stdout, stderr).
fn status(server: &RdzvServer, run: &str, tok: Tok<'_>) -> (i32, String, String) {
    let mut c = Command::new(rendezvous_bin());
    c.args(["status", run, "--json", "--endpoint", &server.endpoint]);
    with_token(&mut c, tok);
    let o = c.output().expect("run drun-rendezvous status");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The lines of `text` that are drun errors.
fn error_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains("error:")).collect()
}

#[test]
fn missing_and_wrong_tokens_are_refused_for_session_and_status_and_the_store_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), "tokens", &format!("runA {TOKEN_A}\n"));
    let log = dir.path().join("server.log");
    let server = RdzvServer::start_logging(
        &[
            "--store",
            "memory",
            "--token-file",
            tokens.to_str().unwrap(),
        ],
        "info",
        &log,
    );
    let out = dir.path().join("out");
    for (tok, why) in [
        (Tok::None, "requires a token and none was sent"),
        (Tok::Env("not-the-token"), "the token sent is not accepted"),
    ] {
        let (code, _, err) = run(
            agent(&server, "runA", tok, "envdump.py", &[&out]),
            Duration::from_secs(60),
        );
        assert_eq!(code, 3, "{err}");
        let lines = error_lines(&err);
        assert_eq!(lines.len(), 1, "one error line: {err}");
        assert!(
            lines[0].contains("refused the session") && lines[0].contains(why),
            "{err}"
        );
        assert!(!out.exists(), "no worker may start: {err}");

        let (code, _, err) = status(&server, "runA", tok);
        assert_eq!(code, 3, "{err}");
        assert!(err.contains("refused") && err.contains(why), "{err}");
    }
    // Nothing of runA reached the store: with the right token, the server knows no such run.
    let (code, _, err) = status(&server, "runA", Tok::Env(TOKEN_A));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no run named 'runA'"), "{err}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("refused an unauthenticated request"), "{log}");
    assert!(!log.contains("agent session opened"), "{log}");
    assert!(!log.contains("control plane is open"), "{log}");
}

#[test]
fn an_open_server_warns_once_that_the_control_plane_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let _server = RdzvServer::start_logging(&["--store", "memory"], "warn", &log);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("the open-server warning", Duration::from_secs(10), || {
        read().contains("control plane is open")
    });
    assert_eq!(read().matches("control plane is open").count(), 1);
}

/// Generation and members of a status document.
fn formation(s: &Value) -> (Value, Value) {
    (s["generation"].clone(), s["plan"]["members"].clone())
}

#[test]
fn run_scoped_tokens_keep_two_runs_on_one_server_apart() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(
        dir.path(),
        "tokens",
        &format!("# one token per run\nrunA {TOKEN_A}\nrunB {TOKEN_B}\n"),
    );
    let file_a = token_file(dir.path(), "a", &format!("{TOKEN_A}\n"));
    let file_b = token_file(dir.path(), "b", &format!("{TOKEN_B}\n"));
    let server = RdzvServer::start(&[
        "--store",
        "memory",
        "--token-file",
        tokens.to_str().unwrap(),
    ]);
    let (dir_a, dir_b) = (dir.path().join("a_out"), dir.path().join("b_out"));
    let ready = |d: &Path| (0..2).all(|r| d.join(format!("ready_{r}")).exists());
    let b0 = Path::new("0");

    let _agent_b = Agent::start(agent(
        &server,
        "runB",
        Tok::File(&file_b),
        "trap.py",
        &[&dir_b, b0],
    ));
    wait_for("runB's workers", Duration::from_secs(60), || ready(&dir_b));
    let status_b = || {
        let (code, out, err) = status(&server, "runB", Tok::File(&file_b));
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<Value>(&out).unwrap()
    };
    let before = status_b();
    assert_eq!(before["generation"], 1, "{before}");

    // runA's token can neither read runB ...
    let (code, out, err) = status(&server, "runB", Tok::File(&file_a));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not accepted for run 'runB'"), "{err}");
    assert!(out.is_empty(), "{out}");
    // ... nor join it.
    let (code, _, err) = run(
        agent(&server, "runB", Tok::Env(TOKEN_A), "envdump.py", &[&dir_a]),
        Duration::from_secs(60),
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not accepted for run 'runB'"), "{err}");
    // It does work for its own run, beside runB.
    let _agent_a = Agent::start(agent(
        &server,
        "runA",
        Tok::File(&file_a),
        "trap.py",
        &[&dir_a, b0],
    ));
    wait_for("runA's workers", Duration::from_secs(60), || ready(&dir_a));
    let (code, _, err) = status(&server, "runA", Tok::Env(TOKEN_A));
    assert_eq!(code, 0, "{err}");

    // runB saw none of it: same generation, same members, its workers never signalled.
    let after = status_b();
    assert_eq!(formation(&after), formation(&before), "{after}");
    assert!(
        (0..2).all(|r| !dir_b.join(format!("signals_{r}")).exists()),
        "runB's workers were disturbed"
    );
}

#[test]
fn the_token_shows_in_no_log_status_metrics_or_worker_environment() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), "tokens", &format!("{TOKEN_A}\n"));
    let log = dir.path().join("server.log");
    let server = RdzvServer::start_logging_with_metrics(
        &[
            "--store",
            "memory",
            "--token-file",
            tokens.to_str().unwrap(),
        ],
        "debug",
        &log,
    );
    let out = dir.path().join("out");
    let mut c = agent(&server, "leak", Tok::Env(TOKEN_A), "envdump.py", &[&out]);
    c.env("DRUN_LOG", "debug");
    let (code, agent_out, agent_err) = run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{agent_err}");
    // A refused attempt's messages do not echo what was sent either.
    let (code, _, refused) = status(&server, "leak", Tok::Env(&format!("{TOKEN_A}x")));
    assert_eq!(code, 3, "{refused}");
    let (code, status_json, err) = status(&server, "leak", Tok::Env(TOKEN_A));
    assert_eq!(code, 0, "{err}");
    let metrics = crate::harness::scrape::get(server.metrics.as_deref().unwrap(), "/metrics")
        .expect("metrics answer")
        .2;
    let mut envs = String::new();
    for r in 0..2 {
        let dump = std::fs::read_to_string(out.join(format!("env_{r}.json"))).unwrap();
        let env: Value = serde_json::from_str(&dump).unwrap();
        assert!(env["env"].get("DRUN_RDZV_TOKEN").is_none(), "{dump}");
        envs.push_str(&dump);
    }
    let server_log = std::fs::read_to_string(&log).unwrap();
    assert!(server_log.contains("agent session opened"), "{server_log}");
    for (what, text) in [
        ("agent stdout", &agent_out),
        ("agent stderr", &agent_err),
        ("refusal", &refused),
        ("status", &status_json),
        ("metrics", &metrics),
        ("worker environment", &envs),
        ("server log", &server_log),
    ] {
        assert!(
            !text.contains(TOKEN_A),
            "the token leaked into the {what}:\n{text}"
        );
    }
}

#[test]
fn an_agent_hosting_the_c10d_rendezvous_accepts_only_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("127.0.0.1:{}", crate::harness::cluster::free_port());
    let rdzv = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        &endpoint,
        "--rdzv-conf",
        "join_timeout=60",
    ];
    let out = dir.path().join("out");
    let node = |i: usize, tok: Tok<'_>| {
        let mut c = node_cmd(i, "c10d-auth", "2", &rdzv);
        with_token(&mut c, tok);
        c.arg(worker("envdump.py")).arg(&out);
        c
    };
    let host = Agent::start(node(0, Tok::Env(TOKEN_A)));
    wait_for("the hosted rendezvous", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&endpoint).is_ok()
    });
    let (code, _, err) = run(node(1, Tok::None), Duration::from_secs(60));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("requires a token and none was sent"), "{err}");
    assert!(!out.exists(), "no worker may start: {err}");
    let (code, _, err) = run(node(1, Tok::Env(TOKEN_A)), Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = host.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!((0..4).all(|r| out.join(format!("env_{r}.json")).exists()));
}
