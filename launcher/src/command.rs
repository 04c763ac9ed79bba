//! Worker command construction, as torchrun's `config_from_args` does it.
//!
//! Default: `<python> -u SCRIPT ARGS...`; `-m`: `<python> -u -m MODULE ARGS...`; `--no-python`:
//! `SCRIPT ARGS...`; `--run-path`: `<python> -u -c <runpy.run_path shim> SCRIPT ARGS...`. No
//! `--local-rank` is appended (torchrun sets `use_env`). In every argument `$local_rank` and
//! `${local_rank}` become the worker's local rank and `$$` becomes `$`, following Python's
//! `string.Template.safe_substitute` used by `torch/distributed/elastic/utils/api.py`.

use std::path::{Path, PathBuf};

use crate::ConfigError;

/// How the training script is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// `python -u script.py`.
    Script,
    /// `python -u -m module`.
    Module,
    /// The script is itself the executable (`--no-python`).
    Binary,
    /// `runpy.run_path(script)` inside the interpreter (`--run-path`).
    RunPath,
}

/// The resolved worker command, before per-worker macro substitution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entrypoint {
    /// How it is started.
    pub kind: EntryKind,
    /// Executable (absolute path when resolved from PATH).
    pub program: PathBuf,
    /// Fixed arguments between the program and the user's arguments (e.g. `-u`, `-m mod`).
    pub leading: Vec<String>,
    /// The user's script/module name as given (for messages: "train.py FAILED").
    pub script: String,
    /// The user's arguments, untouched.
    pub args: Vec<String>,
}

const RUN_PATH_SHIM: &str =
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')";

impl Entrypoint {
    /// The full argv (after the program) for the worker with `local_rank`.
    pub fn argv(&self, local_rank: u32) -> Vec<String> {
        let lr = local_rank.to_string();
        self.leading
            .iter()
            .cloned()
            .chain(self.args.iter().map(|a| substitute_local_rank(a, &lr)))
            .collect()
    }

    /// The entrypoint as given, without looking at the filesystem: `program` is the requested
    /// interpreter (`python`, else `python3`) or, with `--no-python`, the script itself.
    /// [`Entrypoint::resolve`] makes it absolute and checks that it exists.
    pub fn unresolved(kind: EntryKind, script_and_args: &[String], python: Option<&Path>) -> Self {
        let (script, args) = script_and_args
            .split_first()
            .expect("clap requires the training script");
        let program = match (kind, python) {
            (EntryKind::Binary, _) => PathBuf::from(script),
            (_, Some(p)) => p.to_path_buf(),
            (_, None) => PathBuf::from("python3"),
        };
        Entrypoint {
            kind,
            program,
            leading: leading(kind, script),
            script: script.clone(),
            args: args.to_vec(),
        }
    }

    /// Resolves the entrypoint; checks that the script/executable and the interpreter exist.
    ///
    /// `python` is the interpreter chosen by flag or environment and where it came from (see
    /// [`resolve_python`]); `None`: `python3` on PATH.
    pub fn resolve(
        kind: EntryKind,
        script_and_args: &[String],
        python: Option<(&Path, PythonSource)>,
    ) -> Result<Self, ConfigError> {
        let (script, args) = script_and_args
            .split_first()
            .expect("clap requires the training script");
        let script_path = Path::new(script);
        let check_file = || -> Result<(), ConfigError> {
            // Python also runs a directory (or zip) holding __main__.py.
            if script_path.is_file() || script_path.join("__main__.py").is_file() {
                Ok(())
            } else if script_path.is_dir() {
                Err(ConfigError::Directory(script_path.to_path_buf()))
            } else if let Some(kind) = special_file(script_path) {
                Err(ConfigError::NotAFile(script_path.to_path_buf(), kind))
            } else {
                Err(ConfigError::MissingScript {
                    path: script_path.to_path_buf(),
                    hint: std::env::current_dir()
                        .map(|d| format!(" (relative to {}); pass an existing file", d.display()))
                        .unwrap_or_default(),
                })
            }
        };
        let python = || resolve_python(python);
        let program = match kind {
            EntryKind::Script | EntryKind::RunPath => {
                check_file()?;
                python()?
            }
            EntryKind::Module => python()?,
            EntryKind::Binary if script.contains('/') => {
                if script_path.is_dir() {
                    return Err(ConfigError::Directory(script_path.to_path_buf()));
                }
                check_file()?;
                if !is_executable(script_path) {
                    return Err(ConfigError::NotExecutable(script_path.to_path_buf()));
                }
                script_path.to_path_buf()
            }
            EntryKind::Binary => {
                find_on_path(script).ok_or_else(|| ConfigError::MissingScript {
                    path: script_path.to_path_buf(),
                    hint: " on PATH (--no-python runs an executable)".into(),
                })?
            }
        };
        Ok(Entrypoint {
            kind,
            program,
            leading: leading(kind, script),
            script: script.clone(),
            args: args.to_vec(),
        })
    }
}

