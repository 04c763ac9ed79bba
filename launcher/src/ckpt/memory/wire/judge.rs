//! The receiver's judgement of a replica [`Offer`] or a [`Fetch`] (pure): the run, the
//! generation it follows, who may send or ask (the ring predecessor, a member), from which
//! address, the MAC, plain paths inside `--ckpt-dir`; a [`Refusal`] names the first rule broken,
//! and its text is what the receiver answers after `refused: `.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::{Fetch, Offer};

/// Why a receiver refuses an [`Offer`] ([`judge`]) or a [`Fetch`] ([`judge_fetch`]): its text
/// is the line answered on the wire after `refused: `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An offer of another run.
    #[error("an offer of run '{run_id}', not '{mine}'")]
    OfferOfRun {
        /// The offer's run.
        run_id: String,
        /// The receiver's.
        mine: String,
    },
    /// A fetch of another run.
    #[error("a fetch of run '{run_id}', not '{mine}'")]
    FetchOfRun {
        /// The fetch's run.
        run_id: String,
        /// The receiver's.
        mine: String,
    },
    /// The receiver is between generations: nothing is accepted.
    #[error("this node follows no generation now")]
    NoGeneration,
    /// An offer saved in another generation than the one the receiver follows.
    #[error("an offer of generation {generation}, this node follows generation {follows}")]
    OfferOfGeneration {
        /// The offer's generation.
        generation: u64,
        /// The receiver's.
        follows: u64,
    },
    /// A fetch for another generation than the one the receiver follows.
    #[error("a fetch in generation {generation}, this node follows generation {follows}")]
    FetchInGeneration {
        /// The fetch's generation.
        generation: u64,
        /// The receiver's.
        follows: u64,
    },
    /// An offer from a node other than the receiver's ring predecessor.
    #[error(
        "'{from}' is not the node whose replicas this node holds in generation {generation} ({})",
        .predecessor.as_deref().unwrap_or("none")
    )]
    NotPredecessor {
        /// The sender's node id.
        from: String,
        /// The generation followed.
        generation: u64,
        /// The receiver's ring predecessor in it, if any.
        predecessor: Option<String>,
    },
    /// A fetch from a node that is not a member of the followed generation.
    #[error("'{from}' is not a member of generation {generation}")]
    NotAMember {
        /// The requester's node id.
        from: String,
        /// The generation followed.
        generation: u64,
    },
    /// An offer whose connection came from another address than its sender advertises.
    #[error("the offer of '{from}' came from {peer}, but that node advertises {advertised}")]
    OfferFromElsewhere {
        /// The sender's node id.
        from: String,
        /// Where the connection came from.
        peer: IpAddr,
        /// The address the node advertises.
        advertised: IpAddr,
    },
    /// A fetch whose connection came from another address than its requester advertises.
    #[error("the connection of '{from}' came from {peer}, but that node advertises {advertised}")]
    FetchFromElsewhere {
        /// The requester's node id.
        from: String,
        /// Where the connection came from.
        peer: IpAddr,
        /// The address the node advertises.
        advertised: IpAddr,
    },
    /// An offer not signed with the run's token for this nonce.
    #[error("the offer's MAC does not match this run's token")]
    OfferMac,
    /// A fetch not signed with the run's token for this nonce.
    #[error("the fetch's MAC does not match this run's token")]
    FetchMac,
    /// An offer of no files.
    #[error("an offer of no files")]
    NoFilesOffered,
    /// A fetch of no files.
    #[error("a fetch of no files")]
    NoFilesFetched,
    /// A file's path that is not a plain path inside `--ckpt-dir`.
    #[error("'{}' is not a plain path inside --ckpt-dir {}", .path.display(), .ckpt_dir.display())]
    Outside {
        /// The path as sent.
        path: PathBuf,
        /// `--ckpt-dir`.
        ckpt_dir: PathBuf,
    },
}

