//! TLS of the `drun.v1` service, with tonic's rustls support (ring provider): the server's
//! certificate and key (`--tls-cert`, `--tls-key`), optionally a client CA that makes client
//! certificates mandatory (mTLS, `--tls-client-ca`); an agent's CA to trust (`--rdzv-tls-ca`)
//! and, for mTLS, its own certificate and key (`--rdzv-tls-cert`, `--rdzv-tls-key`). All PEM.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::server::pem_check::{check_ca, check_identity, PemError, PemFile};

/// A TLS setting that cannot be used: one line naming the file and its flag, never a key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file that cannot be read.
    #[error("cannot read the {what} {} ({flag}): {source}", path.display())]
    Read {
        /// What the file should hold ("client CA").
        what: &'static str,
        /// The flag that named it.
        flag: String,
        /// Its path, as given.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// A file that is not the PEM it should be, or a key of another certificate.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// Only one of `--rdzv-tls-cert` and `--rdzv-tls-key`.
    #[error("--rdzv-tls-cert and --rdzv-tls-key go together: give both")]
    HalfIdentity,
    /// An endpoint that is not a valid URI, or a TLS setting tonic refuses.
    #[error("{0}")]
    Endpoint(#[source] tonic::transport::Error),
}

fn read(what: &'static str, flag: &str, p: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(p).map_err(|source| TlsError::Read {
        what,
        flag: flag.to_string(),
        path: p.to_path_buf(),
        source,
    })
}

/// The PEM files of a server's TLS: `cert`, `key`, and `client_ca` for mTLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// `--tls-cert`: the server's certificate chain.
    pub cert: PathBuf,
    /// `--tls-key`: its private key.
    pub key: PathBuf,
    /// `--tls-client-ca`: clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

impl ServerTlsFiles {
    /// The server's TLS configuration, its files named by `drun-rendezvous serve`'s flags.
    ///
    /// # Errors
    /// As [`ServerTlsFiles::load_named`].
    pub fn load(&self) -> Result<ServerTlsConfig, TlsError> {
        self.load_named(["--tls-cert", "--tls-key", "--tls-client-ca"])
    }

    /// The server's TLS configuration; `flags` names the cert, key and client CA files in
    /// messages (an agent hosting a c10d rendezvous: `--rdzv-host-tls-cert`, ...).
    ///
    /// # Errors
    /// A file that cannot be read, is not the PEM it should be, or a key that does not belong
    /// to the certificate ([`crate::server::pem_check`]): one line naming the file and its flag.
    pub fn load_named(&self, flags: [&str; 3]) -> Result<ServerTlsConfig, TlsError> {
        let [cert_flag, key_flag, ca_flag] = flags;
        let cert = read("certificate", cert_flag, &self.cert)?;
        let key = read("private key", key_flag, &self.key)?;
        check_identity(
            &PemFile {
                bytes: &cert,
                path: &self.cert,
                flag: cert_flag,
            },
            &PemFile {
                bytes: &key,
                path: &self.key,
                flag: key_flag,
            },
        )?;
        let mut cfg = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(path) = &self.client_ca {
            let ca = read("client CA", ca_flag, path)?;
            check_ca(&PemFile {
                bytes: &ca,
                path,
                flag: ca_flag,
            })?;
            cfg = cfg.client_ca_root(Certificate::from_pem(ca));
        }
        Ok(cfg)
    }
}

/// What a client needs to reach a TLS server: the CA to trust and, for mTLS, its identity.
#[derive(Clone)]
pub struct ClientTls {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("mtls", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        self.ca == other.ca && self.identity == other.identity
    }
}

impl ClientTls {
    /// Reads `ca` and, when both are given, the client's `cert` and `key`.
    ///
    /// # Errors
    /// A file that cannot be read or is not the PEM it should be, a key that does not belong to
    /// the certificate ([`crate::server::pem_check`]), or only one of `cert` and `key`: one line naming
    /// the file and its flag.
    pub fn from_files(
        ca_path: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let ca = read("CA certificate", "--rdzv-tls-ca", ca_path)?;
        check_ca(&PemFile {
            bytes: &ca,
            path: ca_path,
            flag: "--rdzv-tls-ca",
        })?;
        let identity = match (cert, key) {
            (Some(c), Some(k)) => {
                let cert = read("client certificate", "--rdzv-tls-cert", c)?;
                let key = read("client key", "--rdzv-tls-key", k)?;
                check_identity(
                    &PemFile {
                        bytes: &cert,
                        path: c,
                        flag: "--rdzv-tls-cert",
                    },
                    &PemFile {
                        bytes: &key,
                        path: k,
                        flag: "--rdzv-tls-key",
                    },
                )?;
                Some((cert, key))
            }
            (None, None) => None,
            _ => {
                return Err(TlsError::HalfIdentity);
            }
        };
        Ok(ClientTls { ca, identity })
    }

    fn config(&self) -> ClientTlsConfig {
        let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
        if let Some((c, k)) = &self.identity {
            cfg = cfg.identity(Identity::from_pem(c, k));
        }
        cfg
    }
}

