//! What an operator asks of a `--ckpt-dir` with no agent running (`drun-ckpt list`,
//! `drun-ckpt verify`): which sealed checkpoints it holds and which one `latest` names, and
//! whether a checkpoint's files are still the bytes its manifest recorded — before a relaunch
//! or a `--ckpt-resume-from`, without reading manifest files by hand.

use std::path::{Path, PathBuf};

use drun_rendezvous::human::{bytes, duration};
use drun_rendezvous::Manifest;

use super::fallback::BAD_SUFFIX;
use super::LATEST_FILE;

/// How deep below the directory manifests are looked for: `<dir>/<run id>/<step dir>/`.
const DEPTH: usize = 3;

/// One manifest file found.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    /// The manifest file.
    pub file: PathBuf,
    /// What it records.
    pub manifest: Manifest,
    /// A `latest` pointer in the directory (its own, or its run's) names it.
    pub latest: bool,
    /// Marked bad (it failed verification at a resume: `<file>.bad`).
    pub bad: bool,
}

/// Every manifest file under `dir` (sealed ones and those marked bad), oldest first within
/// each run; files that do not decode are skipped.
///
/// # Errors
/// `dir` cannot be read.
pub fn list(dir: &Path) -> std::io::Result<Vec<Listed>> {
    std::fs::read_dir(dir)?;
    let mut files = Vec::new();
    walk(dir, DEPTH, &mut files);
    let latest: Vec<PathBuf> = pointers(dir, DEPTH)
        .iter()
        .filter_map(|p| pointed(p))
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let mut out: Vec<Listed> = files
        .into_iter()
        .filter_map(|file| {
            let manifest = serde_json::from_slice(&std::fs::read(&file).ok()?).ok()?;
            let bad = file.to_string_lossy().ends_with(BAD_SUFFIX);
            let latest = std::fs::canonicalize(&file).is_ok_and(|c| latest.contains(&c));
            Some(Listed {
                file,
                manifest,
                latest,
                bad,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        let key = |l: &Listed| {
            (
                l.manifest.run_id.clone(),
                l.manifest.step,
                l.manifest.generation,
            )
        };
        key(a).cmp(&key(b))
    });
    Ok(out)
}

/// The manifest files (`drun-manifest-*.json`, and `.bad` ones) under `dir`, `depth` levels.
fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() && depth > 0 {
            walk(&p, depth - 1, out);
        } else if name.starts_with("drun-manifest-")
            && (name.ends_with(".json") || name.ends_with(&format!(".json{BAD_SUFFIX}")))
        {
            out.push(p);
        }
    }
}

/// The `latest` pointer files under `dir` (its own and its runs').
fn pointers(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let mut out = vec![dir.join(LATEST_FILE)];
    if depth > 0 {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                out.push(e.path().join(LATEST_FILE));
            }
        }
    }
    out.retain(|p| p.is_file());
    out
}

/// The manifest file a `latest` pointer names (relative to its directory, or absolute).
fn pointed(pointer: &Path) -> Option<PathBuf> {
    let line = std::fs::read_to_string(pointer).ok()?;
    let p = PathBuf::from(line.trim());
    Some(if p.is_absolute() {
        p
    } else {
        pointer.parent()?.join(p)
    })
}

