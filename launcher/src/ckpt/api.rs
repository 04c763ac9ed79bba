//! The local worker API: newline-delimited JSON over a Unix socket (`DRUN_AGENT_SOCK`).
//!
//! One request per line, one answer line per request, in order, on a connection a worker may
//! keep open. Every answer has `"ok": true|false`; a refused request carries `"error"`, one line.
//!
//! | request | answer |
//! |---|---|
//! | `{"op":"commit","rank":R,"generation":G,"step":S,"files":[{"path":P,"bytes":N,"sha256":H}],"cursor":C}` (optional `"save_started_ms":T`, when the rank began saving S) | after every local rank reported step S: `{"ok":true,"sealed":B,"manifest":PATH\|null,"waiting_for":[NODE...]}` |
//! | `{"op":"stage_room","rank":R,"generation":G,"bytes":N}` | `{"ok":true,"stage":B}`: whether the rank's next save (about N bytes, its last one's size) stays in memory, its room kept (`--ckpt-memory`); `false`: it goes straight to `P` |
//! | `{"op":"resume"}` | `{"ok":true,"generation":G,"world_size":W,"resume":null\|{"step","generation","world_size","path","manifest","cursor"}}` |
//! | `{"op":"progress","rank":R,"step":S}` | `{"ok":true}` (step beacon: lost work is measured from it) |
//! | `{"op":"should_save","rank":R}` | `{"ok":true,"save":B}` (a coordinated save was requested) |
//! | `{"op":"preflight","rank":R,"report":{...}\|"skipped":"..."\|"error":"..."}` | `{"ok":true}` (`--preflight`'s results, see [`crate::preflight::Outcome`]) |
//! | `{"op":"hello","protocol":N}` | `{"ok":true,"protocol":PROTOCOL,"agent":VERSION}`, answered by the socket itself |
//!
//! A file entry may carry `"staged": true` (written under `DRUN_CKPT_STAGE_DIR`, at the same
//! place relative to it as `P` to `--ckpt-dir`): the agent answers once every local rank
//! reported the step, `{"ok":true,"staged":true,"sealed":false,"spares":B,...}`, and persists
//! the files behind the training ([`crate::ckpt::memory`]); `"spares": false` tells the ranks to
//! prepare no spare staging file for their next save (no room for it in the budget).
//!
//! `C` is a [`drun_rendezvous::Cursor`], optional (absent or `null`: a job without a data
//! cursor; every rank of the step then reports none); `files` may be empty (a rank that wrote
//! nothing of its own still takes part in the step); `P` absolute; `H` the file's SHA-256,
//! lowercase hex. The worker helper (`python/drun`) sends `hello` first and refuses to run
//! against an agent whose [`PROTOCOL`] differs from its own.

use std::path::{Path, PathBuf};

use drun_rendezvous::Cursor;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// Version of this worker API. Raised on any change a helper of the previous version would
/// misread; the Python helper's `drun.PROTOCOL` must equal it (`hello`).
pub const PROTOCOL: u32 = 2;

/// Longest request line accepted, in bytes (a commit of many files fits easily).
const MAX_LINE: usize = 8 << 20;

/// One file of a commit, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileReport {
    /// Absolute path.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256, lowercase hex. May be left out (empty) for a staged file: the agent hashes
    /// the staged copy as it persists it.
    #[serde(default)]
    pub sha256: String,
    /// Written to the agent's staging directory (`DRUN_CKPT_STAGE_DIR`), not yet at `path`:
    /// the agent persists it there ([`crate::ckpt::memory`]).
    #[serde(default)]
    pub staged: bool,
}

/// A worker's request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ApiRequest {
    /// This rank saved its shard of `step`.
    Commit {
        /// Global rank.
        rank: u32,
        /// `DRUN_GENERATION` of the worker.
        generation: u64,
        /// Step.
        step: u64,
        /// Files written.
        files: Vec<FileReport>,
        /// Data cursor after `step`; `None` for a job without one.
        #[serde(default)]
        cursor: Option<Cursor>,
        /// When this rank began saving `step` (or was told to), ms since the Unix epoch: the
        /// start of the save cost `--ckpt-interval auto` measures (optional).
        #[serde(default)]
        save_started_ms: Option<u64>,
    },
    /// Room in the agent's memory for this rank's next staged save (`--ckpt-memory`), asked
    /// before it writes: about `bytes` (its last save's size). Answered `"stage": false` when
    /// the save goes straight to `--ckpt-dir` instead.
    StageRoom {
        /// Global rank.
        rank: u32,
        /// `DRUN_GENERATION` of the worker.
        generation: u64,
        /// Bytes the save is expected to take.
        bytes: u64,
    },
    /// What to resume from.
    Resume,
    /// Step beacon.
    Progress {
        /// Global rank.
        rank: u32,
        /// Step reached.
        step: u64,
        /// Samples this rank processes per step, if the worker said (`drun.progress(step,
        /// samples=N)`): gives `drun_rank_samples_per_second`.
        #[serde(default)]
        samples: Option<u64>,
    },
    /// The helper's protocol version; answered with the agent's [`PROTOCOL`].
    Hello {
        /// The helper's `drun.PROTOCOL`.
        #[serde(default)]
        protocol: Option<u32>,
    },
    /// Is a coordinated save requested?
    ShouldSave {
        /// Global rank (optional).
        #[serde(default)]
        rank: Option<u32>,
    },
    /// `--preflight`'s results, or why it did not measure.
    Preflight(Box<crate::preflight::Outcome>),
}

