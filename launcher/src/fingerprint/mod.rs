//! This node's environment fingerprint, sent with every Join and compared across the members at
//! formation (`--env-check`, see [`drun_rendezvous::decisions::envcheck`]).
//!
//! Keys (values are strings; a key this node cannot know is left out):
//!
//! | key | what |
//! |---|---|
//! | `drun` | drun's version |
//! | `config.nnodes`, `config.nproc-per-node`, `config.max-restarts` | the resolved launch config |
//! | `config.script`, `config.script-sha256`, `config.args` | the entrypoint, its file's SHA-256, its arguments |
//! | `config.program-sha256` | with `--no-python`: the executable's SHA-256 instead (reported, never refused: a system binary or wrapper may legitimately differ between nodes) |
//! | `os`, `kernel` | OS and architecture; the kernel release |
//! | `python`, `torch`, `torch.cuda`, `torch.git`, `nccl`, `cudnn` | the worker interpreter's, see [`probe`] |
//! | `gpu`, `gpu.driver` | `N x MODEL` and the driver, when `nvidia-smi` exists |
//! | `env.NCCL_*`, `env.TORCH_*`, `env.GLOO_*` | the variables that change torch's behaviour |
//! | `fingerprint-cmd` | the output of `--fingerprint-cmd` (e.g. an image digest) |
//!
//! [`config_keys`] and [`env_keys`] are pure; [`collect`] adds what it reads from the machine.

pub mod bounded;
pub mod probe;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bounded::Bounded;

use drun_rendezvous::decisions::envcheck::Fingerprint;
use sha2::{Digest, Sha256};

use crate::command::EntryKind;
use crate::config::LaunchConfig;

/// Prefixes of the environment variables compared across nodes.
pub const ENV_PREFIXES: &[&str] = &["NCCL_", "TORCH_", "GLOO_"];

/// The launch config's keys (pure): what every node of a run should agree on.
pub fn config_keys(cfg: &LaunchConfig, script_sha256: Option<String>) -> Fingerprint {
    let mut f = Fingerprint::new();
    let mut put = |k: &str, v: String| {
        f.insert(k.to_string(), v);
    };
    put("drun", env!("CARGO_PKG_VERSION").to_string());
    put(
        "config.nnodes",
        format!("{}:{}", cfg.rdzv.min_nodes, cfg.rdzv.max_nodes),
    );
    put(
        "config.nproc-per-node",
        cfg.workers.nproc_per_node.to_string(),
    );
    put(
        "config.max-restarts",
        cfg.supervision.max_restarts.to_string(),
    );
    put("config.script", cfg.workers.entrypoint.script.clone());
    put(
        "config.args",
        serde_json::to_string(&cfg.workers.entrypoint.args).expect("strings serialize"),
    );
    if let Some(h) = script_sha256 {
        let key = if cfg.workers.entrypoint.kind == EntryKind::Binary {
            "config.program-sha256"
        } else {
            "config.script-sha256"
        };
        put(key, h);
    }
    f
}

/// The `NCCL_*`/`TORCH_*`/`GLOO_*` variables of `env` as `env.NAME` keys (pure).
pub fn env_keys(env: &BTreeMap<String, String>) -> Fingerprint {
    env.iter()
        .filter(|(k, _)| ENV_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (format!("env.{k}"), v.clone()))
        .collect()
}

/// This node's fingerprint: [`config_keys`], [`env_keys`], the OS, the worker interpreter's
/// versions ([`probe::python_versions`], cached), the GPUs and the `--fingerprint-cmd` output.
/// `env` is the environment the workers inherit. Blocking (runs subprocesses).
pub fn collect(cfg: &LaunchConfig, env: &BTreeMap<String, String>) -> Fingerprint {
    let gpus = std::thread::spawn(gpus);
    let mut f = config_keys(cfg, script_sha256(cfg));
    f.extend(env_keys(env));
    f.insert(
        "os".into(),
        format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
    );
    if let Ok(k) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        f.insert("kernel".into(), k.trim().to_string());
    }
    if cfg.workers.entrypoint.kind != EntryKind::Binary {
        f.extend(probe::python_versions(&cfg.workers.entrypoint.program, env));
    }
    if let Some(cmd) = &cfg.rdzv.fingerprint_cmd {
        f.insert(
            "fingerprint-cmd".into(),
            run_fingerprint_cmd(cmd, env, FINGERPRINT_CMD_TIMEOUT),
        );
    }
    f.extend(gpus.join().unwrap_or_default());
    f
}

