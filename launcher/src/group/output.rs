//! The workers' output: two reader threads per worker feed the console (prefixed, filtered),
//! the log files (`--redirects`/`--tee`) and the tails kept for the failure summary; the drain
//! waits for them at the end.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::logs::{self, Console, Sink, Tail};
use crate::LaunchError;

use super::{GroupContext, WorkerGroup};

/// A worker's stdout tail, stderr tail and their reader threads.
pub(super) type Pumps = (Arc<Mutex<Tail>>, Arc<Mutex<Tail>>, Vec<JoinHandle<()>>);

fn open_log(dir: &Path, name: &str) -> Result<File, LaunchError> {
    let p = dir.join(name);
    File::create(&p)
        .map_err(|e| LaunchError::os(format!("cannot create log file {}", p.display()), e))
}

impl WorkerGroup {
    /// Starts the readers of a worker's stdout and stderr: console (prefixed, filtered),
    /// log files (--redirects/--tee) and the tails kept for the failure summary.
    pub(super) fn pump_output(
        &self,
        ctx: &GroupContext<'_>,
        dir: &Path,
        rank: u32,
        local_rank: u32,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    ) -> Result<Pumps, LaunchError> {
        let cfg = ctx.cfg;
        let redirect = cfg.output.redirects.for_rank(local_rank);
        let tee = cfg.output.tee.for_rank(local_rank);
        let shown = cfg
            .output
            .local_ranks_filter
            .as_ref()
            .is_none_or(|f| f.contains(&local_rank));
        let prefix = logs::prefix(
            cfg.output.prefix_template.as_deref(),
            &cfg.workers.role,
            local_rank,
            rank,
            ctx.hostname,
        );
        let out_tail = Arc::new(Mutex::new(Tail::default()));
        let err_tail = Arc::new(Mutex::new(Tail::default()));
        let mut readers = Vec::new();
        for (fd, console, redirected, teed, file_name, tail, tag) in [
            (
                stdout,
                Console::Stdout,
                redirect.out,
                tee.out,
                "stdout.log",
                &out_tail,
                "out",
            ),
            (
                stderr,
                Console::Stderr,
                redirect.err,
                tee.err,
                "stderr.log",
                &err_tail,
                "err",
            ),
        ] {
            let Some(fd) = fd else { continue };
            let file = if redirected || teed {
                Some(open_log(dir, file_name)?)
            } else {
                None
            };
            let to_console = shown && (teed || !redirected);
            let sink = Sink {
                console: to_console.then(|| (console, prefix.clone())),
                file,
                tail: tail.clone(),
                moved: self.moved.clone(),
            };
            let h = logs::pump(fd, sink, format!("drun-log-{rank}-{tag}"))
                .map_err(|e| LaunchError::os("cannot start an output reader thread", e))?;
            readers.push(h);
        }
        Ok((out_tail, err_tail, readers))
    }

    /// Waits (polling) for the output readers to reach end of file, so the last lines and the
    /// tails are complete, as long as they move bytes ([`logs::drain`]): readers quiet for
    /// `quiet_limit` are left behind.
    pub async fn drain_output(&mut self, quiet_limit: std::time::Duration) {
        let mut seen = self.moved.load(Ordering::Relaxed);
        let mut moved_at = tokio::time::Instant::now();
        loop {
            let all_done = self
                .workers
                .iter()
                .all(|w| w.readers.iter().all(JoinHandle::is_finished));
            let now = tokio::time::Instant::now();
            let moved = self.moved.load(Ordering::Relaxed);
            if moved != seen {
                (seen, moved_at) = (moved, now);
            }
            if logs::drain(all_done, now - moved_at, quiet_limit) != logs::Drain::Wait {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        for w in &mut self.workers {
            let (done, pending): (Vec<_>, Vec<_>) =
                w.readers.drain(..).partition(JoinHandle::is_finished);
            for h in done {
                let _ = h.join();
            }
            if !pending.is_empty() {
                tracing::debug!(rank = w.rank, "output reader still blocked; leaving it");
            }
        }
    }
}
