//! The resume from the survivors' copies after a node loss (`--ckpt-replicas`; the decision is
//! the formation's, [`drun_rendezvous::ledger::memory`], carried in `Plan::resume_memory`):
//! before the workers start, each agent gathers every file of the step into its staging
//! directory — its own staged copies are there already, its replicas are linked in, the rest
//! is fetched from the member the plan names ([`fetch_from`], served by [`serve`] on the
//! replica port, verified by digest) — then checks every file's digest against the plan's, so
//! the workers' resume from the staged directory reads exactly the step the plan names.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drun_rendezvous::{Manifest, MemoryResume, Plan};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::error::ReplicaError;
use super::files::{read_files, tell};
use super::send::{line, open, stream_files};
use super::shelf::{transfer_limit, Ctx, Shelf};
use crate::ckpt::memory::replica::to_fetch;
use crate::ckpt::memory::staged_path;
use crate::ckpt::memory::wire::judge::{judge_fetch, Receiver};
use crate::ckpt::memory::wire::{Fetch, OfferFile};

/// How long a fetch is retried while its source refuses it for following another generation
/// (the plan reaches the agents one by one) or cannot be reached yet.
const RETRY_FOR: Duration = Duration::from_secs(20);

/// Serves a member's fetch on this node's replica port: judged, each file found among this
/// node's staged copies or the replicas it holds, streamed with its digest.
pub(super) async fn serve(
    mut conn: BufReader<TcpStream>,
    peer: SocketAddr,
    f: Fetch,
    nonce: &[u8],
    shelf: &Shelf,
    ctx: &Ctx,
) -> Result<(), ReplicaError> {
    let judged = {
        let s = shelf.lock();
        let nodes = s.generation.as_ref().map(|(g, n)| (*g, n.as_slice()));
        judge_fetch(
            &f,
            &Receiver {
                run_id: &ctx.run_id,
                generation: nodes,
                me: &ctx.me,
                peer: peer.ip(),
                token: ctx.token.as_deref(),
                nonce,
                ckpt_dir: &ctx.ckpt_dir,
            },
        )
    };
    let staged = judged
        .map_err(ReplicaError::from)
        .and_then(|()| locate(&f.files, &ctx.root, &ctx.ckpt_dir));
    let staged = match staged {
        Ok(s) => s,
        Err(why) => {
            tell(&mut conn, "refused", &why).await;
            return Err(why);
        }
    };
    let io = |source| ReplicaError::Connection { peer, source };
    conn.get_mut().write_all(b"take\n").await.map_err(io)?;
    let limit = transfer_limit(f.bytes());
    tokio::time::timeout(
        limit,
        // A resume waits for these bytes: no limit.
        stream_files(conn.get_mut(), &f.files, &staged, &f.from, 0),
    )
    .await
    .map_err(|_| ReplicaError::NotSent { limit })??;
    match line(&mut conn).await? {
        ok if ok == "ok" => {
            tracing::info!(
                step = f.step,
                to = %f.from,
                "served {} file(s) of checkpoint step {} to {} for its resume from memory",
                f.files.len(),
                f.step,
                f.from
            );
            Ok(())
        }
        answer => Err(ReplicaError::Answered { answer }),
    }
}

/// Where this node holds each of `files`: its own staged copy (under the staging directory,
/// the parent of `replicas`) or a replica (under `replicas`), with the size asked; or which one
/// it does not hold.
fn locate(
    files: &[OfferFile],
    replicas: &Path,
    ckpt_dir: &Path,
) -> Result<Vec<PathBuf>, ReplicaError> {
    let stage = replicas.parent().unwrap_or(replicas);
    files
        .iter()
        .map(|f| {
            [stage, replicas]
                .iter()
                .filter_map(|root| staged_path(root, ckpt_dir, Path::new(&f.path)))
                .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() == f.bytes))
                .ok_or_else(|| ReplicaError::NotHeld {
                    path: f.path.clone(),
                })
        })
        .collect()
}