/// SHA-256 of the script file (a script, `--run-path` or `--no-python` executable); `None` for
/// a module or a file that cannot be read. [`config_keys`] files an executable's under
/// `config.program-sha256`, which is not one of the refused keys.
pub fn script_sha256(cfg: &LaunchConfig) -> Option<String> {
    let path = match cfg.workers.entrypoint.kind {
        EntryKind::Module => return None,
        EntryKind::Binary => cfg.workers.entrypoint.program.clone(),
        EntryKind::Script | EntryKind::RunPath => cfg.workers.entrypoint.script.clone().into(),
    };
    let mut file = std::fs::File::open(&path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(_) => return None,
        }
    }
    Some(crate::hex::hex(&h.finalize()))
}

/// Longest a `--fingerprint-cmd` may run before its value is "(timed out ...)".
pub const FINGERPRINT_CMD_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `nvidia-smi` may run (it hangs on a wedged GPU) before the GPU keys are left out.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// `sh -c CMD`'s standard output, trimmed, within `limit`; a failure or a timeout is a value too
/// (it differs from a success).
fn run_fingerprint_cmd(cmd: &str, env: &BTreeMap<String, String>, limit: Duration) -> String {
    let mut c = Command::new("sh");
    c.args(["-c", cmd]).env_clear().envs(env);
    match bounded::output_within(&mut c, limit) {
        Bounded::Exited(o) if o.status.success() => {
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        }
        Bounded::Exited(o) => format!("(failed: {})", o.status),
        Bounded::TimedOut => {
            tracing::warn!(
                "--fingerprint-cmd did not finish within {}: killed; its value is \"timed out\"",
                drun_rendezvous::human::duration(limit)
            );
            format!(
                "(timed out after {})",
                drun_rendezvous::human::duration(limit)
            )
        }
        Bounded::CannotRun(e) => format!("(cannot run: {e})"),
    }
}

/// `gpu` (`N x MODEL`, models joined by `+` when mixed) and `gpu.driver`: from the NVIDIA
/// driver's files under `/proc/driver/nvidia` (microseconds), else from `nvidia-smi` (tens to
/// hundreds of milliseconds); nothing when neither answers (no NVIDIA GPU: skipped quietly).
fn gpus() -> Fingerprint {
    let from_proc = proc_gpus(Path::new("/proc/driver/nvidia"));
    if !from_proc.is_empty() {
        return from_proc;
    }
    let smi = Path::new("nvidia-smi");
    let mut c = Command::new(smi);
    c.args(["--query-gpu=name,driver_version", "--format=csv,noheader"]);
    let out = match bounded::output_within(&mut c, NVIDIA_SMI_TIMEOUT) {
        Bounded::Exited(out) => out,
        Bounded::TimedOut => {
            tracing::warn!(
                "nvidia-smi did not answer within {} (a wedged GPU?): the GPU keys are left out of this node's fingerprint",
                drun_rendezvous::human::duration(NVIDIA_SMI_TIMEOUT)
            );
            return Fingerprint::new();
        }
        Bounded::CannotRun(_) => return Fingerprint::new(),
    };
    if !out.status.success() {
        return Fingerprint::new();
    }
    parse_smi(&String::from_utf8_lossy(&out.stdout))
}