/// A request and where its answer goes.
pub type ApiCall = (ApiRequest, oneshot::Sender<Value>);

/// The listening socket; removed (with its private directory) on drop.
pub struct ApiServer {
    path: PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// Listens on a fresh socket (0600) in a private (0700) directory under the temporary
    /// directory ([`crate::os::private_dir`]); requests arrive on the returned channel.
    ///
    /// # Errors
    /// `PermissionDenied` when the temporary directory lets other users replace the socket's
    /// directory; otherwise cannot create the directory or bind the socket.
    pub fn start() -> std::io::Result<(Self, mpsc::UnboundedReceiver<ApiCall>)> {
        let dir = crate::os::private_dir::create(&std::env::temp_dir(), "drun-agent-")?;
        let path = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(serve(stream, tx.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "worker API: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok((
            ApiServer {
                path,
                _dir: dir,
                task,
            },
            rx,
        ))
    }

    /// The socket path (`DRUN_AGENT_SOCK`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket's private directory (the workers' flight-recorder dumps go there too).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A refusal, as sent.
pub fn refused(error: impl std::fmt::Display) -> Value {
    json!({"ok": false, "error": error.to_string()})
}

/// Discards the rest of the current line, through its newline (or to the end of the stream).
async fn skip_line(r: &mut (impl AsyncBufRead + Unpin)) -> std::io::Result<()> {
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
}

async fn serve(stream: UnixStream, agent: mpsc::UnboundedSender<ApiCall>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut lines)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let answer = if line.len() > MAX_LINE {
            // One answer per request: the rest of the oversized line is not a request of its own.
            if skip_line(&mut lines).await.is_err() {
                return;
            }
            refused(format!("request longer than {MAX_LINE} bytes"))
        } else {
            match serde_json::from_slice::<ApiRequest>(&line) {
                Err(e) => refused(format!("bad request: {e}")),
                Ok(ApiRequest::Hello { .. }) => json!({
                    "ok": true,
                    "protocol": PROTOCOL,
                    "agent": env!("CARGO_PKG_VERSION"),
                }),
                Ok(req) => {
                    let (tx, rx) = oneshot::channel();
                    if agent.send((req, tx)).is_err() {
                        refused("the agent is shutting down")
                    } else {
                        rx.await
                            .unwrap_or_else(|_| refused("the worker group is stopping"))
                    }
                }
            }
        };
        let mut out = serde_json::to_vec(&answer).expect("json serializes");
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        let r: ApiRequest = serde_json::from_str(
            r#"{"op":"commit","rank":1,"generation":2,"step":3,"files":[{"path":"/a","bytes":4,"sha256":"ab"}],"cursor":{"epoch":0,"consumed_in_epoch":8}}"#,
        )
        .unwrap();
        assert!(matches!(
            r,
            ApiRequest::Commit {
                rank: 1,
                step: 3,
                ..
            }
        ));
        assert_eq!(
            serde_json::from_str::<ApiRequest>(r#"{"op":"resume"}"#).unwrap(),
            ApiRequest::Resume
        );
        assert!(serde_json::from_str::<ApiRequest>(r#"{"op":"launch"}"#).is_err());
        for no_cursor in [
            r#"{"op":"commit","rank":0,"generation":1,"step":2,"files":[]}"#,
            r#"{"op":"commit","rank":0,"generation":1,"step":2,"files":[],"cursor":null}"#,
        ] {
            let r: ApiRequest = serde_json::from_str(no_cursor).unwrap();
            assert!(
                matches!(r, ApiRequest::Commit { cursor: None, ref files, .. } if files.is_empty()),
                "{r:?}"
            );
        }
    }

    #[tokio::test]
    async fn answers_each_line_in_order() {
        let (server, mut calls) = ApiServer::start().unwrap();
        let mode = std::fs::metadata(server.path()).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        tokio::spawn(async move {
            while let Some((req, reply)) = calls.recv().await {
                let _ = reply.send(json!({"ok": true, "echo": format!("{req:?}")}));
            }
        });
        let s = UnixStream::connect(server.path()).await.unwrap();
        let (r, mut w) = s.into_split();
        w.write_all(
            b"{\"op\":\"resume\"}\nnot json\n{\"op\":\"should_save\"}\n{\"op\":\"hello\",\"protocol\":1}\n",
        )
            .await
            .unwrap();
        let mut lines = BufReader::new(r).lines();
        let a: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(a["echo"], "Resume");
        let b: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(b["ok"], false);
        assert!(b["error"].as_str().unwrap().starts_with("bad request"));
        let c: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(c["echo"], "ShouldSave { rank: None }");
        let d: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(
            d["protocol"], PROTOCOL,
            "hello is answered by the socket: {d}"
        );
    }

    #[tokio::test]
    async fn an_oversized_line_gets_one_refusal_and_the_next_line_its_answer() {
        let (server, _calls) = ApiServer::start().unwrap();
        let s = UnixStream::connect(server.path()).await.unwrap();
        let (r, mut w) = s.into_split();
        let writer = tokio::spawn(async move {
            let mut big = vec![b'x'; MAX_LINE + 4096];
            big.extend_from_slice(b"\n{\"op\":\"hello\"}\n");
            w.write_all(&big).await.unwrap();
            w
        });
        let mut lines = BufReader::new(r).lines();
        let a: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert!(a["error"].as_str().unwrap().contains("longer than"), "{a}");
        let b: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(
            b["protocol"], PROTOCOL,
            "the line after is answered as itself: {b}"
        );
        drop(writer.await.unwrap());
    }
}