/// The endpoint `host:port` over TLS when `tls` is given (`https://`), else plaintext; with TLS
/// the server's certificate must name `server_name` (`None`: `ep`'s host).
///
/// # Errors
/// An endpoint that is not a valid URI, or a TLS setting tonic refuses: one line.
pub fn endpoint(
    ep: &str,
    tls: Option<&ClientTls>,
    server_name: Option<&str>,
) -> Result<Endpoint, TlsError> {
    let url = match tls {
        Some(_) if !ep.contains("://") => format!("https://{ep}"),
        _ => crate::error::endpoint_url(ep),
    };
    let e = Endpoint::from_shared(url).map_err(TlsError::Endpoint)?;
    match tls {
        Some(t) => {
            let mut cfg = t.config();
            if let Some(n) = server_name {
                cfg = cfg.domain_name(n);
            }
            e.tls_config(cfg).map_err(TlsError::Endpoint)
        }
        None => Ok(e),
    }
}

/// How a client connects, for [`hint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No TLS.
    Plain,
    /// TLS without a client certificate.
    Tls,
    /// TLS with a client certificate.
    Mutual,
}

impl Mode {
    /// The mode of `tls`.
    pub fn of(tls: Option<&ClientTls>) -> Mode {
        match tls {
            None => Mode::Plain,
            Some(t) if t.identity.is_some() => Mode::Mutual,
            Some(_) => Mode::Tls,
        }
    }
}

/// A hint for a connection that failed (`error`: its whole chain): a plaintext client of a TLS
/// server, a TLS client of a server it does not trust or of a plaintext server, and a client
/// without a certificate that an mTLS server closes after the handshake are named as such.
pub fn hint(error: &str, mode: Mode) -> Option<&'static str> {
    let e = error.to_ascii_lowercase();
    let tls = mode != Mode::Plain;
    let closed = e.contains("connection reset")
        || e.contains("broken pipe")
        || e.contains("connection closed")
        || e.contains("unexpected end of file")
        || e.contains("connection was not ready");
    if tls && e.contains("certificaterequired") {
        Some("the server requires a client certificate: give --rdzv-tls-cert and --rdzv-tls-key")
    } else if mode == Mode::Tls && closed && !e.contains("certificate") {
        Some("the server closed the TLS connection: it may require a client certificate (--rdzv-tls-cert/--rdzv-tls-key)")
    } else if mode == Mode::Mutual
        && (closed || e.contains("alert"))
        && !e.contains("peer certificate")
    {
        Some("the server closed the TLS connection: it may not accept the client certificate (--rdzv-tls-cert signed by a CA other than its --tls-client-ca, or expired)")
    } else if tls && (e.contains("certificate") || e.contains("unknownissuer")) {
        Some("the server's certificate is not signed by --rdzv-tls-ca (wrong CA?), has expired or does not name this host, or the server wants a client certificate (--rdzv-tls-cert/--rdzv-tls-key)")
    } else if tls && (e.contains("invalidcontenttype") || e.contains("corrupt message")) {
        Some("the server does not speak TLS; drop --rdzv-tls-ca or give the server --tls-cert/--tls-key")
    } else if !tls && (closed || e.contains("h2 protocol error")) {
        Some("the server may require TLS: give the agent --rdzv-tls-ca CA.pem")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_tls_mismatch() {
        let h = |e, m| hint(e, m).unwrap_or_default();
        assert!(
            h("transport error: connection reset by peer", Mode::Plain).contains("--rdzv-tls-ca")
        );
        assert!(h("invalid peer certificate: UnknownIssuer", Mode::Tls).contains("wrong CA"));
        assert!(h("operation was canceled: connection closed", Mode::Tls)
            .contains("client certificate"));
        assert!(
            h("received fatal alert: CertificateRequired", Mode::Tls).contains("requires a client")
        );
        assert!(h("operation was canceled: connection closed", Mode::Mutual)
            .contains("may not accept the client certificate"));
        assert!(h("invalid peer certificate: Expired", Mode::Mutual).contains("expired"));
        assert_eq!(hint("Connection refused", Mode::Plain), None);
    }

    #[test]
    fn tls_endpoints_are_https() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca, p.self_signed(&ca_key).unwrap().pem()).unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let err = ClientTls::from_files(&key, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no PEM certificate") && err.contains("(--rdzv-tls-ca)"),
            "{err}"
        );
        // The CA's certificate with another key: refused at start, naming both flags.
        let err = ClientTls::from_files(&ca, Some(&ca), Some(&key))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not belong") && err.contains("--rdzv-tls-key"),
            "{err}"
        );
        let t = ClientTls::from_files(&ca, None, None).unwrap();
        let e = endpoint("127.0.0.1:5", Some(&t), None).unwrap();
        assert_eq!(e.uri().scheme_str(), Some("https"));
        let e = endpoint("127.0.0.1:5", None, None).unwrap();
        assert_eq!(e.uri().scheme_str(), Some("http"));
        let err = ClientTls::from_files(&ca, Some(&ca), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("go together"), "{err}");
        let err = ClientTls::from_files(&dir.path().join("gone"), None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--rdzv-tls-ca"), "{err}");
    }
}
