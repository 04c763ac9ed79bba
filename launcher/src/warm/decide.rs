//! Warm or cold, and why: pure decisions on facts the pool gathered.

use std::time::Duration;

use crate::command::EntryKind;
use crate::os::spawn::ExitKind;

use super::WarmWorkers;

/// What the training script is, as far as a warm start cares (see [`ScriptFile::inspect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptFile {
    /// A source file `python script.py` compiles and runs.
    Source,
    /// Something `python` runs another way: a directory or zip with `__main__.py`, compiled
    /// bytecode, or nothing readable.
    Other(&'static str),
    /// A source file that writes an environment variable on this line before its first
    /// `import torch` ([`sets_env_before_torch`]): a preloaded torch would not see it.
    SetsEnvFirst {
        /// The line (1-based).
        line: usize,
    },
}

impl ScriptFile {
    /// Looks at `path`: a regular file that is neither a zip archive (`PK`) nor bytecode, and
    /// whether it sets an environment variable before it imports torch (read once, at start).
    pub fn inspect(path: &std::path::Path) -> Self {
        if !path.is_file() {
            return ScriptFile::Other("the script is not a regular file");
        }
        let named = |ext: &str| path.extension().is_some_and(|e| e == ext);
        match std::fs::read(path) {
            Err(_) => ScriptFile::Other("the script cannot be read"),
            Ok(b) if b.starts_with(b"PK") || named("zip") || named("pyz") => {
                ScriptFile::Other("the script is a zip archive")
            }
            Ok(_) if named("pyc") => ScriptFile::Other("the script is compiled bytecode"),
            Ok(b) => match sets_env_before_torch(&String::from_utf8_lossy(&b)) {
                Some(line) => ScriptFile::SetsEnvFirst { line },
                None => ScriptFile::Source,
            },
        }
    }
}

/// The line (1-based) on which `source` writes or removes an environment variable before its
/// first line that imports torch (`import torch…`, `from torch…`, at any indentation), or
/// anywhere when no such line comes: `os.environ["OMP_NUM_THREADS"] = "2"` ahead of
/// `import torch` sets torch's threads under torchrun, and nothing in an interpreter that
/// imported torch already. By text, not by syntax: a hit in a string costs only the warm start,
/// as `--warm-workers off` would; a variable set by a module the script imports first is not
/// seen.
pub fn sets_env_before_torch(source: &str) -> Option<usize> {
    const CALLS: [&str; 6] = [
        "environ.update(",
        "environ.setdefault(",
        "environ.pop(",
        "environ.clear(",
        "putenv(",
        "unsetenv(",
    ];
    for (i, line) in source.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with('#') {
            continue;
        }
        let imports_torch = ["import torch", "from torch"].iter().any(|p| {
            code.strip_prefix(p)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '.', ',', ';']))
        });
        if imports_torch {
            return None;
        }
        let assigns = code.match_indices("environ[").any(|(at, _)| {
            let after = &code[at..];
            let Some(close) = after.find(']') else {
                return false;
            };
            let rest = after[close + 1..].trim_start();
            rest.starts_with('=') && !rest.starts_with("==")
                || ["+=", "|="].iter().any(|op| rest.starts_with(op))
        });
        let deletes = code.starts_with("del ") && code.contains("environ[");
        if assigns || deletes || CALLS.iter().any(|c| code.contains(c)) {
            return Some(i + 1);
        }
    }
    None
}

