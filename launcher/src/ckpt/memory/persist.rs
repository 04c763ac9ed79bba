//! The persister: a thread that writes staged checkpoint files to `--ckpt-dir` behind the
//! training, one step at a time. Each file is written to a temporary file next to its place a
//! slice at a time: read once from the staged copy, hashed (SHA-256), written with `O_DIRECT`
//! (no page cache, so no writeback by the kernel's threads and nothing to drop) and read back
//! from the device and compared at once; it is fsynced, its SHA-256 checked against the
//! rank's when it gave one, then renamed into place and its directory fsynced (through the
//! page cache, its writeback started as it goes, where the file system refuses `O_DIRECT`).
//! Throttled: a byte rate ([`super::pace::pause`]), and while the node's CPUs are busy with
//! the training the persister keeps to a small share of one CPU in the idle I/O class
//! ([`super::pace::pace`]), up to a lag bound, at full speed at the run's end. The thin I/O
//! driver of the decisions in [`super::decide`]; the agent's loop receives each step's
//! [`Done`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::decide::Key;
use super::pace::{pace, pause, spare_cpu, Pace, PaceInput, PaceParams};
use crate::os::background::{self, IoClass};
use disk::{
    drop_pages, read_back, read_back_at, read_full_at, Aligned, Disk, Written, ALIGN, SLICE,
};

mod disk;
mod error;

pub use error::{PersistError, PersistFailure};

/// Longest sleep of the throttle between two looks at its rate, which the agent may change
/// while a file is being written ([`Throttle::set_rate`]).
const RECHECK: Duration = Duration::from_millis(50);

/// The window over which the persister judges whether the node has a CPU to spare
/// ([`super::pace::spare_cpu`]; `/proc/stat` counts in ticks of 10 ms).
const CPU_WINDOW: Duration = Duration::from_millis(250);

/// The persister's throttle, shared with the agent: a byte rate (0: no limit) and whether the
/// agent asks for full speed (the run's end, a step waiting behind); both can change while a
/// step is being written, and the write follows within [`RECHECK`].
#[derive(Debug, Clone, Default)]
pub struct Throttle {
    rate: Arc<AtomicU64>,
    urgent: Arc<AtomicBool>,
}

impl Throttle {
    /// A throttle of `bytes_per_s` (0: no limit).
    pub fn new(bytes_per_s: u64) -> Self {
        Self {
            rate: Arc::new(AtomicU64::new(bytes_per_s)),
            urgent: Arc::default(),
        }
    }

    pub fn set_rate(&self, bytes_per_s: u64) {
        self.rate.store(bytes_per_s, Ordering::Relaxed);
    }

    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    /// Full speed (`true`) or yielding the CPU to the training while it is busy.
    pub fn set_urgent(&self, urgent: bool) {
        self.urgent.store(urgent, Ordering::Relaxed);
    }

    pub fn urgent(&self) -> bool {
        self.urgent.load(Ordering::Relaxed)
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
    /// persister then compares the bytes read back with the staged copy's).
    pub sha256: String,
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
    /// How long writing took and each file's SHA-256 (in the job's order), or the file that
    /// failed and why.
    pub result: Result<(Duration, Vec<String>), PersistError>,
}

/// The persister thread; it ends when this is dropped (after the step it is writing).
pub struct Persister {
    jobs: std::sync::mpsc::Sender<Job>,
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
        std::thread::Builder::new()
            .name("drun-persist".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
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
        Ok((Self { jobs }, done))
    }

    /// Queues `job`.
    pub fn submit(&self, job: Job) {
        let _ = self.jobs.send(job);
    }
}

/// The persister thread's side of [`pace`]: it measures its own CPU time and the node's idle
/// time, pauses as the decision says, and switches its I/O class to idle while it yields.
pub struct Pacer {
    params: PaceParams,
    staged_at: Instant,
    /// The current window's start: when, the node's idle time and this thread's CPU time then.
    window: (Instant, Option<Duration>, Duration),
    /// Whether the last window had a CPU to spare.
    spare: bool,
    /// Since when the persister yields, with its CPU time then.
    yielding: Option<(Instant, Duration)>,
    /// The last decision, to log (and set the I/O class) only on a change.
    last: Option<Pace>,
}

impl Pacer {
    /// A pacer for a step staged at `staged_at`.
    pub fn new(params: PaceParams, staged_at: Instant) -> Self {
        Self {
            params,
            staged_at,
            window: (
                Instant::now(),
                background::node_idle(),
                background::thread_cpu(),
            ),
            spare: false,
            yielding: Some((Instant::now(), background::thread_cpu())),
            last: None,
        }
    }

