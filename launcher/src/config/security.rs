//! Credentials ([`SecurityConfig`]): the rendezvous token, TLS to (and of) the rendezvous, the
//! Slurm secret and how etcd is reached; validated by [`security`], read by [`super::prepare`].

use std::path::PathBuf;

use drun_rendezvous::server::auth::Secret;
use drun_rendezvous::server::tls::{ClientTls, ServerTlsFiles};
use drun_rendezvous::store::etcd::access::{EtcdAccess, EtcdAccessFiles};

use super::{invalid, Host, RendezvousMode};
use crate::{Args, ConfigError};

/// `--rdzv-tls-ca`, and the client's `--rdzv-tls-cert` and `--rdzv-tls-key` for mTLS.
pub type ClientTlsFiles = (PathBuf, Option<PathBuf>, Option<PathBuf>);

/// The launch's credentials: files as given, and what [`super::prepare`] read from them.
#[derive(Debug, Clone)]
pub struct SecurityConfig {
    /// `--rdzv-token-file`, read by [`super::prepare`] into `rdzv_token`.
    pub rdzv_token_file: Option<PathBuf>,
    /// The token sent to the rendezvous server: `DRUN_RDZV_TOKEN`, or the file's once prepared.
    pub rdzv_token: Option<Secret>,
    /// `--rdzv-tls-ca`, `--rdzv-tls-cert`, `--rdzv-tls-key` (read by [`super::prepare`] into
    /// `rdzv_tls`).
    pub rdzv_tls_files: Option<ClientTlsFiles>,
    /// TLS to the rendezvous server, once prepared.
    pub rdzv_tls: Option<ClientTls>,
    /// `--rdzv-host-tls-cert`/`-key` (c10d only): the identity this agent serves the
    /// rendezvous with when it hosts it, and the CA it requires of clients for mTLS.
    pub rdzv_host_tls: Option<ServerTlsFiles>,
    /// Under Slurm, the file of the secret the rendezvous token is derived from when none is
    /// given (`DRUN_SLURM_SECRET`, else `$HOME/.drun/slurm-secret`; `None`: off or no home).
    pub slurm_secret: Option<PathBuf>,
    /// `--etcd-cacert`, `--etcd-cert`, `--etcd-key`, `--etcd-user`, `--etcd-password-file`,
    /// read by [`super::prepare`] into `etcd_access`.
    pub etcd_access_files: EtcdAccessFiles,
    /// How the `etcd` backend reaches etcd (TLS, user), once prepared; holds the password
    /// (from the file or `DRUN_ETCD_PASSWORD`), never printed.
    pub etcd_access: EtcdAccess,
}

impl SecurityConfig {
    /// The `--rdzv-token`'s text, for the agent-to-agent paths that sign with it (checkpoint
    /// replicas and their fetches); it never crosses a connection.
    pub fn rdzv_token_text(&self) -> Option<String> {
        self.rdzv_token.as_ref().map(|t| t.expose().to_string())
    }
}

/// The credential flags against the rendezvous `mode`: the c10d host's TLS identity, the
/// endpoints' scheme against `--rdzv-tls-ca`, `DRUN_RDZV_TOKEN`, the client certificate (only
/// with a CA); `in_slurm`: the Slurm secret's path is taken from the host.
///
/// # Errors
/// Host TLS flags without c10d or without `--rdzv-tls-ca`, c10d with a CA but no host identity,
/// an `https://` endpoint without a CA or an `http://` one with it, an unusable
/// `DRUN_RDZV_TOKEN`, a client certificate or key without a CA.
pub(super) fn security(
    a: &Args,
    host: &Host,
    mode: &RendezvousMode,
    in_slurm: bool,
) -> Result<SecurityConfig, ConfigError> {
    let rdzv_host_tls = host_tls(a, mode)?;
    scheme_agrees_with_tls(mode, a.rdzv_tls_ca.is_some())?;
    let rdzv_token = crate::rdzv::token::resolve(None, host.var(crate::rdzv::token::TOKEN_VAR))?;
    let rdzv_tls_files = client_tls_files(a)?;
    Ok(SecurityConfig {
        rdzv_token_file: a.rdzv_token_file.clone(),
        rdzv_token,
        rdzv_tls_files,
        rdzv_tls: None,
        rdzv_host_tls,
        slurm_secret: in_slurm
            .then(|| {
                crate::slurm_token::secret_path(
                    host.var(crate::slurm_token::SECRET_VAR),
                    host.var("HOME"),
                )
            })
            .flatten(),
        etcd_access_files: a.etcd.files(),
        etcd_access: EtcdAccess::default(),
    })
}

/// `--rdzv-tls-ca`, `--rdzv-tls-cert`, `--rdzv-tls-key`: a client certificate is sent only over
/// TLS, so it needs the CA.
fn client_tls_files(a: &Args) -> Result<Option<ClientTlsFiles>, ConfigError> {
    match (&a.rdzv_tls_ca, &a.rdzv_tls_cert, &a.rdzv_tls_key) {
        (None, Some(f), _) | (None, None, Some(f)) => Err(invalid(
            "--rdzv-tls-cert/--rdzv-tls-key",
            f.display().to_string(),
            "a client certificate is sent only over TLS: give --rdzv-tls-ca CA.pem too",
        )),
        (ca, cert, key) => Ok(ca.clone().map(|ca| (ca, cert.clone(), key.clone()))),
    }
}

