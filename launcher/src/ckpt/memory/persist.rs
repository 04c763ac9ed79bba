//! The persister: a thread that writes staged checkpoint files to `--ckpt-dir` behind the
//! training, one step at a time. Each file is written to a temporary file next to its place a
//! slice at a time: read once from the staged copy, hashed (BLAKE3, or the function of the
//! rank's digest when it gave one: [`crate::ckpt::digest`]), written with `O_DIRECT`
//! (no page cache, so no writeback by the kernel's threads and nothing to drop) and read back
//! from the device and compared at once; it is fsynced, its digest checked against the
//! rank's when it gave one, then renamed into place and its directory fsynced (through the
//! page cache, its writeback started as it goes, where the file system refuses `O_DIRECT`).
//! Throttled: a byte rate ([`super::pace::pause`]), and while the node's CPUs are busy with
//! the training the persister keeps to a small share of one CPU in the idle I/O class
//! ([`super::pace::pace`]), up to a lag bound, at full speed at the run's end. The thin I/O
//! driver of the decisions in [`super::decide`]; the agent's loop receives each step's
//! [`Done`]. The thread's pacing is `persist/pacer.rs`, the device's side (aligned buffers,
//! `O_DIRECT` writes, read-backs) `persist/disk.rs`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::decide::Key;
use super::pace::PaceParams;
use crate::ckpt::digest::Hasher;
use disk::{
    drop_pages, read_back, read_back_at, read_full_at, Aligned, Disk, Written, ALIGN, SLICE,
};

mod disk;
mod error;
mod pacer;

pub use error::{PersistError, PersistFailure};
pub use pacer::{Pacer, Throttle};

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
    /// The digest the rank took (a SHA-256, as a manifest spells it); empty when the rank left
    /// it to the agent (the persister then takes a BLAKE3, and compares the bytes read back
    /// with the staged copy's).
    pub digest: String,
}

/// One step to persist.
#[derive(Debug, Clone)]
pub struct Job {
    /// The step.
    pub key: Key,
    /// Its files on this node.
    pub files: Vec<StagedFile>,
    /// The throttle, as it is while the step is written.
    pub throttle: Throttle,
    /// When the step was staged (its lag counts from then).
    pub staged_at: Instant,
}

/// A step's outcome.
#[derive(Debug)]
pub struct Done {
    /// The step.
    pub key: Key,
    /// How long writing took and each file's digest (in the job's order), or the file that
    /// failed and why.
    pub result: Result<(Duration, Vec<String>), PersistError>,
}

/// The persister thread; it ends when this is dropped (after the step it is writing), or
/// at once when [`Persister::stop`] is called.
pub struct Persister {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Persister {
    /// Starts the thread, sharing the CPU with the training as `params` say; outcomes arrive on
    /// the returned channel.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(params: PaceParams) -> std::io::Result<(Self, mpsc::UnboundedReceiver<Done>)> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let (tx, done) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("drun-persist".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    if job.throttle.stopped() {
                        return;
                    }
                    let began = Instant::now();
                    let mut pacer = Pacer::new(params, job.staged_at);
                    let result = job
                        .files
                        .iter()
                        .map(|f| persist_file(f, &job.throttle, &mut pacer))
                        .collect::<Result<Vec<String>, PersistError>>()
                        .map(|digests| (began.elapsed(), digests));
                    pacer.finish();
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
        Ok((
            Self {
                jobs: Some(jobs),
                thread: Some(thread),
            },
            done,
        ))
    }

    /// Queues `job`.
    pub fn submit(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(job);
        }
    }

    /// The agent exits: `throttle` (the jobs' own) is stopped, the file being written is
    /// given up and its temporary file removed, and the thread is waited for, at most
    /// `within`. An agent that exited mid-write left its temporary file behind, and the next
    /// agent on the node reported it as a killed agent's.
    pub fn stop(&mut self, throttle: &Throttle, within: Duration) {
        throttle.stop();
        self.jobs = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + within;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if thread.is_finished() {
            let _ = thread.join();
        }
    }
}

/// Writes `f` to its place in `--ckpt-dir`, throttled by `throttle` and `pacer` (a change of
/// either applies to the rest of the file), and verifies it on disk before it takes its place:
/// the bytes read back from the device must equal the staged copy's (and their digest the
/// rank's, when it gave one). Returns the digest of the file, as a manifest spells it.
///
/// Each slice of the staged copy is read once into a buffer, hashed there, written from it
/// with `O_DIRECT` (no page cache: no writeback by the kernel's threads, nothing to drop) and
/// read back from the device with `O_DIRECT` into a second buffer and compared; the last
/// partial block goes through the page cache and is read back after the fsync. Where the file
/// system refuses `O_DIRECT` the slices are written through the page cache, their writeback
/// started as the copy goes and their pages dropped once on disk, and the file is read back
/// (its pages dropped first) after the fsync and compared with the staged copy.
///
/// # Errors
/// The file and what failed: the staged copy unreadable or of another size than the rank
/// reported, the directory unwritable, the bytes read back differ (nothing is then put in
/// place).
pub fn persist_file(
    f: &StagedFile,
    throttle: &Throttle,
    pacer: &mut Pacer,
) -> Result<String, PersistError> {
    persist_file_as(f, throttle, pacer, true)
}