/// The listing as lines for a terminal, at `now_ms` (ms since the Unix epoch): a header, one
/// row per checkpoint (run, step, generation, world size, files, size, sealed how long ago,
/// `latest` / `bad`), and the manifest file of each.
pub fn render(list: &[Listed], now_ms: u64) -> Vec<String> {
    if list.is_empty() {
        return vec!["no sealed checkpoint here (no drun-manifest-*.json file)".into()];
    }
    let run_width = list
        .iter()
        .map(|l| l.manifest.run_id.chars().count())
        .max()
        .unwrap_or(3)
        .max(3);
    let mut out = vec![format!(
        "{:<run_width$}  {:>8}  {:>4}  {:>5}  {:>5}  {:>10}  {:>10}  MANIFEST",
        "RUN", "STEP", "GEN", "WORLD", "FILES", "SIZE", "SEALED"
    )];
    for l in list {
        let m = &l.manifest;
        let ago = std::time::Duration::from_millis(now_ms.saturating_sub(m.sealed_at_ms));
        let mark = match (l.latest, l.bad) {
            (_, true) => "  bad",
            (true, false) => "  latest",
            _ => "",
        };
        out.push(format!(
            "{:<run_width$}  {:>8}  {:>4}  {:>5}  {:>5}  {:>10}  {:>10}  {}{mark}",
            m.run_id,
            m.step,
            m.generation,
            m.world_size,
            m.files.len(),
            bytes(m.bytes()),
            format!("{} ago", duration(ago)),
            l.file.display(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::ShardFile;

    fn manifest(run: &str, step: u64, dir: &Path) -> Manifest {
        let path = dir.join(format!("rank0-{step}.pt"));
        std::fs::write(&path, b"abc").unwrap();
        Manifest {
            run_id: run.into(),
            step,
            generation: 1,
            world_size: 2,
            cursor: Default::default(),
            files: vec![ShardFile {
                rank: 0,
                path: path.display().to_string(),
                bytes: 3,
                digest: String::new(),
            }],
            sealed_at_ms: 1_000,
            adopted_from: None,
            save_ms: None,
            stall_ms: None,
        }
    }

    fn write(dir: &Path, m: &Manifest, suffix: &str) -> PathBuf {
        let step_dir = dir.join(&m.run_id).join(format!("step-{}", m.step));
        std::fs::create_dir_all(&step_dir).unwrap();
        let file = step_dir.join(format!("{}{suffix}", m.file_name()));
        std::fs::write(&file, serde_json::to_vec(m).unwrap()).unwrap();
        file
    }

    #[test]
    fn every_sealed_checkpoint_is_listed_with_latest_and_bad_marked() {
        let d = tempfile::tempdir().unwrap();
        let f4 = write(d.path(), &manifest("r1", 4, d.path()), "");
        let f8 = write(d.path(), &manifest("r1", 8, d.path()), BAD_SUFFIX);
        let f6 = write(d.path(), &manifest("r1", 6, d.path()), "");
        write(d.path(), &manifest("r0", 2, d.path()), "");
        std::fs::write(d.path().join("r1/junk.json"), b"{").unwrap();
        // The run's own pointer is relative to the run's directory.
        std::fs::write(
            d.path().join("r1").join(LATEST_FILE),
            "step-6/drun-manifest-6-1.json",
        )
        .unwrap();
        let got = list(d.path()).unwrap();
        let rows: Vec<(&str, u64, bool, bool)> = got
            .iter()
            .map(|l| (l.manifest.run_id.as_str(), l.manifest.step, l.latest, l.bad))
            .collect();
        assert_eq!(
            rows,
            [
                ("r0", 2, false, false),
                ("r1", 4, false, false),
                ("r1", 6, true, false),
                ("r1", 8, false, true),
            ]
        );
        assert_eq!(got[1].file, f4);
        assert_eq!(got[2].file, f6);
        assert_eq!(got[3].file, f8);
        let lines = render(&got, 61_000);
        assert!(lines[0].starts_with("RUN "), "{lines:?}");
        assert!(
            lines[3].contains(" 6 ") && lines[3].ends_with("latest"),
            "{lines:?}"
        );
        assert!(
            lines[3].contains("3 B") && lines[3].contains("60 s ago"),
            "{lines:?}"
        );
        assert!(lines[4].ends_with("bad"), "{lines:?}");
    }

    #[test]
    fn an_empty_directory_says_so_and_a_missing_one_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let got = list(d.path()).unwrap();
        assert_eq!(
            render(&got, 0),
            ["no sealed checkpoint here (no drun-manifest-*.json file)"]
        );
        assert!(list(&d.path().join("nope")).is_err());
    }
}