    /// Pauses after a slice of work as the CPU throttle and the byte rate say (`written` bytes
    /// since `began`), looking again at least every [`RECHECK`] of a longer pause, and returns
    /// once the pause is slept.
    fn after_slice(&mut self, throttle: &Throttle, written: Option<(u64, Instant)>) {
        loop {
            let now = Instant::now();
            let mine = background::thread_cpu();
            let (w_at, w_idle, w_mine) = self.window;
            if now.saturating_duration_since(w_at) >= CPU_WINDOW {
                let idle = background::node_idle();
                self.spare = match (w_idle, idle) {
                    (Some(a), Some(b)) => spare_cpu(
                        now.saturating_duration_since(w_at),
                        b.saturating_sub(a),
                        mine.saturating_sub(w_mine),
                    ),
                    _ => false,
                };
                self.window = (now, idle, mine);
            }
            let (since, cpu_then) = *self.yielding.get_or_insert((now, mine));
            let decision = pace(
                &PaceInput {
                    urgent: throttle.urgent(),
                    lag: now.saturating_duration_since(self.staged_at),
                    spare: self.spare,
                    cpu: mine.saturating_sub(cpu_then),
                    elapsed: now.saturating_duration_since(since),
                },
                &self.params,
            );
            self.note(decision);
            if !decision.yields() {
                self.yielding = None;
            }
            let wait = decision
                .pause()
                .max(written.map_or(Duration::ZERO, |(n, began)| {
                    pause(n, began.elapsed(), throttle.rate())
                }));
            if wait.is_zero() {
                return;
            }
            std::thread::sleep(wait.min(RECHECK));
            // A whole pause slept: back to work. The CPU of this look and any oversleep count
            // in the next slice's (the share is reckoned from when yielding began); looking
            // again would ask a pause for this look's own CPU, then for that look's, and so on:
            // a thread that spent its share on thousands of tiny sleeps a second (measured:
            // 1,000 a second, the persister's CPU per GiB tripled, the lag bound reached).
            if wait <= RECHECK {
                return;
            }
        }
    }

    /// Logs a change of the decision and follows it with the thread's I/O class.
    fn note(&mut self, decision: Pace) {
        let changed = self
            .last
            .is_none_or(|l| l.yields() != decision.yields() || (!l.yields() && l != decision));
        if changed {
            tracing::debug!(reason = decision.reason(), "checkpoint persister");
            if self.last.is_none_or(|l| l.yields() != decision.yields()) {
                let class = if decision.yields() {
                    IoClass::Idle
                } else {
                    IoClass::Default
                };
                let _ = background::set_io_class(class);
            }
        }
        self.last = Some(decision);
    }