/// [`persist_file`], with `O_DIRECT` tried (`direct`) or not.
fn persist_file_as(
    f: &StagedFile,
    throttle: &Throttle,
    pacer: &mut Pacer,
    direct: bool,
) -> Result<String, PersistError> {
    let fail = |failure| PersistError {
        target: f.target.clone(),
        failure,
    };
    let differ = |at: u64| fail(PersistFailure::Differs { at });
    let dir = f.target.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|e| fail(PersistFailure::CreateDir(e)))?;
    let src = std::fs::File::open(&f.staged).map_err(|e| fail(PersistFailure::StagedGone(e)))?;
    let name = f
        .target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix(&temp_prefix(&name))
        .tempfile_in(dir)
        .map_err(|e| fail(PersistFailure::TempFile(e)))?;
    let mut disk = Disk::open(tmp.as_file(), tmp.path(), direct);
    let mut ours = Aligned::new(SLICE);
    let mut theirs = Aligned::new(SLICE);
    let mut h = Hasher::like(&f.digest);
    let began = Instant::now();
    let mut written = 0u64;
    // The last partial block (written through the page cache) and where it starts.
    let mut tail: Option<(u64, Vec<u8>)> = None;
    loop {
        let n = read_full_at(&src, ours.get(SLICE), written)
            .map_err(|e| fail(PersistFailure::Read(e)))?;
        if n == 0 {
            break;
        }
        let slice = &ours.get(SLICE)[..n];
        h.update(slice);
        match disk
            .write(slice, written, theirs.get(SLICE))
            .map_err(|e| fail(PersistFailure::Write(e)))?
        {
            Written::Verified { rest: 0 } | Written::Buffered => {}
            Written::Verified { rest } => {
                tail = Some((written + (n - rest) as u64, slice[n - rest..].to_vec()));
            }
            Written::Differs { at } => return Err(differ(written + at)),
        }
        written += n as u64;
        pacer.after_slice(n, throttle, Some((written, began)));
        if throttle.stopped() {
            // `tmp` is removed as it drops.
            return Err(fail(PersistFailure::Stopped));
        }
        if n < SLICE {
            break;
        }
    }
    if written != f.bytes {
        return Err(fail(PersistFailure::Size {
            written,
            expected: f.bytes,
        }));
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| fail(PersistFailure::Fsync(e)))?;
    let verified = match (&disk, tail) {
        (Disk::Direct { direct, .. }, Some((at, bytes))) => {
            drop_pages(tmp.as_file(), at, 0);
            read_back_at(direct, at, &bytes, theirs.get(ALIGN))
        }
        (Disk::Direct { .. }, None) => Ok(Ok(())),
        (Disk::Buffered { .. }, _) => {
            drop_pages(tmp.as_file(), 0, 0);
            read_back(tmp.path(), written, &src, |n| {
                pacer.after_slice(n, throttle, None)
            })
        }
    };
    drop(disk);
    verified
        .map_err(|e| fail(PersistFailure::ReadBack(e)))?
        .map_err(differ)?;
    let digest = h.finish().to_string();
    if !f.digest.is_empty() && digest != f.digest {
        return Err(fail(PersistFailure::Digest {
            got: digest,
            want: f.digest.clone(),
        }));
    }
    tmp.persist(&f.target)
        .map_err(|e| fail(PersistFailure::Rename(e.error)))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ckpt::digest::DigestKind;
    use pacer::tests::full;

    /// The digest of `bytes` taken with `kind`, as a manifest spells it.
    fn digest_of(bytes: &[u8], kind: DigestKind) -> String {
        let mut h = Hasher::new(kind);
        h.update(bytes);
        h.finish().to_string()
    }

    /// A staged file of `bytes` whose rank gave its SHA-256.
    fn staged(dir: &Path, bytes: &[u8]) -> StagedFile {
        let stage = dir.join("stage/run/step-1-g1");
        std::fs::create_dir_all(&stage).unwrap();
        std::fs::write(stage.join("rank0.pt"), bytes).unwrap();
        let sha = digest_of(bytes, DigestKind::Sha256);
        StagedFile {
            staged: stage.join("rank0.pt"),
            target: dir.join("ckpt/run/step-1-g1/rank0.pt"),
            bytes: bytes.len() as u64,
            digest: sha,
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
        let f = staged(d.path(), &vec![7u8; 3 * SLICE + 5]);
        assert_eq!(
            persist_file(&f, &Throttle::new(0), &mut full()).unwrap(),
            f.digest
        );
        // A rank that left its digest to the agent: the agent's own function.
        let mut left_to_the_agent = f.clone();
        left_to_the_agent.digest.clear();
        assert_eq!(
            persist_file(&left_to_the_agent, &Throttle::new(0), &mut full()).unwrap(),
            digest_of(&vec![7u8; 3 * SLICE + 5], DigestKind::Blake3)
        );
        assert_eq!(std::fs::read(&f.target).unwrap(), vec![7u8; 3 * SLICE + 5]);
        assert!(leftovers(f.target.parent().unwrap()).is_empty());
    }

    #[test]
    fn a_digest_that_differs_leaves_nothing_in_place() {
        let d = tempfile::tempdir().unwrap();
        let mut f = staged(d.path(), b"state");
        f.digest = "0".repeat(64);
        let e = persist_file(&f, &Throttle::new(0), &mut full()).unwrap_err();
        assert!(
            matches!(e.failure, PersistFailure::Digest { ref want, .. } if *want == f.digest),
            "{e}"
        );
        assert!(e.to_string().contains("differs from the rank's"), "{e}");
        assert!(!f.target.exists());
        let mut g = staged(d.path(), b"state");
        g.bytes = 99;
        let e = persist_file(&g, &Throttle::new(0), &mut full()).unwrap_err();
        assert!(
            matches!(
                e.failure,
                PersistFailure::Size {
                    written: 5,
                    expected: 99
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "cannot persist {}: the staged copy has another size: 5 bytes, the commit says 99",
                g.target.display()
            )
        );
        assert!(!g.target.exists());
        assert!(leftovers(g.target.parent().unwrap()).is_empty());
        std::fs::remove_file(&g.staged).unwrap();
        let e = persist_file(&g, &Throttle::new(0), &mut full()).unwrap_err();
        assert!(matches!(e.failure, PersistFailure::StagedGone(_)), "{e}");
        assert!(e.to_string().contains("staged copy is gone"), "{e}");
    }

    #[test]
    fn the_rate_limit_holds() {
        let d = tempfile::tempdir().unwrap();
        let f = staged(d.path(), &vec![1u8; 2 << 20]);
        let t = Instant::now();
        persist_file(&f, &Throttle::new(8 << 20), &mut full()).unwrap(); // 2 MiB at 8 MiB/s: at least 250 ms
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
        let rate = Throttle::new(1 << 10);
        let lift = rate.clone();
        let t = Instant::now();
        let lifter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            lift.set_rate(0);
        });
        assert_eq!(persist_file(&f, &rate, &mut full()).unwrap(), f.digest);
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

    #[test]
    fn a_file_lands_the_same_through_the_page_cache_where_o_direct_is_refused() {
        let d = tempfile::tempdir().unwrap();
        for len in [0, 100, ALIGN, 3 * ALIGN + 1, SLICE, 2 * SLICE + ALIGN + 9] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            let f = staged(d.path(), &bytes);
            for direct in [true, false] {
                let _ = std::fs::remove_file(&f.target);
                let digest = persist_file_as(&f, &Throttle::new(0), &mut full(), direct)
                    .unwrap_or_else(|e| panic!("{len} bytes, direct {direct}: {e}"));
                assert_eq!(digest, f.digest, "{len} bytes, direct {direct}");
                assert!(
                    std::fs::read(&f.target).unwrap() == bytes,
                    "{len} bytes, direct {direct}"
                );
            }
        }
        assert!(leftovers(d.path().join("ckpt/run/step-1-g1").as_path()).is_empty());
    }

    #[tokio::test]
    async fn the_thread_reports_each_step() {
        let d = tempfile::tempdir().unwrap();
        let f = staged(d.path(), b"abc");
        let (p, mut done) = Persister::start(PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        })
        .unwrap();
        p.submit(Job {
            key: (1, 1),
            files: vec![f.clone()],
            throttle: Throttle::new(0),
            staged_at: Instant::now(),
        });
        let r = done.recv().await.unwrap();
        assert_eq!(r.key, (1, 1));
        assert_eq!(r.result.unwrap().1, std::slice::from_ref(&f.digest));
        assert_eq!(std::fs::read(&f.target).unwrap(), b"abc");
    }

    #[tokio::test]
    async fn a_stopped_persister_gives_up_its_file_at_once_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        // 8 MiB at 64 KiB/s: two minutes of writing, stopped in its first slice's pause.
        let f = staged(d.path(), &vec![7u8; 8 << 20]);
        let (mut p, mut done) = Persister::start(PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        })
        .unwrap();
        let throttle = Throttle::new(64 << 10);
        p.submit(Job {
            key: (1, 1),
            files: vec![f.clone()],
            throttle: throttle.clone(),
            staged_at: Instant::now(),
        });
        let dir = f.target.parent().unwrap().to_path_buf();
        let temps = || {
            std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX))
                .count()
        };
        let t = Instant::now();
        while temps() == 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(temps(), 1, "the write began");
        let t = Instant::now();
        p.stop(&throttle, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        let r = done.recv().await.unwrap();
        assert!(
            matches!(&r.result, Err(e) if matches!(e.failure, PersistFailure::Stopped)),
            "{:?}",
            r.result
        );
        assert_eq!(temps(), 0, "the temporary file went with the stop");
        assert!(!f.target.exists());
    }
}
