//! The worker interpreter's versions (Python, torch, CUDA, NCCL, cuDNN), read in a subprocess
//! of that interpreter and cached on disk.
//!
//! The subprocess never imports torch and never initialises CUDA: versions come from package
//! metadata (`importlib.metadata`) and from `torch/version.py`, found with
//! `importlib.util.find_spec("torch")` (which locates a top-level package without running it)
//! and read with `ast`. A cold probe costs one interpreter start (tens of milliseconds); the
//! result is cached under `$XDG_CACHE_HOME/drun` (else `~/.cache/drun`) per interpreter path,
//! its modification time and `PYTHONPATH`/`PYTHONHOME`, and is only reused while every
//! directory of the interpreter's `sys.path` keeps the modification time it had (installing or
//! removing a package changes its directory's), so a cached start costs a few `stat`s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The probe run by the worker interpreter: prints one JSON object, imports no third-party
/// module.
/// Longest the probe may run (a cold page cache on a network file system is slow; a hung one
/// must not hold the agent's start).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

const PROBE: &str = r#"
import ast, json, os, sys
import importlib.metadata as md, importlib.util as iu
v = {"python": "%d.%d.%d" % sys.version_info[:3]}
def dist(*names):
    for n in names:
        try:
            return "%s %s" % (n, md.version(n))
        except Exception:
            pass
try:
    v["torch"] = md.version("torch")
except Exception:
    pass
