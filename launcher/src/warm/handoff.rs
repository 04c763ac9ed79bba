//! What goes over a warm interpreter's socket: its status line, and the hand-off message.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::decide::Status;

/// The bootstrap, handed to the interpreter in [`SOURCE_VAR`] and run by [`STUB`].
pub const BOOTSTRAP: &str = include_str!("bootstrap.py");

/// The variable that tells the bootstrap where its hand-off socket is.
pub const FD_VAR: &str = "DRUN_WARM_FD";

/// The variable that carries the bootstrap's source, so that the command line stays short.
pub const SOURCE_VAR: &str = "DRUN_WARM_BOOTSTRAP";

/// What `python -c` runs: the bootstrap from [`SOURCE_VAR`], which leaves the environment.
pub const STUB: &str = "import os;exec(os.environ.pop('DRUN_WARM_BOOTSTRAP'))";

/// The warm interpreter's arguments: the worker's interpreter flags (`-u`), the stub, then the
/// worker's script and arguments, which the interpreter ignores (the hand-off sets `sys.argv`)
/// but `ps` and `pgrep -f train.py` show, as for a cold worker. `argv` is a script worker's
/// argv after the program: `[flags.., script, args..]`, with `script_at` its script's index.
pub fn warm_args(argv: &[String], script_at: usize) -> Vec<String> {
    let (flags, rest) = argv.split_at(script_at.min(argv.len()));
    flags
        .iter()
        .cloned()
        .chain(["-c".to_string(), STUB.to_string()])
        .chain(rest.iter().cloned())
        .collect()
}

/// Bytes as a string of one char per byte (U+0000..U+00FF), which the bootstrap turns back
/// into the same bytes with `encode("latin-1")`: environment values need not be UTF-8.
fn bytes(b: &[u8]) -> String {
    b.iter().map(|c| char::from(*c)).collect()
}

/// The hand-off: the worker's complete environment, `sys.argv`, `sys.orig_argv` (also the
/// cold command the bootstrap `exec`s when it has no torch) and its working directory, as
/// one JSON line. `args` is a script worker's argv after the program: `[-u, script, args..]`.
pub fn message(
    program: &Path,
    args: &[String],
    env: &BTreeMap<OsString, OsString>,
    cwd: &Path,
) -> Vec<u8> {
    let orig_argv: Vec<String> = std::iter::once(program.to_string_lossy().into_owned())
        .chain(args.iter().cloned())
        .collect();
    let env: Vec<[String; 2]> = env
        .iter()
        .map(|(k, v)| [bytes(k.as_bytes()), bytes(v.as_bytes())])
        .collect();
    let msg = serde_json::json!({
        "env": env,
        "argv": &args[1..],
        "orig_argv": orig_argv,
        "program": bytes(program.as_os_str().as_bytes()),
        "cwd": bytes(cwd.as_os_str().as_bytes()),
    });
    let mut line = serde_json::to_vec(&msg).expect("a JSON value serializes");
    line.push(b'\n');
    line
}

#[derive(Deserialize)]
struct Line {
    ready: bool,
    error: Option<String>,
    import_s: f64,
    threads: u32,
}

/// The bootstrap's status line; `None` when it is not one (the agent then keeps waiting).
pub fn status(line: &[u8]) -> Option<Status> {
    let l: Line = serde_json::from_slice(line).ok()?;
    Some(if l.ready {
        Status::Ready {
            import: Duration::from_secs_f64(l.import_s.max(0.0)),
            threads: l.threads,
        }
    } else {
        Status::NoTorch(l.error.unwrap_or_default())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn the_message_carries_argv_and_exact_environment_bytes() {
        let mut env = BTreeMap::new();
        env.insert(OsString::from("RANK"), OsString::from("1"));
        env.insert(
            OsString::from("ODD"),
            OsString::from_vec(vec![0xff, b'=', 0xe9]),
        );
        let args: Vec<String> = ["-u", "train.py", "--lr", "0.1"].map(String::from).to_vec();
        let line = message(
            Path::new("/venv/bin/python"),
            &args,
            &env,
            Path::new("/work"),
        );
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["argv"], serde_json::json!(["train.py", "--lr", "0.1"]));
        assert_eq!(
            v["orig_argv"],
            serde_json::json!(["/venv/bin/python", "-u", "train.py", "--lr", "0.1"])
        );
        assert_eq!(v["cwd"], "/work");
        assert_eq!(v["env"][0], serde_json::json!(["ODD", "\u{ff}=\u{e9}"]));
        assert_eq!(v["env"][1], serde_json::json!(["RANK", "1"]));
    }

    #[test]
    fn the_warm_interpreter_keeps_the_workers_flags_and_shows_its_script() {
        let argv = ["-u", "train.py", "--lr", "0.1"].map(String::from);
        let args = warm_args(&argv, 1);
        assert_eq!(args, ["-u", "-c", STUB, "train.py", "--lr", "0.1"]);
        assert!(STUB.contains(SOURCE_VAR));
        assert!(BOOTSTRAP.contains("def _drun_warm"));
    }

    #[test]
    fn status_lines_say_ready_or_why_not() {
        let ready =
            br#"{"ready": true, "error": null, "import_s": 1.5, "py_threads": 1, "threads": 1}"#;
        assert_eq!(
            status(ready),
            Some(Status::Ready {
                import: Duration::from_millis(1500),
                threads: 1
            })
        );
        let failed = br#"{"ready": false, "error": "ModuleNotFoundError: x", "import_s": 0.01, "py_threads": 1, "threads": 1}"#;
        assert_eq!(
            status(failed),
            Some(Status::NoTorch("ModuleNotFoundError: x".into()))
        );
        assert_eq!(status(b"garbage"), None);
    }
}