/// Why this run's workers cannot start warm (any more), said once in the run's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotWarm {
    /// `--warm-workers off`.
    #[error("--warm-workers off")]
    Off,
    /// The script is not a source file ([`ScriptFile::Other`]).
    #[error("{0}")]
    Script(&'static str),
    /// The script sets an environment variable (this line) before it imports torch.
    #[error("the script sets an environment variable on line {0} before it imports torch, which an interpreter that imported torch already would not see (as under torchrun, it starts cold)")]
    SetsEnvFirst(usize),
    /// `--no-python`.
    #[error("--no-python runs an executable, not a Python script")]
    Binary,
    /// `-m`.
    #[error("-m runs a module; warm workers run scripts only")]
    Module,
    /// `--run-path`.
    #[error("--run-path runs the script with runpy; warm workers run `python script.py` only")]
    RunPath,
    /// The first warm interpreter could not import torch (its message).
    #[error("the worker interpreter cannot import torch ({0})")]
    NoTorch(String),
    /// A warm interpreter could not be started (the reason).
    #[error("a warm interpreter could not start ({0})")]
    CannotStart(String),
}

/// Why this run's workers can never start warm, decided once at start; `Ok`: they can.
pub fn eligibility(mode: WarmWorkers, kind: EntryKind, script: ScriptFile) -> Result<(), NotWarm> {
    if mode == WarmWorkers::Off {
        return Err(NotWarm::Off);
    }
    match (kind, script) {
        (EntryKind::Script, ScriptFile::Source) => Ok(()),
        (EntryKind::Script, ScriptFile::Other(why)) => Err(NotWarm::Script(why)),
        (EntryKind::Script, ScriptFile::SetsEnvFirst { line }) => Err(NotWarm::SetsEnvFirst(line)),
        (EntryKind::Binary, _) => Err(NotWarm::Binary),
        (EntryKind::Module, _) => Err(NotWarm::Module),
        (EntryKind::RunPath, _) => Err(NotWarm::RunPath),
    }
}

/// What the agent knows of one warm interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Started; torch not imported yet (no word on its socket).
    Importing,
    /// Imported torch in `import` and waits; `threads`: its OS threads then.
    Ready {
        /// How long `import torch` took.
        import: Duration,
        /// Its threads (`/proc/self/task`) after the import.
        threads: u32,
    },
    /// Could not import torch (the message).
    NoTorch(String),
    /// Exited before its hand-off.
    Exited(ExitKind),
}

/// How one worker of a generation starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Hand off to its warm interpreter (ready, or still importing: it can only be sooner
    /// than a new interpreter that would import torch from scratch).
    Warm,
    /// A new process, as without warm workers; the reason to say, if there is one worth a line.
    Cold(Option<String>),
}

/// How local rank's worker starts: `eligible` is [`eligibility`]'s verdict, `preflight` whether
/// this generation runs the preflight check first, `warm` the rank's warm interpreter if any.
pub fn choose(eligible: &Result<(), NotWarm>, preflight: bool, warm: Option<&Status>) -> Start {
    if eligible.is_err() {
        // Said once per run by the pool, not per rank and generation.
        return Start::Cold(None);
    }
    match warm {
        // The first generation, or the ranks of one that started cold.
        None => Start::Cold(None),
        Some(_) if preflight => Start::Cold(Some(
            "this generation runs the --preflight check first".into(),
        )),
        Some(Status::Importing | Status::Ready { .. }) => Start::Warm,
        Some(Status::NoTorch(e)) => Start::Cold(Some(format!(
            "the warm interpreter could not import torch ({e})"
        ))),
        Some(Status::Exited(exit)) => Start::Cold(Some(format!(
            "its warm interpreter exited ({})",
            describe(*exit)
        ))),
    }
}

/// Whether a generation can follow the one starting now, so that warm interpreters started for
/// it could ever be used. `one_node` is the in-process rendezvous (`--standalone`, or a
/// one-node launch): no node can join or leave it, so the only next generation is a restart of
/// the group, which needs `--max-restarts` budget left (`restarts_used` of `max_restarts`).
/// Every other rendezvous can re-form on a membership change whatever the budget. `Err`: why
/// none is started (a debug line).
pub fn next_generation(
    one_node: bool,
    restarts_used: u32,
    max_restarts: u32,
) -> Result<(), &'static str> {
    if one_node && restarts_used >= max_restarts {
        Err("one node and no restart left: no generation can follow this one")
    } else {
        Ok(())
    }
}