    /// The step is done: the thread's I/O class back to the default.
    fn finish(&mut self) {
        if self.last.is_some_and(|l| l.yields()) {
            let _ = background::set_io_class(IoClass::Default);
        }
        self.last = None;
    }
}

/// Writes `f` to its place in `--ckpt-dir`, throttled by `throttle` and `pacer` (a change of
/// either applies to the rest of the file), and verifies it on disk before it takes its place:
/// the bytes read back from the device must equal the staged copy's (and their SHA-256 the
/// rank's, when it gave one). Returns the SHA-256 of the file.
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
    let mut h = Sha256::new();
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
        pacer.after_slice(throttle, Some((written, began)));
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
            read_back(tmp.path(), written, &src, || {
                pacer.after_slice(throttle, None)
            })
        }
    };
    drop(disk);
    verified
        .map_err(|e| fail(PersistFailure::ReadBack(e)))?
        .map_err(differ)?;
    let digest = hex(&h.finalize());
    if !f.sha256.is_empty() && digest != f.sha256 {
        return Err(fail(PersistFailure::Digest {
            got: digest,
            want: f.sha256.clone(),
        }));
    }
    tmp.persist(&f.target)
        .map_err(|e| fail(PersistFailure::Rename(e.error)))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(digest)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pacer that never yields (its lag bound is zero).
    fn full() -> Pacer {
        Pacer::new(
            PaceParams {
                share: 0.05,
                lag_bound: Duration::ZERO,
            },
            Instant::now(),
        )
    }

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
        let f = staged(d.path(), &vec![7u8; 3 * SLICE + 5]);
        assert_eq!(
            persist_file(&f, &Throttle::new(0), &mut full()).unwrap(),
            f.sha256
        );
        let mut left_to_the_agent = f.clone();
        left_to_the_agent.sha256.clear();
        assert_eq!(
            persist_file(&left_to_the_agent, &Throttle::new(0), &mut full()).unwrap(),
            f.sha256
        );
        assert_eq!(std::fs::read(&f.target).unwrap(), vec![7u8; 3 * SLICE + 5]);
        assert!(leftovers(f.target.parent().unwrap()).is_empty());
    }

    #[test]
    fn a_digest_that_differs_leaves_nothing_in_place() {
        let d = tempfile::tempdir().unwrap();
        let mut f = staged(d.path(), b"state");
        f.sha256 = "0".repeat(64);
        let e = persist_file(&f, &Throttle::new(0), &mut full()).unwrap_err();
        assert!(
            matches!(e.failure, PersistFailure::Digest { ref want, .. } if *want == f.sha256),
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
        assert_eq!(persist_file(&f, &rate, &mut full()).unwrap(), f.sha256);
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
                assert_eq!(digest, f.sha256, "{len} bytes, direct {direct}");
                assert!(
                    std::fs::read(&f.target).unwrap() == bytes,
                    "{len} bytes, direct {direct}"
                );
            }
        }
        assert!(leftovers(d.path().join("ckpt/run/step-1-g1").as_path()).is_empty());
    }

    #[test]
    fn a_slice_of_work_is_followed_by_the_pause_its_cpu_share_asks() {
        let params = PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        };
        let burn = |cpu: Duration| {
            let from = background::thread_cpu();
            let mut x = 1u64;
            while background::thread_cpu() - from < cpu {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        };
        // 5 ms of CPU at 5 % of one CPU: 100 ms from the start (the first window of 250 ms
        // counts as busy).
        let began = Instant::now();
        let mut p = Pacer::new(params, Instant::now());
        burn(Duration::from_millis(5));
        p.after_slice(&Throttle::new(0), None);
        assert!(
            began.elapsed() >= Duration::from_millis(95),
            "{:?}",
            began.elapsed()
        );
        // Asked for full speed, it does not pause.
        let urgent = Throttle::new(0);
        urgent.set_urgent(true);
        let mut p = Pacer::new(params, Instant::now());
        burn(Duration::from_millis(5));
        let t = Instant::now();
        p.after_slice(&urgent, None);
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    }

    /// The voluntary context switches of the calling thread so far.
    fn switches() -> u64 {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    }

    #[test]
    fn a_paused_persister_sleeps_its_pause_in_few_sleeps_not_in_thousands() {
        let params = PaceParams {
            share: 0.05,
            lag_bound: Duration::from_secs(60),
        };
        let mut p = Pacer::new(params, Instant::now());
        let from = background::thread_cpu();
        while background::thread_cpu() - from < Duration::from_millis(8) {
            std::hint::black_box(0u64);
        }
        // 8 ms of CPU at 5 %: about 160 ms of pause, at most 50 ms a sleep (RECHECK).
        let (before, began) = (switches(), Instant::now());
        p.after_slice(&Throttle::new(0), None);
        let (slept, took) = (switches() - before, began.elapsed());
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(
            slept <= 8,
            "{slept} sleeps in {took:?}: each look's own CPU asked for another pause"
        );
    }

    #[test]
    fn a_yielding_persister_thread_is_in_the_idle_io_class() {
        let (tx, rx) = std::sync::mpsc::channel();
        // Some(decision): the pacer notes it; None: the step is done.
        let (go, wait) = std::sync::mpsc::channel::<Option<Pace>>();
        let t = std::thread::spawn(move || {
            let mut p = full();
            tx.send(background::thread_id()).unwrap();
            while let Ok(decision) = wait.recv() {
                match decision {
                    Some(d) => p.note(d),
                    None => p.finish(),
                }
                tx.send(0).unwrap();
            }
        });
        let tid = rx.recv().unwrap();
        let ask = |d: Option<Pace>| {
            go.send(d).unwrap();
            rx.recv().unwrap();
            background::io_class(tid).unwrap()
        };
        let yielding = Some(Pace::Yield {
            pause: Duration::ZERO,
        });
        match ask(yielding) {
            IoClass::Idle => {}
            other if std::env::var_os("DRUN_REQUIRE_IOPRIO").is_none() => {
                eprintln!("skipped: the kernel did not take the idle I/O class ({other:?}); DRUN_REQUIRE_IOPRIO=1 requires it");
                return;
            }
            other => panic!("the yielding persister is not in the idle I/O class: {other:?}"),
        }
        assert_ne!(
            background::io_class(background::thread_id()).unwrap(),
            IoClass::Idle,
            "only the persister's thread"
        );
        assert_ne!(ask(Some(Pace::Urgent)), IoClass::Idle, "full speed");
        assert_eq!(ask(yielding), IoClass::Idle);
        assert_ne!(ask(None), IoClass::Idle, "the step is done");
        drop(go);
        t.join().unwrap();
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
        assert_eq!(r.result.unwrap().1, std::slice::from_ref(&f.sha256));
        assert_eq!(std::fs::read(&f.target).unwrap(), b"abc");
    }
}