for key, names in (("nccl", ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")),
                   ("cudnn", ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11"))):
    d = dist(*names)
    if d:
        v[key] = d
try:
    spec = iu.find_spec("torch")
    loc = list(spec.submodule_search_locations or []) if spec else []
    path = os.path.join(loc[0], "version.py") if loc else None
    if path and os.path.isfile(path):
        with open(path) as f:
            tree = ast.parse(f.read())
        got = {}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                try:
                    value = ast.literal_eval(node.value)
                except Exception:
                    continue
                for t in targets:
                    if isinstance(t, ast.Name):
                        got[t.id] = value
        v.setdefault("torch", str(got.get("__version__", "")))
        v["torch.cuda"] = str(got.get("cuda") or "none")
        if got.get("hip"):
            v["torch.hip"] = str(got["hip"])
        if got.get("git_version"):
            v["torch.git"] = str(got["git_version"])[:12]
except Exception:
    pass
dirs = [p for p in sys.path if p and os.path.isdir(p)]
json.dump({"values": v, "dirs": dirs}, sys.stdout)
"#;

/// What a probe found, as cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Cached {
    /// Key → value (`python`, `torch`, `torch.cuda`, `nccl`, `cudnn`, ...).
    values: BTreeMap<String, String>,
    /// The interpreter's `sys.path` directories and their modification times (ns).
    dirs: Vec<(PathBuf, u128)>,
}

/// The probe's output as the interpreter prints it.
#[derive(Deserialize)]
struct Printed {
    values: BTreeMap<String, String>,
    dirs: Vec<PathBuf>,
}

/// Modification time of `p` in nanoseconds since the epoch (following symlinks).
fn mtime(p: &Path) -> Option<u128> {
    let m = std::fs::metadata(p).ok()?.modified().ok()?;
    Some(m.duration_since(UNIX_EPOCH).ok()?.as_nanos())
}

/// The cache directory: `$XDG_CACHE_HOME/drun`, else `$HOME/.cache/drun`.
pub fn cache_dir(env: &BTreeMap<String, String>) -> Option<PathBuf> {
    let nonempty = |k: &str| env.get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    nonempty("XDG_CACHE_HOME")
        .or_else(|| nonempty("HOME").map(|h| h.join(".cache")))
        .map(|d| d.join("drun"))
}

/// The cache file of `python` with the environment `env` (None when the interpreter cannot be
/// stat-ed).
fn cache_file(dir: &Path, python: &Path, env: &BTreeMap<String, String>) -> Option<PathBuf> {
    let mut h = Sha256::new();
    h.update(python.as_os_str().as_encoded_bytes());
    h.update(mtime(python)?.to_le_bytes());
    for k in [
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONNOUSERSITE",
        "PYTHONUSERBASE",
    ] {
        h.update(k.as_bytes());
        h.update(env.get(k).map_or(&[][..], |v| v.as_bytes()));
        h.update([0]);
    }
    let digest = crate::hex::hex(&h.finalize()[..12]);
    Some(dir.join(format!("probe-{digest}.json")))
}

/// The versions of `python`'s installation, from the cache when it is still valid, else by
/// running the probe (and caching the answer). `env` is the environment the workers get.
/// Empty when the interpreter cannot run the probe (the check then has nothing to compare).
pub fn python_versions(python: &Path, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let file = cache_dir(env).and_then(|d| cache_file(&d, python, env));
    if let Some(c) = file.as_deref().and_then(read_valid) {
        return c.values;
    }
    let Some(fresh) = run_probe(python, env) else {
        return BTreeMap::new();
    };
    if let Some(f) = &file {
        let _ = std::fs::create_dir_all(f.parent().expect("cache file has a directory"));
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        let json = serde_json::to_vec(&fresh).expect("probe result serializes");
        if std::fs::write(&tmp, json).is_ok() {
            let _ = std::fs::rename(&tmp, f);
        }
    }
    fresh.values
}

/// The cached result in `file` if every directory it depends on is unchanged.
fn read_valid(file: &Path) -> Option<Cached> {
    let c: Cached = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    c.dirs
        .iter()
        .all(|(d, t)| mtime(d) == Some(*t))
        .then_some(c)
}

/// Runs the probe with the workers' environment.
fn run_probe(python: &Path, env: &BTreeMap<String, String>) -> Option<Cached> {
    let mut c = Command::new(python);
    c.args(["-c", PROBE]).env_clear().envs(env);
    let out = match super::bounded::output_within(&mut c, PROBE_TIMEOUT) {
        super::bounded::Bounded::Exited(out) => out,
        super::bounded::Bounded::TimedOut => {
            tracing::warn!(python = %python.display(), "the environment probe did not finish within {}: the interpreter's versions are left out of this node's fingerprint", drun_rendezvous::human::duration(PROBE_TIMEOUT));
            return None;
        }
        super::bounded::Bounded::CannotRun(_) => return None,
    };
    if !out.status.success() {
        tracing::debug!(python = %python.display(), "the environment probe failed: {}", out.status);
        return None;
    }
    let p: Printed = serde_json::from_slice(&out.stdout).ok()?;
    Some(Cached {
        values: p.values,
        dirs: p
            .dirs
            .into_iter()
            .filter_map(|d| mtime(&d).map(|t| (d, t)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_lives_under_xdg_cache_home_else_home() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            cache_dir(&env(&[("XDG_CACHE_HOME", "/c"), ("HOME", "/h")])),
            Some(PathBuf::from("/c/drun"))
        );
        assert_eq!(
            cache_dir(&env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/drun"))
        );
        assert_eq!(cache_dir(&env(&[])), None);
    }

    #[test]
    fn the_probe_reads_metadata_and_version_py_without_importing_torch_and_caches_it() {
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("site");
        let info = site.join("torch-9.9.9.dist-info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("METADATA"),
            "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n",
        )
        .unwrap();
        std::fs::create_dir_all(site.join("torch")).unwrap();
        std::fs::write(site.join("torch/__init__.py"), "raise SystemExit(7)\n").unwrap();
        std::fs::write(
            site.join("torch/version.py"),
            "__version__ = '9.9.9'\ncuda = '12.4'\ngit_version = '0123456789abcdef'\n",
        )
        .unwrap();
        let env: BTreeMap<String, String> = [
            ("PYTHONPATH", site.to_str().unwrap()),
            ("XDG_CACHE_HOME", tmp.path().join("cache").to_str().unwrap()),
            ("PATH", &std::env::var("PATH").unwrap_or_default()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let python = which("python3");
        let v = python_versions(&python, &env);
        assert_eq!(v.get("torch").map(String::as_str), Some("9.9.9"), "{v:?}");
        assert_eq!(v["torch.cuda"], "12.4");
        assert_eq!(v["torch.git"], "0123456789ab");
        assert!(v["python"].starts_with('3'), "{v:?}");
        let cached: Vec<_> = std::fs::read_dir(tmp.path().join("cache/drun"))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(cached.len(), 1, "one cache file");
        assert_eq!(python_versions(&python, &env), v, "the cached answer");
        // Another version installed on the path: its directory changed, the cache is not used.
        std::fs::rename(&info, site.join("torch-9.9.10.dist-info")).unwrap();
        std::fs::write(
            site.join("torch-9.9.10.dist-info/METADATA"),
            "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.10\n",
        )
        .unwrap();
        assert_eq!(python_versions(&python, &env)["torch"], "9.9.10");
    }

    fn which(name: &str) -> PathBuf {
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .expect("python3 on PATH")
    }

    #[test]
    fn a_cached_result_is_dropped_when_a_directory_it_read_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("site");
        std::fs::create_dir(&dir).unwrap();
        let file = tmp.path().join("probe.json");
        let c = Cached {
            values: [("torch".to_string(), "2.4.0".to_string())].into(),
            dirs: vec![(dir.clone(), mtime(&dir).unwrap())],
        };
        std::fs::write(&file, serde_json::to_vec(&c).unwrap()).unwrap();
        assert_eq!(read_valid(&file), Some(c.clone()));
        let stale = Cached {
            dirs: vec![(dir, 1)],
            ..c
        };
        std::fs::write(&file, serde_json::to_vec(&stale).unwrap()).unwrap();
        assert_eq!(read_valid(&file), None);
    }
}