/// The GPUs as the loaded NVIDIA driver lists them under `root` (`version`,
/// `gpus/<bus id>/information`), in `nvidia-smi`'s CSV shape for [`parse_smi`].
fn proc_gpus(root: &Path) -> Fingerprint {
    let Ok(version) = std::fs::read_to_string(root.join("version")) else {
        return Fingerprint::new();
    };
    let driver = driver_version(&version).unwrap_or_default();
    let mut csv = String::new();
    let mut dirs: Vec<_> = std::fs::read_dir(root.join("gpus"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    for d in dirs {
        let Ok(info) = std::fs::read_to_string(d.join("information")) else {
            continue;
        };
        if let Some(model) = info
            .lines()
            .find_map(|l| l.strip_prefix("Model:"))
            .map(str::trim)
        {
            csv.push_str(&format!("{model}, {driver}\n"));
        }
    }
    parse_smi(&csv)
}

/// The driver version in `/proc/driver/nvidia/version` ("NVRM version: NVIDIA UNIX x86_64
/// Kernel Module  550.54.15  ..."): the first word shaped like `N.N[.N]`.
fn driver_version(text: &str) -> Option<&str> {
    text.lines().next()?.split_whitespace().find(|w| {
        let parts: Vec<&str> = w.split('.').collect();
        parts.len() >= 2
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Parses `nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` (pure).
fn parse_smi(text: &str) -> Fingerprint {
    let mut models: BTreeMap<&str, usize> = BTreeMap::new();
    let mut drivers: Vec<&str> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (name, driver) = line.rsplit_once(',').unwrap_or((line, ""));
        *models.entry(name.trim()).or_default() += 1;
        let d = driver.trim();
        if !d.is_empty() && !drivers.contains(&d) {
            drivers.push(d);
        }
    }
    let mut f = Fingerprint::new();
    if models.is_empty() {
        return f;
    }
    let gpu: Vec<String> = models.iter().map(|(m, n)| format!("{n} x {m}")).collect();
    f.insert("gpu".into(), gpu.join(" + "));
    if !drivers.is_empty() {
        f.insert("gpu.driver".into(), drivers.join(", "));
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_cmd_that_hangs_is_a_timed_out_value_not_a_hung_start() {
        let env: BTreeMap<String, String> = [(
            "PATH".to_string(),
            std::env::var("PATH").unwrap_or_default(),
        )]
        .into();
        let t = std::time::Instant::now();
        let v = run_fingerprint_cmd("sleep 60", &env, Duration::from_millis(200));
        assert!(v.starts_with("(timed out after"), "{v}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert_eq!(
            run_fingerprint_cmd("echo sha256:abc", &env, Duration::from_secs(10)),
            "sha256:abc"
        );
        assert!(run_fingerprint_cmd("exit 3", &env, Duration::from_secs(10)).starts_with("(failed"));
    }

    #[test]
    fn only_the_variables_that_change_torch_are_kept() {
        let env: BTreeMap<String, String> = [
            ("NCCL_DEBUG", "INFO"),
            ("TORCH_NCCL_BLOCKING_WAIT", "1"),
            ("GLOO_SOCKET_IFNAME", "eth0"),
            ("TORCHELASTIC_RUN_ID", "x"),
            ("HOME", "/root"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let keys: Vec<String> = env_keys(&env).into_keys().collect();
        assert_eq!(
            keys,
            [
                "env.GLOO_SOCKET_IFNAME",
                "env.NCCL_DEBUG",
                "env.TORCH_NCCL_BLOCKING_WAIT"
            ]
        );
    }

    #[test]
    fn nvidia_smi_output_becomes_a_count_per_model_and_the_driver() {
        let f = parse_smi("NVIDIA H200, 550.54.15\nNVIDIA H200, 550.54.15\n");
        assert_eq!(f["gpu"], "2 x NVIDIA H200");
        assert_eq!(f["gpu.driver"], "550.54.15");
        let mixed = parse_smi("NVIDIA A100, 535.1\nNVIDIA H100, 535.1\n");
        assert_eq!(mixed["gpu"], "1 x NVIDIA A100 + 1 x NVIDIA H100");
        assert!(parse_smi("").is_empty());
    }

    #[test]
    fn the_drivers_proc_files_give_the_same_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::write(
            root.join("version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  4 11:00:00 UTC 2025\nGCC version:  gcc version 12.3.0\n",
        )
        .unwrap();
        for bus in ["0000:18:00.0", "0000:2a:00.0"] {
            let d = root.join("gpus").join(bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                "Model: \t\t NVIDIA H200\nIRQ:   \t\t 123\n",
            )
            .unwrap();
        }
        let f = proc_gpus(root);
        assert_eq!(f["gpu"], "2 x NVIDIA H200");
        assert_eq!(f["gpu.driver"], "570.124.06");
        assert!(proc_gpus(&root.join("absent")).is_empty());
    }
}
