//! End-to-end with real PyTorch (gloo on CPU): DDP training, and environment parity with torchrun.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::harness::{drun, read_json, root, run, torch_python, worker, DrunCmd};

fn loss_of(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in {line}"))
        .parse()
        .unwrap()
}

#[test]
fn ddp_example_trains_and_loss_falls() {
    let Some(python) = torch_python() else { return };
    let out_dir = tempfile::tempdir().unwrap();
    let mut c = drun();
    c.python(&python)
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(root().join("examples/train_ddp.py"))
        .arg("--out")
        .arg(out_dir.path());
    let (code, out, err) = run(c, Duration::from_secs(300));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let done = out
        .lines()
        .find(|l| l.starts_with("[rank0]:done "))
        .expect("done line");
    let (first, last) = (loss_of(done, "first_loss"), loss_of(done, "last_loss"));
    assert!(
        last < first * 0.2,
        "loss must fall clearly: {first} -> {last}"
    );
    assert!(done.contains("world_size=2"), "{done}");
    assert!(
        out_dir.path().join("final.pt").is_file(),
        "checkpoint saved"
    );
}

/// Variables every launcher run differs in, by design of the parity acceptance.
const EXPECTED_TO_DIFFER: &[&str] = &[
    "MASTER_PORT",
    "MASTER_ADDR",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
];

fn dump_env(launcher: Command, dir: &Path, ranks: u32) -> Vec<BTreeMap<String, Value>> {
    let (code, out, err) = run(launcher, Duration::from_secs(120));
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    (0..ranks)
        .map(|r| {
            let j = read_json(&dir.join(format!("env_{r}.json")));
            let mut m: BTreeMap<String, Value> =
                j["env"].as_object().unwrap().clone().into_iter().collect();
            let argv = j["argv"]
                .to_string()
                .replace(&*dir.to_string_lossy(), "{DIR}");
            m.insert("__argv".into(), Value::String(argv));
            m
        })
        .collect()
}

fn assert_parity(torchrun: &[BTreeMap<String, Value>], ours: &[BTreeMap<String, Value>]) {
    for (t, d) in torchrun.iter().zip(ours) {
        let t_keys: Vec<&String> = t.keys().filter(|k| !k.starts_with("DRUN_")).collect();
        let d_keys: Vec<&String> = d.keys().filter(|k| !k.starts_with("DRUN_")).collect();
        assert_eq!(t_keys, d_keys, "same variable names (besides DRUN_*)");
        for (k, v) in t {
            if !EXPECTED_TO_DIFFER.contains(&k.as_str()) {
                assert_eq!(&d[k], v, "value of {k}");
            }
        }
    }
}

fn parity_case(python: &Path, cwd: &Path, launcher_args: &[&str], entry: &[String]) {
    let torchrun = python.parent().unwrap().join("torchrun");
    let t_dir = tempfile::tempdir().unwrap();
    let d_dir = tempfile::tempdir().unwrap();
    let clean = |c: Command| {
        let mut c = crate::harness::clean_env(c);
        c.current_dir(cwd);
        c
    };
    let with_dir = |dir: &Path| -> Vec<String> {
        entry
            .iter()
            .map(|a| a.replace("{DIR}", &dir.to_string_lossy()))
            .collect()
    };
    let mut t = clean(Command::new(&torchrun));
    t.args(launcher_args).args(with_dir(t_dir.path()));
    let mut d = clean(drun());
    d.python(python)
        .args(launcher_args)
        .args(with_dir(d_dir.path()));
    let t_env = dump_env(t, t_dir.path(), 2);
    let d_env = dump_env(d, d_dir.path(), 2);
    assert_parity(&t_env, &d_env);
}

#[test]
fn environment_matches_torchrun_for_script_module_and_no_python() {
    let Some(python) = torch_python() else { return };
    let std_args = ["--standalone", "--nproc-per-node", "2"];
    // A plain script, with arguments that look like launcher flags after it.
    parity_case(
        &python,
        root(),
        &std_args,
        &[
            worker("envdump.py"),
            "{DIR}".into(),
            "--nproc-per-node".into(),
            "7".into(),
            "${local_rank}".into(),
        ],
    );
    // -m module, run from the package's parent directory.
    let mut m_args = std_args.to_vec();
    m_args.push("-m");
    parity_case(
        &python,
        &root().join("tests/workers"),
        &m_args,
        &["drunpkg.envmod".into(), "{DIR}".into()],
    );
    // --no-python: the interpreter itself is the executable.
    let mut np_args = std_args.to_vec();
    np_args.push("--no-python");
    parity_case(
        &python,
        root(),
        &np_args,
        &[
            python.to_string_lossy().into_owned(),
            worker("envdump.py"),
            "{DIR}".into(),
        ],
    );
}
