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
use std::path::Path;

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

/// Whether `offer` may be taken by `r` (before its budget is asked): `Err` with one line why
/// not.
pub fn judge(offer: &Offer, r: &Receiver<'_>) -> Result<(), String> {
    if offer.run_id != r.run_id {
        return Err(format!(
            "an offer of run '{}', not '{}'",
            offer.run_id, r.run_id
        ));
    }
    let Some((generation, nodes)) = r.generation else {
        return Err("this node follows no generation now".into());
    };
    if offer.generation != generation {
        return Err(format!(
            "an offer of generation {}, this node follows generation {generation}",
            offer.generation
        ));
    }
    let ids: Vec<String> = nodes.iter().map(|(id, _)| id.clone()).collect();
    let from = super::replica::predecessor(&ids, r.me);
    if from != Some(offer.from.as_str()) {
        return Err(format!(
            "'{}' is not the node whose replicas this node holds in generation {generation} ({})",
            offer.from,
            from.unwrap_or("none")
        ));
    }
    // A node advertising an IP address sends from it (a host name is not resolved here).
    let advertised = nodes
        .iter()
        .find(|(id, _)| *id == offer.from)
        .and_then(|(_, a)| a.parse::<IpAddr>().ok());
    if let Some(ip) = advertised.filter(|ip| {
        *ip != r.peer && !(ip.is_loopback() && r.peer.is_loopback()) && !ip.is_unspecified()
    }) {
        return Err(format!(
            "the offer of '{}' came from {}, but that node advertises {ip}",
            offer.from, r.peer
        ));
    }
    if let Some(t) = r.token {
        if offer.mac.is_empty() || !same(offer.mac.as_bytes(), offer.mac_for(t, r.nonce).as_bytes())
        {
            return Err("the offer's MAC does not match this run's token".into());
        }
    }
    if offer.files.is_empty() {
        return Err("an offer of no files".into());
    }
    for f in &offer.files {
        if super::staged_path(Path::new("/"), r.ckpt_dir, Path::new(&f.path)).is_none() {
            return Err(format!(
                "'{}' is not a plain path inside --ckpt-dir {}",
                f.path,
                r.ckpt_dir.display()
            ));
        }
    }
    Ok(())
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
        assert_eq!(
            judge(&offer("c"), &r).unwrap_err(),
            "'c' is not the node whose replicas this node holds in generation 2 (a)"
        );
        assert!(judge(&offer("x"), &r).is_err(), "not in the generation");
        let elsewhere = Receiver {
            peer: "10.0.0.9".parse().unwrap(),
            ..r
        };
        assert_eq!(
            judge(&offer("a"), &elsewhere).unwrap_err(),
            "the offer of 'a' came from 10.0.0.9, but that node advertises 127.0.0.1"
        );
        let later = Receiver {
            generation: Some((3, &n)),
            ..r
        };
        assert!(judge(&offer("a"), &later)
            .unwrap_err()
            .contains("generation 2, this node follows generation 3"));
        let none = Receiver {
            generation: None,
            ..r
        };
        assert!(judge(&offer("a"), &none).is_err());
        let mut other = offer("a");
        other.run_id = "other".into();
        assert!(judge(&other, &r).unwrap_err().contains("run 'other'"));
        let mut escape = offer("a");
        escape.files[0].path = "/ck/../etc/passwd".into();
        assert!(judge(&escape, &r).unwrap_err().contains("not a plain path"));
        escape.files.clear();
        assert!(judge(&escape, &r).is_err());
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
        assert!(judge(&o, &r).unwrap_err().contains("MAC"), "unsigned");
        o.sign(Some("s3cret"), nonce);
        assert_eq!(judge(&o, &r), Ok(()));
        o.sign(Some("wrong"), nonce);
        assert!(judge(&o, &r).is_err(), "another token");
        o.sign(Some("s3cret"), b"another nonce!!!");
        assert!(judge(&o, &r).is_err(), "a replayed offer");
        o.sign(Some("s3cret"), nonce);
        o.step = 9;
        assert!(judge(&o, &r).is_err(), "altered after signing");
        let bytes = o.encode();
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        let back: Offer = serde_json::from_slice(&bytes[4..4 + len]).unwrap();
        assert_eq!(back, o);
    }
}
