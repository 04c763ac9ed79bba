//! The persister: a thread that writes staged checkpoint files to `--ckpt-dir` behind the
//! training, one step at a time, throttled ([`super::decide::pause`]); each file is copied to
//! a temporary file next to its place, fsynced, renamed, its directory fsynced, dropped from the
//! page cache and read back to compare its SHA-256 with the rank's. The thin I/O driver of the
//! decisions in [`super::decide`]; the agent's loop receives each step's [`Done`].

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::decide::{pause, Key};

/// Bytes copied between two looks at the throttle.
const CHUNK: usize = 8 << 20;

/// Longest sleep of the throttle between two looks at its rate, which the agent may change
/// while a file is being written ([`Rate::set`]).
const RECHECK: Duration = Duration::from_millis(50);

/// The persister's throttle, bytes per second (0: no limit), shared with the agent: it can
/// change while a step is being written, and the write follows within [`RECHECK`].
#[derive(Debug, Clone)]
pub struct Rate(Arc<AtomicU64>);

impl Rate {
    pub fn new(bytes_per_s: u64) -> Self {
        Self(Arc::new(AtomicU64::new(bytes_per_s)))
    }

    pub fn set(&self, bytes_per_s: u64) {
        self.0.store(bytes_per_s, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub use super::leftover::TEMP_PREFIX;

/// Longest part of the file's own name a temporary file's name repeats (file names end at 255
/// bytes; the owner's token and the random tail take about 70).
const NAME_IN_TEMP: usize = 120;

/// The prefix of a temporary file for `name`: [`TEMP_PREFIX`], the owner's token when `/proc`
/// says who this is, and the name (cut to [`NAME_IN_TEMP`] bytes).
fn temp_prefix(name: &str) -> String {
    let mut cut = name.len().min(NAME_IN_TEMP);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let name = &name[..cut];
    match super::leftover::Owner::me() {
        Some(o) => format!("{TEMP_PREFIX}{}-{name}-", o.token()),
        None => format!("{TEMP_PREFIX}{name}-"),
    }
}

/// One staged file and where it belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedFile {
    /// In the staging directory.
    pub staged: PathBuf,
    /// Its place in `--ckpt-dir` (the path the commit reported).
    pub target: PathBuf,
    /// Size, bytes.
    pub bytes: u64,
    /// SHA-256 the rank computed, lowercase hex; empty when the rank left it to the agent (the
    /// persister hashes the staged copy while it copies it).
    pub sha256: String,
}

/// One step to persist.
#[derive(Debug, Clone)]
pub struct Job {
    /// The step.
    pub key: Key,
    /// Its files on this node.
    pub files: Vec<StagedFile>,
    /// Bytes per second at most (0: no limit), as it is while the step is written.
    pub rate: Rate,
}

/// A step's outcome.
#[derive(Debug)]
pub struct Done {
    /// The step.
    pub key: Key,
    /// How long writing took and each file's SHA-256 (in the job's order), or one line naming
    /// the file that failed and why.
    pub result: Result<(Duration, Vec<String>), String>,
}

/// The persister thread; it ends when this is dropped (after the step it is writing).
pub struct Persister {
    jobs: std::sync::mpsc::Sender<Job>,
}

impl Persister {
    /// Starts the thread; outcomes arrive on the returned channel.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start() -> std::io::Result<(Self, mpsc::UnboundedReceiver<Done>)> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let (tx, done) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("drun-persist".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let began = Instant::now();
                    let result = job
                        .files
                        .iter()
                        .map(|f| persist_file(f, &job.rate))
                        .collect::<Result<Vec<String>, String>>()
                        .map(|digests| (began.elapsed(), digests));
                    if tx
                        .send(Done {
                            key: job.key,
                            result,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            })?;
        Ok((Self { jobs }, done))
    }

    /// Queues `job`.
    pub fn submit(&self, job: Job) {
        let _ = self.jobs.send(job);
    }
}

/// Writes `f` to its place in `--ckpt-dir` at no more than `rate` bytes per second (0: no
/// limit; a change of `rate` applies to the rest of the file), hashing the staged bytes as it copies them, and verifies the file there: its SHA-256
/// read back from disk must equal the staged copy's (and the rank's, when it gave one).
/// Returns the SHA-256.
///
/// # Errors
/// One line naming the file: the staged copy unreadable, of another size or digest than the
/// rank reported, the directory unwritable, the digest read back differs (the file is then
/// removed from its place).
pub fn persist_file(f: &StagedFile, rate: &Rate) -> Result<String, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        format!("cannot persist {}: {what}: {e}", f.target.display())
    };
    let dir = f.target.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|e| fail("cannot create its directory", &e))?;
    let mut src =
        std::fs::File::open(&f.staged).map_err(|e| fail("the staged copy is gone", &e))?;
    let name = f
        .target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&temp_prefix(&name))
        .tempfile_in(dir)
        .map_err(|e| fail("cannot create a temporary file", &e))?;
    let began = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    let mut written = 0u64;
    let mut h = Sha256::new();
    loop {
        let n = src
            .read(&mut buf)
            .map_err(|e| fail("reading the staged copy", &e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(|e| fail("writing", &e))?;
        written += n as u64;
        loop {
            let wait = pause(written, began.elapsed(), rate.get());
            if wait.is_zero() {
                break;
            }
            std::thread::sleep(wait.min(RECHECK));
        }
    }
    if written != f.bytes {
        return Err(fail(
            "the staged copy has another size",
            &format!("{written} bytes, the commit says {}", f.bytes),
        ));
    }
    let staged = hex(&h.finalize());
    if !f.sha256.is_empty() && staged != f.sha256 {
        return Err(fail(
            "the staged copy's SHA-256 differs from the rank's",
            &format!("{staged} != {}", f.sha256),
        ));
    }
    tmp.as_file().sync_all().map_err(|e| fail("fsync", &e))?;
    tmp.persist(&f.target)
        .map_err(|e| fail("rename into place", &e.error))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    let digest = read_back(&f.target).map_err(|e| fail("reading it back", &e))?;
    if digest != staged {
        let _ = std::fs::remove_file(&f.target);
        return Err(fail(
            "its SHA-256 read back from disk differs from the staged copy's",
            &format!("{digest} != {staged}"),
        ));
    }
    Ok(staged)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `path` as the disk holds it: its pages are dropped from the cache first (fsynced
/// already), so the bytes come from the device.
fn read_back(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let _ = nix::fcntl::posix_fadvise(
        &file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(dir: &Path, bytes: &[u8]) -> StagedFile {
        let stage = dir.join("stage/run/step-1-g1");
        std::fs::create_dir_all(&stage).unwrap();
        std::fs::write(stage.join("rank0.pt"), bytes).unwrap();
        let sha: String = Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        StagedFile {
            staged: stage.join("rank0.pt"),
            target: dir.join("ckpt/run/step-1-g1/rank0.pt"),
            bytes: bytes.len() as u64,
            sha256: sha,
        }
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(TEMP_PREFIX))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_file_lands_in_place_verified_with_no_temporary_left() {
        let d = tempfile::tempdir().unwrap();
        let f = staged(d.path(), &vec![7u8; 3 * CHUNK + 5]);
        assert_eq!(persist_file(&f, &Rate::new(0)).unwrap(), f.sha256);
        let mut left_to_the_agent = f.clone();
        left_to_the_agent.sha256.clear();
        assert_eq!(
            persist_file(&left_to_the_agent, &Rate::new(0)).unwrap(),
            f.sha256
        );
        assert_eq!(std::fs::read(&f.target).unwrap(), vec![7u8; 3 * CHUNK + 5]);
        assert!(leftovers(f.target.parent().unwrap()).is_empty());
    }

    #[test]
    fn a_digest_that_differs_leaves_nothing_in_place() {
        let d = tempfile::tempdir().unwrap();
        let mut f = staged(d.path(), b"state");
        f.sha256 = "0".repeat(64);
        let e = persist_file(&f, &Rate::new(0)).unwrap_err();
        assert!(e.contains("differs from the rank's"), "{e}");
        assert!(!f.target.exists());
        let mut g = staged(d.path(), b"state");
        g.bytes = 99;
        let e = persist_file(&g, &Rate::new(0)).unwrap_err();
        assert!(e.contains("another size"), "{e}");
        assert!(!g.target.exists());
        assert!(leftovers(g.target.parent().unwrap()).is_empty());
        std::fs::remove_file(&g.staged).unwrap();
        assert!(persist_file(&g, &Rate::new(0))
            .unwrap_err()
            .contains("staged copy is gone"));
    }

    #[test]
    fn the_rate_limit_holds() {
        let d = tempfile::tempdir().unwrap();
        let f = staged(d.path(), &vec![1u8; 2 << 20]);
        let t = Instant::now();
        persist_file(&f, &Rate::new(8 << 20)).unwrap(); // 2 MiB at 8 MiB/s: at least 250 ms
        assert!(
            t.elapsed() >= Duration::from_millis(240),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_rate_lifted_mid_file_applies_to_the_rest_of_it() {
        let d = tempfile::tempdir().unwrap();
        let f = staged(d.path(), &vec![1u8; 64 << 10]);
        // 64 KiB at 1 KiB/s would take a minute; lifted after 200 ms, it ends at once.
        let rate = Rate::new(1 << 10);
        let lift = rate.clone();
        let t = Instant::now();
        let lifter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            lift.set(0);
        });
        assert_eq!(persist_file(&f, &rate).unwrap(), f.sha256);
        lifter.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert!(
            t.elapsed() >= Duration::from_millis(190),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_temporary_file_names_its_owner_and_a_cut_name() {
        let me = super::super::leftover::Owner::me().expect("/proc says who this is");
        let p = temp_prefix("rank0.pt");
        assert_eq!(p, format!("{TEMP_PREFIX}{}-rank0.pt-", me.token()));
        assert_eq!(
            super::super::leftover::Owner::of_file(&format!("{p}Ab12Cd")).as_ref(),
            Some(me)
        );
        let long = "é".repeat(200);
        assert!(
            temp_prefix(&long).len() <= TEMP_PREFIX.len() + me.token().len() + 2 + NAME_IN_TEMP
        );
    }

    #[tokio::test]
    async fn the_thread_reports_each_step() {
        let d = tempfile::tempdir().unwrap();
        let f = staged(d.path(), b"abc");
        let (p, mut done) = Persister::start().unwrap();
        p.submit(Job {
            key: (1, 1),
            files: vec![f.clone()],
            rate: Rate::new(0),
        });
        let r = done.recv().await.unwrap();
        assert_eq!(r.key, (1, 1));
        assert_eq!(r.result.unwrap().1, std::slice::from_ref(&f.sha256));
        assert_eq!(std::fs::read(&f.target).unwrap(), b"abc");
    }
}