/// How long a node's first join waits at most for its warm interpreters' `import torch`.
pub const IMPORT_WAIT: Duration = Duration::from_secs(30);

/// Whether this node's first join may go, `waited` after its warm interpreters started, while
/// `importing` of them have not imported torch yet: once none is importing, or after
/// [`IMPORT_WAIT`]. A node joins ready to train: a newcomer to a running job does not make the
/// world it joins stop while it imports torch (the running world trains meanwhile), and a
/// first formation loses nothing, since its workers would wait for the same import.
pub fn first_join(importing: usize, waited: Duration) -> Result<&'static str, &'static str> {
    if importing == 0 {
        Ok("the warm interpreters imported torch")
    } else if waited >= IMPORT_WAIT {
        Ok("the warm interpreters are still importing torch: joining anyway")
    } else {
        Err("joining once the warm interpreters imported torch")
    }
}

fn describe(exit: ExitKind) -> String {
    match exit {
        ExitKind::Code(c) => format!("exit {c}"),
        ExitKind::Signal(s) => format!("killed by {}", s.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;

    const ON: WarmWorkers = WarmWorkers::On;

    #[test]
    fn only_a_python_script_file_with_the_flag_on_can_start_warm() {
        assert_eq!(
            eligibility(ON, EntryKind::Script, ScriptFile::Source),
            Ok(())
        );
        let off = eligibility(WarmWorkers::Off, EntryKind::Script, ScriptFile::Source);
        assert_eq!(off.unwrap_err().to_string(), "--warm-workers off");
        for (kind, says) in [
            (EntryKind::Binary, "--no-python"),
            (EntryKind::Module, "-m runs a module"),
            (EntryKind::RunPath, "--run-path"),
        ] {
            let why = eligibility(ON, kind, ScriptFile::Source)
                .unwrap_err()
                .to_string();
            assert!(why.contains(says), "{why}");
        }
        let zip = eligibility(
            ON,
            EntryKind::Script,
            ScriptFile::Other("the script is a zip archive"),
        );
        assert_eq!(zip.unwrap_err().to_string(), "the script is a zip archive");
    }

    #[test]
    fn a_script_that_sets_a_variable_before_it_imports_torch_starts_cold() {
        let first = |s: &str| sets_env_before_torch(s);
        // Set before torch: torch reads it at import.
        assert_eq!(
            first("import os\nos.environ[\"OMP_NUM_THREADS\"] = \"2\"\nimport torch\n"),
            Some(2)
        );
        assert_eq!(
            first(
                "import os\nos.environ.setdefault('TORCH_LOGS', '+dynamo')\nfrom torch import nn\n"
            ),
            Some(2)
        );
        assert_eq!(
            first(
                "from os import environ\nenviron['A'] += ':x'\nimport torch.distributed as dist\n"
            ),
            Some(2)
        );
        assert_eq!(
            first("import os\ndel os.environ['CUDA_VISIBLE_DEVICES']\nimport torch\n"),
            Some(2)
        );
        assert_eq!(
            first("import os\nos.putenv('X', '1')\nimport torch\n"),
            Some(2)
        );
        // No torch import in the script (a framework imports it): every write counts.
        assert_eq!(
            first("import lightning\ndef main():\n    os.environ['X'] = '1'\n"),
            Some(3)
        );
        // Reads, comparisons, comments, and writes after torch are no reason.
        assert_eq!(
            first("import os\nrank = int(os.environ['RANK'])\nif os.environ['A'] == 'b': pass\n# os.environ['X'] = '1'\nimport torch\nos.environ['Y'] = '2'\n"),
            None
        );
        assert_eq!(first("import torchvision\n"), None);
        assert_eq!(
            first("import torchvision\nos.environ['X'] = '1'\n"),
            Some(2),
            "torchvision is not torch's own line"
        );
        let why = eligibility(ON, EntryKind::Script, ScriptFile::SetsEnvFirst { line: 2 })
            .unwrap_err()
            .to_string();
        assert!(why.contains("on line 2 before it imports torch"), "{why}");
        let dir = tempfile::tempdir().unwrap();
        let py = dir.path().join("t.py");
        std::fs::write(
            &py,
            "import os\nos.environ['OMP_NUM_THREADS'] = '2'\nimport torch\n",
        )
        .unwrap();
        assert_eq!(
            ScriptFile::inspect(&py),
            ScriptFile::SetsEnvFirst { line: 2 }
        );
    }

    #[test]
    fn one_node_keeps_warm_interpreters_only_while_a_restart_is_left() {
        // The default standalone run (--max-restarts 0): its first generation is its last.
        let last = next_generation(true, 0, 0).unwrap_err();
        assert!(last.contains("no restart left"), "{last}");
        assert_eq!(next_generation(true, 0, 1), Ok(()));
        assert_eq!(next_generation(true, 2, 3), Ok(()));
        assert!(next_generation(true, 3, 3).is_err());
        // A multi-node rendezvous can re-form on a node loss or arrival, restarts or not.
        assert_eq!(next_generation(false, 0, 0), Ok(()));
        assert_eq!(next_generation(false, 3, 3), Ok(()));
    }

    #[test]
    fn a_live_warm_interpreter_is_used_ready_or_not() {
        let ok = Ok(());
        let ready = Status::Ready {
            import: Duration::from_millis(1900),
            threads: 1,
        };
        assert_eq!(choose(&ok, false, Some(&ready)), Start::Warm);
        assert_eq!(choose(&ok, false, Some(&Status::Importing)), Start::Warm);
    }

    #[test]
    fn cold_starts_say_why_unless_there_is_nothing_to_say() {
        let ok = Ok(());
        assert_eq!(choose(&ok, false, None), Start::Cold(None), "first start");
        let never = Err(NotWarm::Off);
        assert_eq!(
            choose(&never, false, Some(&Status::Importing)),
            Start::Cold(None)
        );
        let Start::Cold(Some(why)) = choose(&ok, true, Some(&Status::Importing)) else {
            panic!("preflight starts cold")
        };
        assert!(why.contains("--preflight"), "{why}");
        let exited = Status::Exited(ExitKind::Signal(Signal::SIGKILL));
        assert_eq!(
            choose(&ok, false, Some(&exited)),
            Start::Cold(Some(
                "its warm interpreter exited (killed by SIGKILL)".into()
            ))
        );
        let no_torch = Status::NoTorch("ModuleNotFoundError: No module named 'torch'".into());
        assert_eq!(
            choose(&ok, false, Some(&no_torch)),
            Start::Cold(Some(
                "the warm interpreter could not import torch (ModuleNotFoundError: No module named 'torch')"
                    .into()
            ))
        );
    }

    #[test]
    fn a_first_join_waits_for_the_import_but_not_beyond_its_bound() {
        let s = Duration::from_secs;
        assert!(first_join(0, s(0)).is_ok(), "nothing to wait for");
        assert!(first_join(2, s(0)).is_err());
        assert!(first_join(1, IMPORT_WAIT - Duration::from_millis(1)).is_err());
        let late = first_join(1, IMPORT_WAIT);
        assert!(late.unwrap().contains("joining anyway"));
    }

    #[test]
    fn script_files_are_told_from_archives_and_directories() {
        let d = tempfile::tempdir().unwrap();
        let py = d.path().join("train.py");
        std::fs::write(&py, "print(1)\n").unwrap();
        assert_eq!(ScriptFile::inspect(&py), ScriptFile::Source);
        let zip = d.path().join("app");
        std::fs::write(&zip, b"PK\x03\x04...").unwrap();
        assert_eq!(
            ScriptFile::inspect(&zip),
            ScriptFile::Other("the script is a zip archive")
        );
        assert!(matches!(
            ScriptFile::inspect(d.path()),
            ScriptFile::Other(_)
        ));
    }
}
