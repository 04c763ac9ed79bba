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
    fn name(&self) -> String {
        format!("{} ({})", self.path.display(), self.flag)
    }
}

/// The certificates of `f`, at least one.
///
/// # Errors
/// No `CERTIFICATE` block, or one that does not decode: one line naming the file and flag.
pub fn certificates(f: &PemFile<'_>) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(f.bytes).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(c),
        Ok(_) => Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the certificate's PEM file",
            f.name()
        )),
        Err(e) => Err(format!("{} is not a readable PEM certificate: {e}", f.name())),
    }
}

/// Checks that `ca` holds certificates a client or server can trust.
///
/// # Errors
/// No certificate, or one that is not a usable trust anchor: one line.
pub fn check_ca(ca: &PemFile<'_>) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca)? {
        roots
            .add(c)
            .map_err(|e| format!("{} holds a certificate that cannot be a CA: {e}", ca.name()))?;
    }
    Ok(())
}

/// Checks that `cert` holds a certificate chain, `key` a private key, and that the key belongs
/// to the chain's first certificate.
///
/// # Errors
/// Either file unreadable as PEM, or a key of another certificate: one line naming both flags.
pub fn check_identity(cert: &PemFile<'_>, key: &PemFile<'_>) -> Result<(), String> {
    let chain = certificates(cert)?;
    let der = PrivateKeyDer::from_pem_slice(key.bytes).map_err(|e| {
        format!(
            "{} holds no readable PEM private key (-----BEGIN ... PRIVATE KEY-----): {e}",
            key.name()
        )
    })?;
    let provider = rustls::crypto::ring::default_provider();
    match rustls::sign::CertifiedKey::from_der(chain, der, &provider) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => Err(format!(
            "the private key {} does not belong to the certificate {}; give the key the certificate was issued for",
            key.name(),
            cert.name()
        )),
        // webpki reads only X.509 v3 certificates (RFC 5280 §4.1.2.1); `openssl x509 -req`
        // without an extensions file still writes v1.
        Err(e) if format!("{e:?}").contains("UnsupportedCertVersion") => Err(format!(
            "{} is an X.509 v1 certificate, and TLS here takes only v3; reissue it as v3 with a subjectAltName naming the host (openssl x509 -req ... -extfile <(echo subjectAltName=DNS:HOST))",
            cert.name()
        )),
        Err(e) => Err(format!(
            "the certificate {} and key {} cannot be used: {e}",
            cert.name(),
            key.name()
        )),
    }
}

#[cfg(test)]
mod tests;
