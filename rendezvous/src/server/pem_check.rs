//! Checks of the PEM files given to `--tls-*` and `--rdzv-tls-*`, done when they are read at
//! start, so that an empty file, a key in the certificate's place or a key that does not belong
//! to its certificate is one line naming the file and its flag (exit 2), not a handshake error
//! (or a server that says "listening" and then exits) later. Parsing and the key-pair check are
//! rustls's (`pki_types::pem`, `CertifiedKey::from_der`); the wording is ours.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// One PEM file as read: its bytes, its path and the flag that named it, for messages.
pub struct PemFile<'a> {
    /// The file's bytes.
    pub bytes: &'a [u8],
    /// Its path, as given.
    pub path: &'a Path,
    /// The flag that named it (`--tls-cert`).
    pub flag: &'a str,
}

impl PemFile<'_> {
    fn name(&self) -> PemName {
        PemName {
            path: self.path.into(),
            flag: self.flag.into(),
        }
    }
}

/// A PEM file as messages name it: `PATH (FLAG)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemName {
    /// Its path, as given.
    pub path: Box<Path>,
    /// The flag that named it.
    pub flag: Box<str>,
}

impl std::fmt::Display for PemName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.path.display(), self.flag)
    }
}

/// A PEM file that is not what its flag asks for: one line naming the file and its flag.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// No `CERTIFICATE` block.
    #[error("{0} holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the certificate's PEM file")]
    NoCertificate(PemName),
    /// A `CERTIFICATE` block that does not decode.
    #[error("{file} is not a readable PEM certificate: {source}")]
    BadCertificate {
        /// The file.
        file: PemName,
        /// What the PEM reader said.
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate that is no usable trust anchor.
    #[error("{file} holds a certificate that cannot be a CA: {source}")]
    NotCa {
        /// The file.
        file: PemName,
        /// What rustls said.
        source: Box<rustls::Error>,
    },
    /// No private key block.
    #[error(
        "{file} holds no readable PEM private key (-----BEGIN ... PRIVATE KEY-----): {source}"
    )]
    NoKey {
        /// The file.
        file: PemName,
        /// What the PEM reader said.
        source: rustls::pki_types::pem::Error,
    },
    /// A key of another certificate.
    #[error("the private key {key} does not belong to the certificate {cert}; give the key the certificate was issued for")]
    KeyMismatch {
        /// The key file.
        key: PemName,
        /// The certificate file.
        cert: PemName,
    },
    /// An X.509 v1 certificate, which webpki does not read.
    #[error("{0} is an X.509 v1 certificate, and TLS here takes only v3; reissue it as v3 with a subjectAltName naming the host (openssl x509 -req ... -extfile <(echo subjectAltName=DNS:HOST))")]
    Version1(PemName),
    /// Any other reason rustls refuses the pair.
    #[error("the certificate {cert} and key {key} cannot be used: {source}")]
    Unusable {
        /// The certificate file.
        cert: PemName,
        /// The key file.
        key: PemName,
        /// What rustls said.
        source: Box<rustls::Error>,
    },
}

/// The certificates of `f`, at least one.
///
/// # Errors
/// No `CERTIFICATE` block, or one that does not decode: one line naming the file and flag.
pub fn certificates(f: &PemFile<'_>) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(f.bytes).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(c),
        Ok(_) => Err(PemError::NoCertificate(f.name())),
        Err(source) => Err(PemError::BadCertificate {
            file: f.name(),
            source,
        }),
    }
}

/// Checks that `ca` holds certificates a client or server can trust.
///
/// # Errors
/// No certificate, or one that is not a usable trust anchor: one line.
pub fn check_ca(ca: &PemFile<'_>) -> Result<(), PemError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca)? {
        roots.add(c).map_err(|source| PemError::NotCa {
            file: ca.name(),
            source: Box::new(source),
        })?;
    }
    Ok(())
}

/// Checks that `cert` holds a certificate chain, `key` a private key, and that the key belongs
/// to the chain's first certificate.
///
/// # Errors
/// Either file unreadable as PEM, or a key of another certificate: one line naming both flags.
pub fn check_identity(cert: &PemFile<'_>, key: &PemFile<'_>) -> Result<(), PemError> {
    let chain = certificates(cert)?;
    let der = PrivateKeyDer::from_pem_slice(key.bytes).map_err(|source| PemError::NoKey {
        file: key.name(),
        source,
    })?;
    let provider = rustls::crypto::ring::default_provider();
    match rustls::sign::CertifiedKey::from_der(chain, der, &provider) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(PemError::KeyMismatch {
                key: key.name(),
                cert: cert.name(),
            })
        }
        // webpki reads only X.509 v3 certificates (RFC 5280 §4.1.2.1); `openssl x509 -req`
        // without an extensions file still writes v1.
        Err(e) if format!("{e:?}").contains("UnsupportedCertVersion") => {
            Err(PemError::Version1(cert.name()))
        }
        Err(source) => Err(PemError::Unusable {
            cert: cert.name(),
            key: key.name(),
            source: Box::new(source),
        }),
    }
}

#[cfg(test)]
mod tests;
