//! Replicas on the wire (`--ckpt-replicas 1`): the offer a node sends its ring neighbour for
//! one staged step, its authentication, and the receiver's pure judgement of it.
//!
//! # The exchange (one TCP connection per step, to the neighbour's replica port)
//! 1. The receiver sends a random [`NONCE_BYTES`]-byte nonce.
//! 2. The sender sends its [`Offer`] as a 4-byte big-endian length and JSON: the run, the
//!    generation and step, its node id, each file's final path, size and (when the rank gave
//!    one) SHA-256, and a MAC: HMAC-SHA256 keyed by the run's `--rdzv-token` over the nonce and
//!    the offer (empty without a token).
//! 3. The receiver judges it ([`judge`]: the run, the generation it follows, the sender is its
//!    ring predecessor, the MAC, plain paths inside `--ckpt-dir`), then its budget
//!    ([`super::replica::release`]), and answers one line: `take` or `refused: <why>`.
//! 4. On `take`, each file's bytes follow, each with its SHA-256 (32 bytes) after it; the
//!    receiver hashes what it reads and compares (and with the rank's digest when the offer
//!    has one), then answers `ok` or `bad: <why>`. Only a step whose every file was verified is
//!    held; anything else is deleted.

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Bytes of the receiver's nonce.
pub const NONCE_BYTES: usize = 16;
/// The largest offer header read (a step with thousands of files fits).
pub const MAX_OFFER: u32 = 4 << 20;

/// One file of an offer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferFile {
    /// Its final path in `--ckpt-dir` (the staged copy mirrors it).
    pub path: String,
    /// Bytes.
    pub bytes: u64,
    /// The rank's SHA-256 (hex), when it sent one; empty otherwise.
    pub sha256: String,
    /// The global rank that wrote it (`None` from an older agent: such a replica is kept but
    /// not offered for a resume after a node loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// What a node offers its ring neighbour: its staged files of one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The run.
    pub run_id: String,
    /// The generation that saved the step.
    pub generation: u64,
    /// The step.
    pub step: u64,
    /// The sender's node id.
    pub from: String,
    /// The files, in the order their bytes follow.
    pub files: Vec<OfferFile>,
    /// HMAC-SHA256 (hex) of the nonce and the offer with this field empty, keyed by the run's
    /// token; empty without one.
    pub mac: String,
}

impl Offer {
    /// Bytes the files hold.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Signs the offer for `nonce` with `token` (nothing without one).
    pub fn sign(&mut self, token: Option<&str>, nonce: &[u8]) {
        self.mac = token.map_or_else(String::new, |t| self.mac_for(t, nonce));
    }

    fn mac_for(&self, token: &str, nonce: &[u8]) -> String {
        let unsigned = Offer {
            mac: String::new(),
            ..self.clone()
        };
        let mut msg = nonce.to_vec();
        msg.extend(serde_json::to_vec(&unsigned).expect("an offer serializes"));
        crate::ckpt::verify::hex(&hmac_sha256(token.as_bytes(), &msg))
    }

    /// The header on the wire: length and JSON.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("an offer serializes");
        let mut out = (json.len() as u32).to_be_bytes().to_vec();
        out.extend(json);
        out
    }
}

/// A request for the staged files of a step the new world resumes from memory (`Plan::
/// resume_memory` names the receiving node as their source): sent in place of an [`Offer`] on
/// the same connection, told apart by its `fetch` field. The receiver judges it
/// ([`judge_fetch`]), answers `take` or `refused: <why>`, and on `take` sends each file's bytes
/// followed by its SHA-256 (32 bytes), as an offer's sender does; the requester verifies each
/// against the digest and the plan's, and answers `ok` or `bad: <why>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetch {
    /// Always `true`: marks a fetch.
    pub fetch: bool,
    /// The run.
    pub run_id: String,
    /// The generation the requester follows (the one resuming the step).
    pub generation: u64,
    /// The requester's node id.
    pub from: String,
    /// The step.
    pub step: u64,
    /// The generation that saved the step.
    pub saved_in: u64,
    /// The files wanted, with their sizes and digests from the plan.
    pub files: Vec<OfferFile>,
    /// HMAC-SHA256 (hex) of the nonce and the request with this field empty, keyed by the
    /// run's token; empty without one.
    pub mac: String,
}