/// A `https://` drun or c10d endpoint needs `--rdzv-tls-ca` (the scheme alone cannot say which CA
/// to trust), and an `http://` one contradicts it: both said at start, not at the join timeout.
fn scheme_agrees_with_tls(mode: &RendezvousMode, tls: bool) -> Result<(), ConfigError> {
    let eps: &[String] = match mode {
        RendezvousMode::Server { endpoints } => endpoints,
        RendezvousMode::C10d { endpoint, .. } => std::slice::from_ref(endpoint),
        _ => &[],
    };
    for e in eps {
        if e.starts_with("https://") && !tls {
            return Err(ConfigError::Missing {
                flag: "--rdzv-tls-ca",
                why: format!(
                    "{e} asks for TLS: give --rdzv-tls-ca with the CA of the server's certificate"
                ),
            });
        }
        if e.starts_with("http://") && tls {
            return Err(invalid(
                "--rdzv-endpoint",
                e.clone(),
                "http:// is plaintext but --rdzv-tls-ca asks for TLS: write HOST:PORT or https://HOST:PORT",
            ));
        }
    }
    Ok(())
}

/// `--rdzv-host-tls-cert`/`-key`: the TLS identity of a c10d host. Under c10d any node may host,
/// and its clients (itself included) reach it as `--rdzv-tls-ca` says, so the two come
/// together; other backends host nothing.
fn host_tls(a: &Args, mode: &RendezvousMode) -> Result<Option<ServerTlsFiles>, ConfigError> {
    let c10d = matches!(mode, RendezvousMode::C10d { .. });
    let h = &a.host_tls;
    match (&h.rdzv_host_tls_cert, &h.rdzv_host_tls_key) {
        (Some(cert), Some(key)) => {
            if !c10d {
                return Err(ConfigError::Conflict(
                    "--rdzv-host-tls-cert",
                    "a --rdzv-backend other than c10d (only a c10d agent hosts the rendezvous)",
                ));
            }
            let Some(ca) = &a.rdzv_tls_ca else {
                return Err(ConfigError::Missing {
                    flag: "--rdzv-tls-ca",
                    why: "a c10d host serving TLS is reached over TLS by every node, itself included: give every node --rdzv-tls-ca with the CA of --rdzv-host-tls-cert".into(),
                });
            };
            let files = ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                // With client certificates of their own the nodes require them of each other.
                client_ca: a.rdzv_tls_cert.as_ref().map(|_| ca.clone()),
            };
            Ok(Some(files))
        }
        _ if c10d && a.rdzv_tls_ca.is_some() => Err(ConfigError::Missing {
            flag: "--rdzv-host-tls-cert",
            why: "with --rdzv-backend c10d and --rdzv-tls-ca any node may host the rendezvous and must serve it over TLS: give every node --rdzv-host-tls-cert and --rdzv-host-tls-key for the --rdzv-endpoint host".into(),
        }),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, host, with_env};
    use super::*;

    fn c10d() -> RendezvousMode {
        RendezvousMode::C10d {
            endpoint: "h:29400".into(),
            is_host: None,
        }
    }

    fn server(ep: &str) -> RendezvousMode {
        RendezvousMode::Server {
            endpoints: vec![ep.into()],
        }
    }

    fn refused(v: &[&str], mode: &RendezvousMode, h: &Host) -> String {
        security(&args(v), h, mode, false)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn host_tls_is_for_a_c10d_rendezvous_with_a_ca() {
        let h = host();
        let flags = [
            "--rdzv-host-tls-cert",
            "c.pem",
            "--rdzv-host-tls-key",
            "k.pem",
            "t.py",
        ];
        let e = refused(&flags, &server("h:1"), &h);
        assert!(
            e.starts_with("--rdzv-host-tls-cert cannot be combined with"),
            "{e}"
        );
        let e = refused(&flags, &c10d(), &h);
        assert!(e.starts_with("--rdzv-tls-ca is missing"), "{e}");
        let e = refused(&["--rdzv-tls-ca", "ca.pem", "t.py"], &c10d(), &h);
        assert!(e.starts_with("--rdzv-host-tls-cert is missing"), "{e}");
    }

    #[test]
    fn the_endpoint_scheme_must_agree_with_the_ca() {
        let h = host();
        let e = refused(&["t.py"], &server("https://h:1"), &h);
        assert!(
            e.starts_with("--rdzv-tls-ca is missing: https://h:1 asks for TLS"),
            "{e}"
        );
        let e = refused(
            &["--rdzv-tls-ca", "ca.pem", "t.py"],
            &server("http://h:1"),
            &h,
        );
        assert!(e.starts_with("invalid --rdzv-endpoint 'http://h:1'"), "{e}");
    }

    #[test]
    fn a_client_certificate_needs_a_ca() {
        let e = refused(
            &["--rdzv-tls-cert", "c.pem", "t.py"],
            &server("h:1"),
            &host(),
        );
        assert!(
            e.starts_with("invalid --rdzv-tls-cert/--rdzv-tls-key 'c.pem'"),
            "{e}"
        );
        let e = refused(
            &["--rdzv-tls-key", "k.pem", "t.py"],
            &server("h:1"),
            &host(),
        );
        assert!(e.contains("give --rdzv-tls-ca CA.pem too"), "{e}");
    }

    #[test]
    fn an_unusable_token_variable_is_refused() {
        let h = with_env(&[(crate::rdzv::token::TOKEN_VAR, "two words\u{7}")]);
        let e = refused(&["t.py"], &server("h:1"), &h);
        assert!(e.contains("DRUN_RDZV_TOKEN holds an unusable token"), "{e}");
    }
}