/// Fixed arguments between the program and the user's arguments.
fn leading(kind: EntryKind, script: &str) -> Vec<String> {
    let script = script.to_string();
    match kind {
        EntryKind::Script => vec!["-u".into(), script],
        EntryKind::Module => vec!["-u".into(), "-m".into(), script],
        EntryKind::RunPath => vec!["-u".into(), "-c".into(), RUN_PATH_SHIM.into(), script],
        EntryKind::Binary => vec![],
    }
}

/// Where the worker interpreter's name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PythonSource {
    /// `--python`.
    Flag,
    /// `$DRUN_PYTHON`.
    DrunPython,
    /// `$PYTHON_EXEC` (torchrun's override).
    PythonExec,
    /// Nothing asked: `python3` on PATH (so an activated venv wins).
    #[default]
    Default,
}

impl PythonSource {
    /// ` (from DRUN_PYTHON)`, for messages; empty for the flag and the default.
    pub fn origin(self) -> &'static str {
        match self {
            PythonSource::DrunPython => " (from DRUN_PYTHON)",
            PythonSource::PythonExec => " (from PYTHON_EXEC)",
            PythonSource::Flag | PythonSource::Default => "",
        }
    }

    /// How to fix an interpreter that does not exist.
    pub fn fix(self) -> &'static str {
        match self {
            PythonSource::Flag => "pass an existing interpreter to --python",
            PythonSource::DrunPython => "fix or unset DRUN_PYTHON, or pass --python PATH",
            PythonSource::PythonExec => "fix or unset PYTHON_EXEC, or pass --python PATH",
            PythonSource::Default => "pass --python PATH or set DRUN_PYTHON",
        }
    }
}

/// The worker interpreter `explicit` (with where it came from), else `python3` on PATH.
/// Returned as an absolute path.
pub fn resolve_python(explicit: Option<(&Path, PythonSource)>) -> Result<PathBuf, ConfigError> {
    let (wanted, from) = explicit.map_or(
        (PathBuf::from("python3"), PythonSource::Default),
        |(p, s)| (p.to_path_buf(), s),
    );
    let s = wanted.to_string_lossy().into_owned();
    let missing = || ConfigError::MissingPython {
        python: s.clone(),
        from,
    };
    if s.contains('/') {
        if wanted.is_file() {
            Ok(wanted)
        } else {
            Err(missing())
        }
    } else {
        find_on_path(&s).ok_or_else(missing)
    }
}

/// Whether `p` is a file with an execute bit.
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds an executable file named `name` in `$PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// `string.Template(arg).safe_substitute(local_rank=lr)`: replaces `$local_rank` and
/// `${local_rank}` (exactly that name: Template matches identifiers case-insensitively but looks
/// them up case-sensitively, so `${LOCAL_RANK}` stays), turns `$$` into `$`, and leaves every
/// other `$...` untouched.
///
/// ```
/// use drun_launcher::command::substitute_local_rank;
/// assert_eq!(substitute_local_rank("--log=rank${local_rank}.txt", "3"), "--log=rank3.txt");
/// assert_eq!(substitute_local_rank("$$HOME $other", "3"), "$HOME $other");
/// ```
pub fn substitute_local_rank(arg: &str, lr: &str) -> String {
    let bytes = arg.as_bytes();
    let mut out = String::with_capacity(arg.len());
    let mut i = 0;
    let ident_len = |s: &[u8]| -> usize {
        if s.first()
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
        {
            s.iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                .count()
        } else {
            0
        }
    };
    while i < bytes.len() {
        if bytes[i] != b'$' {
            let next = arg[i..].find('$').map_or(arg.len(), |n| i + n);
            out.push_str(&arg[i..next]);
            i = next;
            continue;
        }
        let rest = &bytes[i + 1..];
        if rest.first() == Some(&b'$') {
            out.push('$');
            i += 2;
        } else if rest.first() == Some(&b'{') {
            let n = ident_len(&rest[1..]);
            if n > 0 && rest.get(1 + n) == Some(&b'}') {
                let name = &arg[i + 2..i + 2 + n];
                if name == "local_rank" {
                    out.push_str(lr);
                } else {
                    out.push_str(&arg[i..i + 3 + n]);
                }
                i += 3 + n;
            } else {
                out.push('$');
                i += 1;
            }
        } else {
            let n = ident_len(rest);
            let name = &arg[i + 1..i + 1 + n];
            if n > 0 && name == "local_rank" {
                out.push_str(lr);
            } else {
                out.push_str(&arg[i..i + 1 + n]);
            }
            i += 1 + n;
        }
    }
    out
}