impl Fetch {
    /// Bytes the files hold.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Signs the request for `nonce` with `token` (nothing without one).
    pub fn sign(&mut self, token: Option<&str>, nonce: &[u8]) {
        self.mac = token.map_or_else(String::new, |t| self.mac_for(t, nonce));
    }

    fn mac_for(&self, token: &str, nonce: &[u8]) -> String {
        let unsigned = Fetch {
            mac: String::new(),
            ..self.clone()
        };
        let mut msg = nonce.to_vec();
        msg.extend(serde_json::to_vec(&unsigned).expect("a fetch serializes"));
        crate::ckpt::verify::hex(&hmac_sha256(token.as_bytes(), &msg))
    }

    /// The header on the wire: length and JSON.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("a fetch serializes");
        let mut out = (json.len() as u32).to_be_bytes().to_vec();
        out.extend(json);
        out
    }
}

/// What a connection's header is.
#[derive(Debug)]
pub enum Header {
    /// A ring predecessor's staged step.
    Offer(Offer),
    /// A member's request for files a resume from memory needs.
    Fetch(Fetch),
}

/// A connection's header that is neither an offer nor a fetch.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// Not JSON, or JSON that is not an [`Offer`].
    #[error("not an offer: {0}")]
    NotAnOffer(#[source] serde_json::Error),
    /// JSON marked as a fetch that is not a [`Fetch`].
    #[error("not a fetch: {0}")]
    NotAFetch(#[source] serde_json::Error),
}

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

/// Decodes a connection's header: a fetch when it says so, else an offer.
///
/// # Errors
/// A header that is neither.
pub fn decode(header: &[u8]) -> Result<Header, HeaderError> {
    let v: serde_json::Value = serde_json::from_slice(header).map_err(HeaderError::NotAnOffer)?;
    if v.get("fetch").and_then(serde_json::Value::as_bool) == Some(true) {
        serde_json::from_value(v)
            .map(Header::Fetch)
            .map_err(HeaderError::NotAFetch)
    } else {
        serde_json::from_value(v)
            .map(Header::Offer)
            .map_err(HeaderError::NotAnOffer)
    }
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
    match paths.find(|p| super::staged_path(Path::new("/"), ckpt_dir, Path::new(p)).is_none()) {
        Some(p) => Err(Refusal::Outside {
            path: PathBuf::from(p),
            ckpt_dir: ckpt_dir.to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// HMAC-SHA256 (RFC 2104) of `msg` keyed by `key`.
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
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
    let from = super::replica::predecessor(&ids, r.me);
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
mod tests {
    use super::*;

    fn offer(from: &str) -> Offer {
        Offer {
            run_id: "job".into(),
            generation: 2,
            step: 8,
            from: from.into(),
            files: vec![OfferFile {
                path: "/ck/job/step-8-g2/rank0.pt".into(),
                bytes: 3,
                sha256: String::new(),
                rank: Some(0),
            }],
            mac: String::new(),
        }
    }

    fn nodes() -> Vec<(String, String)> {
        ["a", "b", "c"]
            .map(|n| (n.to_string(), "127.0.0.1".to_string()))
            .to_vec()
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn fetch(from: &str) -> Fetch {
        Fetch {
            fetch: true,
            run_id: "job".into(),
            generation: 3,
            from: from.into(),
            step: 8,
            saved_in: 2,
            files: offer("a").files,
            mac: String::new(),
        }
    }

    #[test]
    fn a_fetch_is_served_to_any_member_of_the_followed_generation_and_told_from_an_offer() {
        let n = nodes();
        let r = Receiver {
            run_id: "job",
            generation: Some((3, &n)),
            me: "b",
            peer: LOCAL,
            token: Some("tok"),
            nonce: b"0123456789abcdef",
            ckpt_dir: Path::new("/ck"),
        };
        let mut f = fetch("c");
        f.sign(Some("tok"), r.nonce);
        assert_eq!(
            judge_fetch(&f, &r),
            Ok(()),
            "c is not b's predecessor: still served"
        );
        let Header::Fetch(back) = decode(&f.encode()[4..]).unwrap() else {
            panic!("a fetch decodes as one")
        };
        assert_eq!(back, f);
        assert!(matches!(
            decode(&offer("a").encode()[4..]),
            Ok(Header::Offer(_))
        ));
        assert!(matches!(decode(b"{}"), Err(HeaderError::NotAnOffer(_))));
        assert!(matches!(
            decode(br#"{"fetch": true}"#),
            Err(HeaderError::NotAFetch(_))
        ));
        assert!(decode(b"{}")
            .unwrap_err()
            .to_string()
            .starts_with("not an offer: "));
        let unsigned = fetch("c");
        assert_eq!(judge_fetch(&unsigned, &r), Err(Refusal::FetchMac));
        assert_eq!(
            Refusal::FetchMac.to_string(),
            "the fetch's MAC does not match this run's token"
        );
        let mut stranger = fetch("x");
        stranger.sign(Some("tok"), r.nonce);
        assert_eq!(
            judge_fetch(&stranger, &r).unwrap_err().to_string(),
            "'x' is not a member of generation 3"
        );
        let earlier = Receiver {
            generation: Some((2, &n)),
            ..r
        };
        let refused = judge_fetch(&f, &earlier).unwrap_err();
        assert_eq!(
            refused,
            Refusal::FetchInGeneration {
                generation: 3,
                follows: 2
            }
        );
        assert_eq!(
            refused.to_string(),
            "a fetch in generation 3, this node follows generation 2"
        );
        let elsewhere = Receiver {
            peer: "10.0.0.9".parse().unwrap(),
            ..r
        };
        let refused = judge_fetch(&f, &elsewhere).unwrap_err();
        assert!(matches!(
            refused,
            Refusal::FetchFromElsewhere { ref from, advertised, .. } if from == "c" && advertised == LOCAL
        ));
        assert_eq!(
            refused.to_string(),
            "the connection of 'c' came from 10.0.0.9, but that node advertises 127.0.0.1"
        );
        let mut escape = fetch("c");
        escape.files[0].path = "/ck/../etc/passwd".into();
        escape.sign(Some("tok"), r.nonce);
        let refused = judge_fetch(&escape, &r).unwrap_err();
        assert!(matches!(refused, Refusal::Outside { .. }));
        assert_eq!(
            refused.to_string(),
            "'/ck/../etc/passwd' is not a plain path inside --ckpt-dir /ck"
        );
        escape.files.clear();
        escape.sign(Some("tok"), r.nonce);
        assert_eq!(judge_fetch(&escape, &r), Err(Refusal::NoFilesFetched));
        let mut other = fetch("c");
        other.run_id = "other".into();
        assert!(matches!(
            judge_fetch(&other, &r),
            Err(Refusal::FetchOfRun { .. })
        ));
        let between = Receiver {
            generation: None,
            ..r
        };
        assert_eq!(judge_fetch(&f, &between), Err(Refusal::NoGeneration));
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231, test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            crate::ckpt::verify::hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // A key longer than a block is hashed first (test case 6).
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(
            crate::ckpt::verify::hex(&mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn an_offer_is_taken_only_from_the_ring_predecessor_of_the_followed_generation() {
        let n = nodes();
        let r = Receiver {
            run_id: "job",
            generation: Some((2, &n)),
            me: "b",
            peer: LOCAL,
            token: None,
            nonce: b"0123456789abcdef",
            ckpt_dir: Path::new("/ck"),
        };
        assert_eq!(judge(&offer("a"), &r), Ok(()));
        let refused = judge(&offer("c"), &r).unwrap_err();
        assert_eq!(
            refused,
            Refusal::NotPredecessor {
                from: "c".into(),
                generation: 2,
                predecessor: Some("a".into())
            }
        );
        assert_eq!(
            refused.to_string(),
            "'c' is not the node whose replicas this node holds in generation 2 (a)"
        );
        assert!(
            matches!(judge(&offer("x"), &r), Err(Refusal::NotPredecessor { .. })),
            "not in the generation"
        );
        let elsewhere = Receiver {
            peer: "10.0.0.9".parse().unwrap(),
            ..r
        };
        let refused = judge(&offer("a"), &elsewhere).unwrap_err();
        assert!(matches!(refused, Refusal::OfferFromElsewhere { .. }));
        assert_eq!(
            refused.to_string(),
            "the offer of 'a' came from 10.0.0.9, but that node advertises 127.0.0.1"
        );
        let later = Receiver {
            generation: Some((3, &n)),
            ..r
        };
        let refused = judge(&offer("a"), &later).unwrap_err();
        assert_eq!(
            refused,
            Refusal::OfferOfGeneration {
                generation: 2,
                follows: 3
            }
        );
        assert_eq!(
            refused.to_string(),
            "an offer of generation 2, this node follows generation 3"
        );
        let none = Receiver {
            generation: None,
            ..r
        };
        assert_eq!(judge(&offer("a"), &none), Err(Refusal::NoGeneration));
        assert_eq!(
            Refusal::NoGeneration.to_string(),
            "this node follows no generation now"
        );
        let mut other = offer("a");
        other.run_id = "other".into();
        let refused = judge(&other, &r).unwrap_err();
        assert!(matches!(refused, Refusal::OfferOfRun { ref run_id, .. } if run_id == "other"));
        assert_eq!(refused.to_string(), "an offer of run 'other', not 'job'");
        let mut escape = offer("a");
        escape.files[0].path = "/ck/../etc/passwd".into();
        assert_eq!(
            judge(&escape, &r).unwrap_err().to_string(),
            "'/ck/../etc/passwd' is not a plain path inside --ckpt-dir /ck"
        );
        escape.files.clear();
        assert_eq!(judge(&escape, &r), Err(Refusal::NoFilesOffered));
        assert_eq!(Refusal::NoFilesOffered.to_string(), "an offer of no files");
    }

    #[test]
    fn with_a_token_only_an_offer_signed_for_this_nonce_is_taken() {
        let n = nodes();
        let nonce = b"0123456789abcdef";
        let r = Receiver {
            run_id: "job",
            generation: Some((2, &n)),
            me: "b",
            peer: LOCAL,
            token: Some("s3cret"),
            nonce,
            ckpt_dir: Path::new("/ck"),
        };
        let mut o = offer("a");
        assert_eq!(judge(&o, &r), Err(Refusal::OfferMac), "unsigned");
        assert_eq!(
            Refusal::OfferMac.to_string(),
            "the offer's MAC does not match this run's token"
        );
        o.sign(Some("s3cret"), nonce);
        assert_eq!(judge(&o, &r), Ok(()));
        o.sign(Some("wrong"), nonce);
        assert_eq!(judge(&o, &r), Err(Refusal::OfferMac), "another token");
        o.sign(Some("s3cret"), b"another nonce!!!");
        assert_eq!(judge(&o, &r), Err(Refusal::OfferMac), "a replayed offer");
        o.sign(Some("s3cret"), nonce);
        o.step = 9;
        assert_eq!(
            judge(&o, &r),
            Err(Refusal::OfferMac),
            "altered after signing"
        );
        let bytes = o.encode();
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        let back: Offer = serde_json::from_slice(&bytes[4..4 + len]).unwrap();
        assert_eq!(back, o);
    }
}
