//! Replicas on the wire (`--ckpt-replicas 1`): the offer a node sends its ring neighbour for
//! one staged step and its authentication; the receiver's pure judgement of it is `wire/judge.rs`.
//!
//! # The exchange (one TCP connection per step, to the neighbour's replica port)
//! 1. The receiver sends a random [`NONCE_BYTES`]-byte nonce.
//! 2. The sender sends its [`Offer`] as a 4-byte big-endian length and JSON: the run, the
//!    generation and step, its node id, each file's final path, size and (when known) digest,
//!    and a MAC: HMAC-SHA256 keyed by the run's `--rdzv-token` over the nonce and
//!    the offer (empty without a token).
//! 3. The receiver judges it ([`judge::judge`]: the run, the generation it follows, the sender
//!    is its ring predecessor, the MAC, plain paths inside `--ckpt-dir`), then its budget
//!    ([`super::replica::release`]), and answers one line: `take` or `refused: <why>`.
//! 4. On `take`, each file's bytes follow, each with its digest (32 bytes: taken with the
//!    function the offer's digest names, or BLAKE3 where it has none) after it; the
//!    receiver hashes what it reads and compares (and with the rank's digest when the offer
//!    has one), then answers `ok` or `bad: <why>`. Only a step whose every file was verified is
//!    held; anything else is deleted.

use serde::{Deserialize, Serialize};

use crate::mac::hmac_sha256;

pub mod judge;

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
    /// The file's digest as a manifest spells it (the rank's SHA-256, or the agent's BLAKE3
    /// once it has hashed the file), when known; empty otherwise. The bytes that follow are
    /// hashed with the function it names, or with BLAKE3 ([`crate::ckpt::digest::Hasher::like`]).
    #[serde(alias = "sha256")]
    pub digest: String,
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
        let body = serde_json::to_vec(&unsigned).expect("an offer serializes");
        crate::hex::hex(&hmac_sha256(token.as_bytes(), &[nonce, &body]))
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
/// ([`judge::judge_fetch`]), answers `take` or `refused: <why>`, and on `take` sends each
/// file's bytes followed by its digest (32 bytes), as an offer's sender does; the requester
/// verifies each against the digest and the plan's, and answers `ok` or `bad: <why>`.
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
        let body = serde_json::to_vec(&unsigned).expect("a fetch serializes");
        crate::hex::hex(&hmac_sha256(token.as_bytes(), &[nonce, &body]))
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