/// What a fetch needs to know of this node and its run.
#[derive(Debug, Clone)]
pub(crate) struct Local {
    /// The run.
    pub(crate) run_id: String,
    /// This node's id.
    pub(crate) me: String,
    /// The run's `--rdzv-token`, if any.
    pub(crate) token: Option<String>,
    /// The staging directory.
    pub(crate) stage: PathBuf,
    /// `--ckpt-dir`.
    pub(crate) ckpt_dir: PathBuf,
}

/// Gathers every file of `m` (the plan's resume point, from memory per `sources`) into
/// `local.stage`, then verifies each by its digest: the files already staged here stay, replicas
/// held here are linked in, the rest is fetched from its source member of `plan`. Returns the
/// manifest file to hand the workers, written in the staging directory (`--ckpt-dir` holds no
/// manifest of a step not sealed).
///
/// # Errors
/// The file or the source that failed; nothing added stays behind.
pub(crate) async fn gather(
    local: &Local,
    plan: &Plan,
    m: &Manifest,
    sources: &MemoryResume,
) -> Result<PathBuf, ReplicaError> {
    let mut added = Vec::new();
    let out = gather_into(local, plan, m, sources, &mut added).await;
    if out.is_err() {
        for f in &added {
            let _ = std::fs::remove_file(f);
        }
    }
    out
}

async fn gather_into(
    local: &Local,
    plan: &Plan,
    m: &Manifest,
    sources: &MemoryResume,
    added: &mut Vec<PathBuf>,
) -> Result<PathBuf, ReplicaError> {
    let replicas = local.stage.join(".replicas");
    let dest = |path: &str| {
        staged_path(&local.stage, &local.ckpt_dir, Path::new(path)).ok_or_else(|| {
            ReplicaError::Outside {
                path: path.to_string(),
            }
        })
    };
    let sized = |p: &Path, bytes: u64| {
        std::fs::metadata(p).is_ok_and(|md| md.is_file() && md.len() == bytes)
    };
    // The ranks whose every file is here now (own staged copies, replicas linked in).
    let mut mine: BTreeSet<u32> = m.files.iter().map(|f| f.rank).collect();
    for f in &m.files {
        let to = dest(&f.path)?;
        if sized(&to, f.bytes) {
            continue;
        }
        let replica = staged_path(&replicas, &local.ckpt_dir, Path::new(&f.path))
            .filter(|p| sized(p, f.bytes));
        match replica {
            Some(r) => {
                if let Some(d) = to.parent() {
                    std::fs::create_dir_all(d).map_err(|source| ReplicaError::Create {
                        path: d.to_path_buf(),
                        source,
                    })?;
                }
                std::fs::hard_link(&r, &to)
                    .or_else(|_| std::fs::copy(&r, &to).map(|_| ()))
                    .map_err(|source| ReplicaError::Link {
                        path: r.clone(),
                        source,
                    })?;
                added.push(to);
            }
            None => {
                mine.remove(&f.rank);
            }
        }
    }
    let wanted = to_fetch(&local.me, &sources.sources, Some(&mine));
    let mut by_source: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (rank, node) in wanted {
        by_source.entry(node).or_default().push(rank);
    }
    for (node, ranks) in by_source {
        let member = plan
            .member(&node)
            .filter(|mb| mb.probe_port != 0)
            .ok_or_else(|| ReplicaError::NoSource { node: node.clone() })?;
        let files: Vec<OfferFile> = m
            .files
            .iter()
            .filter(|f| ranks.contains(&f.rank))
            .map(|f| OfferFile {
                path: f.path.clone(),
                bytes: f.bytes,
                digest: f.digest.clone(),
                rank: Some(f.rank),
            })
            .collect();
        let req = Fetch {
            fetch: true,
            run_id: local.run_id.clone(),
            generation: plan.generation,
            from: local.me.clone(),
            step: m.step,
            saved_in: m.generation,
            files,
            mac: String::new(),
        };
        let got = fetch_from(&member.advertise_addr, member.probe_port, req, local).await;
        match got {
            Ok(files) => {
                tracing::info!(
                    step = m.step,
                    from = %node,
                    "fetched {} file(s) of checkpoint step {} from {node}",
                    files.len(),
                    m.step
                );
                added.extend(files);
            }
            Err(why) => {
                return Err(ReplicaError::Fetching {
                    node,
                    source: Box::new(why),
                })
            }
        }
    }
    // Every file, however it came, is the plan's: its digest against the manifest's.
    let stage = local.stage.clone();
    let ckpt_dir = local.ckpt_dir.clone();
    let check = m.clone();
    tokio::task::spawn_blocking(move || verify_staged(&stage, &ckpt_dir, &check)).await??;
    let dir = dest(&m.dir().display().to_string())?;
    let file = dir.join(m.file_name());
    std::fs::create_dir_all(&dir).map_err(|source| ReplicaError::Create {
        path: dir.clone(),
        source,
    })?;
    std::fs::write(
        &file,
        serde_json::to_vec_pretty(m).expect("Manifest serializes"),
    )
    .map_err(|source| ReplicaError::Manifest {
        path: file.clone(),
        source,
    })?;
    added.push(file.clone());
    Ok(file)
}

