//! A fixture `nvidia-smi`: a script first on `PATH` that answers the health query with rows a
//! test writes (the rows a real `nvidia-smi` prints for that query), the fingerprint's query
//! with one model, and `--query-compute-apps` with every process registered in its `holders`
//! directory (a file named by the pid) that is still alive: the driver lists a process with a
//! CUDA context until it exits.

use std::path::PathBuf;

pub const HEALTHY: &str = "0, 00000000:18:00.0, GPU-5f3c1d2a-0b1e-4c55-9a1d-7e2f3a4b5c6d, NVIDIA H200, 1, 143771, 0, 0x0000000000000001\n\
                       1, 00000000:3B:00.0, GPU-9a8b7c6d-1e2f-4a3b-8c9d-0e1f2a3b4c5d, NVIDIA H200, 1, 143771, 0, 0x0000000000000001\n";

/// GPU 1 has 2 uncorrectable ECC errors.
pub const ECC: &str = "0, 00000000:18:00.0, GPU-5f3c1d2a-0b1e-4c55-9a1d-7e2f3a4b5c6d, NVIDIA H200, 1, 143771, 0, 0x0000000000000001\n\
                   1, 00000000:3B:00.0, GPU-9a8b7c6d-1e2f-4a3b-8c9d-0e1f2a3b4c5d, NVIDIA H200, 1, 143771, 2, 0x0000000000000001\n";

/// A directory with a fake `nvidia-smi` answering from `gpus.csv` (written with `rows`) and
/// `holders/`.
pub struct FakeSmi {
    dir: tempfile::TempDir,
}

impl FakeSmi {
    /// The fixture with health rows `rows`.
    pub fn new(rows: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let s = FakeSmi { dir };
        s.set(rows);
        std::fs::create_dir(s.holders()).unwrap();
        let script = s.script();
        // A holder is listed while /proc has it and it is not a zombie (its memory is freed
        // when it exits, before its parent reaps it).
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ncase \"$*\" in\n  *name,driver_version*) echo 'NVIDIA H200, 550.54.15' ;;\n  *query-compute-apps*) for f in '{holders}'/*; do p=${{f##*/}}; [ -r /proc/$p/stat ] || continue; st=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1); [ -n \"$st\" ] && [ \"$st\" != Z ] && echo \"$p, 1024\"; done; true ;;\n  *) cat '{csv}' ;;\nesac\n",
                holders = s.holders().display(),
                csv = s.csv().display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        s
    }

    /// The fixture script itself (a test may replace it).
    pub fn script(&self) -> PathBuf {
        self.dir.path().join("nvidia-smi")
    }

    /// Where processes register as holding GPU memory (a file named by the pid).
    pub fn holders(&self) -> PathBuf {
        self.dir.path().join("holders")
    }

    /// The pids `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`
    /// lists, as a real one would be asked after a stop.
    pub fn compute_apps(&self) -> Vec<i32> {
        let out = std::process::Command::new(self.script())
            .args([
                "--query-compute-apps=pid,used_memory",
                "--format=csv,noheader,nounits",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(',').next()?.trim().parse().ok())
            .collect()
    }

    /// The health rows' file.
    pub fn csv(&self) -> PathBuf {
        self.dir.path().join("gpus.csv")
    }

    /// Replaces the rows, atomically (the agent may be reading them).
    pub fn set(&self, rows: &str) {
        let tmp = self.dir.path().join("gpus.csv.tmp");
        std::fs::write(&tmp, rows).unwrap();
        std::fs::rename(&tmp, self.csv()).unwrap();
    }

    /// `PATH` with the fake first.
    pub fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }
}