/// Whether `f` may be served by `r`: the run, the generation `r` follows, a member of it
/// asking from the address it advertises, the MAC, plain paths inside `--ckpt-dir`.
///
/// # Errors
/// The first rule it breaks.
pub fn judge_fetch(f: &Fetch, r: &Receiver<'_>) -> Result<(), Refusal> {
    if f.run_id != r.run_id {
        return Err(Refusal::FetchOfRun {
            run_id: f.run_id.clone(),
            mine: r.run_id.to_string(),
        });
    }
    let Some((generation, nodes)) = r.generation else {
        return Err(Refusal::NoGeneration);
    };
    if f.generation != generation {
        return Err(Refusal::FetchInGeneration {
            generation: f.generation,
            follows: generation,
        });
    }
    let Some((_, addr)) = nodes.iter().find(|(id, _)| *id == f.from) else {
        return Err(Refusal::NotAMember {
            from: f.from.clone(),
            generation,
        });
    };
    if let Some(advertised) = elsewhere(addr, r.peer) {
        return Err(Refusal::FetchFromElsewhere {
            from: f.from.clone(),
            peer: r.peer,
            advertised,
        });
    }
    if let Some(t) = r.token {
        if f.mac.is_empty() || !same(f.mac.as_bytes(), f.mac_for(t, r.nonce).as_bytes()) {
            return Err(Refusal::FetchMac);
        }
    }
    if f.files.is_empty() {
        return Err(Refusal::NoFilesFetched);
    }
    inside(f.files.iter().map(|f| f.path.as_str()), r.ckpt_dir)
}

/// The IP address a node advertises (`addr`) when its connection came from another (`peer`): a
/// node advertising an IP address connects from it (a host name is not resolved here).
fn elsewhere(addr: &str, peer: IpAddr) -> Option<IpAddr> {
    addr.parse::<IpAddr>().ok().filter(|ip| {
        *ip != peer && !(ip.is_loopback() && peer.is_loopback()) && !ip.is_unspecified()
    })
}

/// Every path a plain path inside `ckpt_dir`, or the first that is not.
fn inside<'a>(mut paths: impl Iterator<Item = &'a str>, ckpt_dir: &Path) -> Result<(), Refusal> {
    match paths
        .find(|p| super::super::staged_path(Path::new("/"), ckpt_dir, Path::new(p)).is_none())
    {
        Some(p) => Err(Refusal::Outside {
            path: PathBuf::from(p),
            ckpt_dir: ckpt_dir.to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// What the receiver knows when it judges an offer.
#[derive(Debug, Clone, Copy)]
pub struct Receiver<'a> {
    /// Its run.
    pub run_id: &'a str,
    /// The generation it follows and its nodes in node-rank order, each with its advertised
    /// address (`None`: between generations, nothing is accepted).
    pub generation: Option<(u64, &'a [(String, String)])>,
    /// The address the offer's connection came from.
    pub peer: IpAddr,
    /// Its own node id.
    pub me: &'a str,
    /// The run's token, when it has one.
    pub token: Option<&'a str>,
    /// The nonce it sent.
    pub nonce: &'a [u8],
    /// `--ckpt-dir`: every file's final path is a plain path inside it.
    pub ckpt_dir: &'a Path,
}

/// Whether `offer` may be taken by `r` (before its budget is asked).
///
/// # Errors
/// The first rule it breaks.
pub fn judge(offer: &Offer, r: &Receiver<'_>) -> Result<(), Refusal> {
    if offer.run_id != r.run_id {
        return Err(Refusal::OfferOfRun {
            run_id: offer.run_id.clone(),
            mine: r.run_id.to_string(),
        });
    }
    let Some((generation, nodes)) = r.generation else {
        return Err(Refusal::NoGeneration);
    };
    if offer.generation != generation {
        return Err(Refusal::OfferOfGeneration {
            generation: offer.generation,
            follows: generation,
        });
    }
    let ids: Vec<String> = nodes.iter().map(|(id, _)| id.clone()).collect();
    let from = super::super::replica::predecessor(&ids, r.me);
    if from != Some(offer.from.as_str()) {
        return Err(Refusal::NotPredecessor {
            from: offer.from.clone(),
            generation,
            predecessor: from.map(str::to_string),
        });
    }
    let advertised = nodes
        .iter()
        .find(|(id, _)| *id == offer.from)
        .and_then(|(_, a)| elsewhere(a, r.peer));
    if let Some(advertised) = advertised {
        return Err(Refusal::OfferFromElsewhere {
            from: offer.from.clone(),
            peer: r.peer,
            advertised,
        });
    }
    if let Some(t) = r.token {
        if offer.mac.is_empty() || !same(offer.mac.as_bytes(), offer.mac_for(t, r.nonce).as_bytes())
        {
            return Err(Refusal::OfferMac);
        }
    }
    if offer.files.is_empty() {
        return Err(Refusal::NoFilesOffered);
    }
    inside(offer.files.iter().map(|f| f.path.as_str()), r.ckpt_dir)
}

/// Whether `a` and `b` are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests;