/// Every file of `m` staged under `stage` has the manifest's digest.
fn verify_staged(stage: &Path, ckpt_dir: &Path, m: &Manifest) -> Result<(), ReplicaError> {
    for f in &m.files {
        let p = staged_path(stage, ckpt_dir, Path::new(&f.path)).ok_or_else(|| {
            ReplicaError::Outside {
                path: f.path.clone(),
            }
        })?;
        let (got, _) = crate::ckpt::digest::file_like(&p, &f.digest).map_err(|source| {
            ReplicaError::Verify {
                path: p.clone(),
                source,
            }
        })?;
        if got != f.digest {
            return Err(ReplicaError::NotPlans {
                path: f.path.clone(),
                got,
                want: f.digest.clone(),
            });
        }
    }
    Ok(())
}

/// Fetches `req`'s files from the agent at `host:port` into `local.stage`, verified by digest
/// (the sender's and the plan's); a refusal for following another generation, or a source not
/// reachable yet, is tried again for [`RETRY_FOR`].
async fn fetch_from(
    host: &str,
    port: u16,
    req: Fetch,
    local: &Local,
) -> Result<Vec<PathBuf>, ReplicaError> {
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    loop {
        let why = match fetch_once(host, port, req.clone(), local).await {
            Ok(files) => return Ok(files),
            Err((why, again)) if again => why,
            Err((why, _)) => return Err(why),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(why);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One try: the files, or why not and whether trying again may help.
async fn fetch_once(
    host: &str,
    port: u16,
    mut req: Fetch,
    local: &Local,
) -> Result<Vec<PathBuf>, (ReplicaError, bool)> {
    let (mut conn, nonce, addr) = open(host, port).await.map_err(|e| (e, true))?;
    req.sign(local.token.as_deref(), &nonce);
    let w = |source| {
        let to = addr.to_string();
        (ReplicaError::Send { to, source }, true)
    };
    conn.get_mut().write_all(&req.encode()).await.map_err(w)?;
    let answer = line(&mut conn).await.map_err(|e| (e, true))?;
    if answer != "take" {
        // The source's refusal for following another generation, as its line says.
        let again = answer.contains("follows");
        return Err((ReplicaError::Answered { answer }, again));
    }
    let mut files = Vec::new();
    let limit = transfer_limit(req.bytes());
    let got = read_files(
        limit,
        &mut conn,
        &req.files,
        (&local.stage, &local.ckpt_dir),
        &mut files,
        &|| Ok(()),
    )
    .await;
    match got {
        Ok(_) => {
            conn.get_mut().write_all(b"ok\n").await.map_err(w)?;
            Ok(files)
        }
        Err(why) => {
            for f in &files {
                let _ = std::fs::remove_file(f);
            }
            tell(&mut conn, "bad", &why).await;
            Err((why, false))
        }
    }
}