/// What `path` is when it exists but is neither a regular file nor a directory (following
/// links): "a FIFO (pipe)", "a socket", "a device"; None otherwise.
fn special_file(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(path).ok()?.file_type();
    if t.is_fifo() {
        Some("a FIFO (a pipe, as `<(...)` gives)")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_block_device() || t.is_char_device() {
        Some("a device")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macro_substitution_matches_python_template() {
        assert_eq!(
            substitute_local_rank("--out=/d/${local_rank}.log", "3"),
            "--out=/d/3.log"
        );
        assert_eq!(substitute_local_rank("$local_rank", "1"), "1");
        assert_eq!(
            substitute_local_rank("$local_rankx ${other} $HOME", "1"),
            "$local_rankx ${other} $HOME"
        );
        assert_eq!(
            substitute_local_rank("cost $$5 ${ bad} $", "0"),
            "cost $5 ${ bad} $"
        );
        assert_eq!(
            substitute_local_rank("${LOCAL_RANK} $Local_Rank", "2"),
            "${LOCAL_RANK} $Local_Rank"
        );
        assert_eq!(
            substitute_local_rank("--nproc-per-node 7", "0"),
            "--nproc-per-node 7"
        );
    }

    #[test]
    fn module_needs_no_file_and_args_pass_through() {
        let e = Entrypoint::resolve(
            EntryKind::Module,
            &[
                "pkg.mod".into(),
                "--nproc-per-node".into(),
                "${local_rank}".into(),
            ],
            Some((Path::new("/bin/sh"), PythonSource::Flag)),
        )
        .unwrap();
        assert_eq!(e.argv(4), ["-u", "-m", "pkg.mod", "--nproc-per-node", "4"]);
    }

    #[test]
    fn missing_script_and_binary_are_errors() {
        let err = Entrypoint::resolve(
            EntryKind::Script,
            &["/nonexistent/x.py".into()],
            Some((Path::new("/bin/sh"), PythonSource::Flag)),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/x.py not found"),
            "{err}"
        );
        let err = Entrypoint::resolve(EntryKind::Binary, &["no-such-binary-drun".into()], None)
            .unwrap_err();
        assert!(err.to_string().contains("on PATH"), "{err}");
        let ok = Entrypoint::resolve(EntryKind::Binary, &["true".into()], None).unwrap();
        let err = Entrypoint::resolve(
            EntryKind::Script,
            &["/bin/sh".into()],
            Some((Path::new("/no/such/py"), PythonSource::DrunPython)),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "python interpreter '/no/such/py' (from DRUN_PYTHON) not found; fix or unset DRUN_PYTHON, or pass --python PATH"
        );
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().display().to_string();
        for kind in [EntryKind::Script, EntryKind::Binary] {
            let err = Entrypoint::resolve(
                kind,
                std::slice::from_ref(&dir),
                Some((Path::new("/bin/sh"), PythonSource::Flag)),
            )
            .unwrap_err();
            assert!(err.to_string().contains("is a directory"), "{err}");
        }
        let fifo = d.path().join("train.py");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = Entrypoint::resolve(
            EntryKind::Script,
            &[fifo.display().to_string()],
            Some((Path::new("/bin/sh"), PythonSource::Flag)),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("is a FIFO") && err.to_string().contains("not a regular file"),
            "{err}"
        );
        assert!(ok.program.is_absolute());
    }
}
