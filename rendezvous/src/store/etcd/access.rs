//! How drun reaches a secured etcd: client TLS (a CA to trust, optionally a client certificate
//! for mTLS) and a user with a password, named like etcdctl's flags (`--etcd-cacert`,
//! `--etcd-cert`, `--etcd-key`, `--etcd-user`). The password comes from a file
//! (`--etcd-password-file`) or the [`PASSWORD_VAR`] environment variable, never from a flag's
//! value; it is held in a [`Secret`] and never printed. [`refusal`] turns etcd's and rustls'
//! messages into one line that names the fix.

use std::path::{Path, PathBuf};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::server::auth::Secret;

/// The environment variable that may hold the etcd password itself.
pub const PASSWORD_VAR: &str = "DRUN_ETCD_PASSWORD";

/// The flags of a secured etcd, as given (nothing read yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdAccessFiles {
    /// `--etcd-cacert`: trust etcd's certificate when signed by this PEM CA; turns TLS on.
    pub cacert: Option<PathBuf>,
    /// `--etcd-cert`: a PEM client certificate, for an etcd with `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    /// `--etcd-key`: the PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// `--etcd-user`: the etcd user drun authenticates as.
    pub user: Option<String>,
    /// `--etcd-password-file`: its password on the first line.
    pub password_file: Option<PathBuf>,
}

/// What a client needs to reach a secured etcd; [`EtcdAccess::default`] is plaintext, no user.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    tls: Option<TlsOptions>,
    mtls: bool,
    user: Option<(String, Secret)>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls.is_some())
            .field("mtls", &self.mtls)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// Incomplete etcd access flags, or a file of theirs that cannot be used: one line naming the
/// flag, never the password.
#[derive(Debug, thiserror::Error)]
pub enum EtcdAccessError {
    /// A file that cannot be read.
    #[error("cannot read the {what} {} ({flag}): {source}", path.display())]
    Read {
        /// What the file should hold ("client key").
        what: &'static str,
        /// The flag that named it.
        flag: &'static str,
        /// Its path, as given.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// `--etcd-password-file` is not UTF-8.
    #[error("the password file {} is not UTF-8", .0.display())]
    PasswordNotUtf8(PathBuf),
    /// `--etcd-password-file` holds no line.
    #[error("the password file {} is empty; write the password on its first line", .0.display())]
    PasswordEmpty(PathBuf),
    /// Only one of `--etcd-cert` and `--etcd-key`.
    #[error("--etcd-cert and --etcd-key go together: give both")]
    HalfIdentity,
    /// `--etcd-cert` without `--etcd-cacert`.
    #[error("--etcd-cert needs --etcd-cacert (the CA that signed etcd's certificate)")]
    CertWithoutCa,
    /// `--etcd-user NAME:PASSWORD`.
    #[error("--etcd-user takes the user name only; put the password in --etcd-password-file or DRUN_ETCD_PASSWORD")]
    PasswordInUser,
    /// `--etcd-user` without a password.
    #[error("--etcd-user {0} needs a password: --etcd-password-file PATH or {PASSWORD_VAR}")]
    NoPassword(String),
    /// `--etcd-password-file` without `--etcd-user`.
    #[error("--etcd-password-file needs --etcd-user NAME")]
    NoUser,
    /// An `https://` endpoint without TLS.
    #[error("etcd endpoint {0} is https: give --etcd-cacert CA.pem (the CA that signed etcd's certificate)")]
    HttpsWithoutCa(String),
    /// A plaintext endpoint with TLS on.
    #[error("etcd endpoint {0} is not https but --etcd-cacert is given; write it HOST:PORT or https://HOST:PORT")]
    NotHttps(String),
}

fn read(what: &'static str, flag: &'static str, p: &Path) -> Result<Vec<u8>, EtcdAccessError> {
    std::fs::read(p).map_err(|source| EtcdAccessError::Read {
        what,
        flag,
        path: p.to_path_buf(),
        source,
    })
}

/// The password: the first non-blank line of `file`, else `env` when non-empty.
fn password(file: Option<&Path>, env: Option<&str>) -> Result<Option<Secret>, EtcdAccessError> {
    let Some(f) = file else {
        return Ok(env.filter(|p| !p.trim().is_empty()).map(Secret::new));
    };
    let text = String::from_utf8(read("password file", "--etcd-password-file", f)?)
        .map_err(|_| EtcdAccessError::PasswordNotUtf8(f.to_path_buf()))?;
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    line.map(|l| Some(Secret::new(l)))
        .ok_or_else(|| EtcdAccessError::PasswordEmpty(f.to_path_buf()))
}

impl EtcdAccessFiles {
    /// Whether any flag is given (else etcd is reached in plaintext, without a user).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Reads the files; `password_env` is the value of [`PASSWORD_VAR`], used when no
    /// `--etcd-password-file` is given (the file wins).
    ///
    /// # Errors
    /// One line naming the flag: a file that cannot be read, `--etcd-cert` without `--etcd-key`
    /// (or the reverse) or without `--etcd-cacert`, a user without a password or a password
    /// without a user, a user written `NAME:PASSWORD`. Never the password.
    pub fn load(&self, password_env: Option<&str>) -> Result<EtcdAccess, EtcdAccessError> {
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some(Identity::from_pem(
                read("client certificate", "--etcd-cert", c)?,
                read("client key", "--etcd-key", k)?,
            )),
            (None, None) => None,
            _ => return Err(EtcdAccessError::HalfIdentity),
        };
        let tls = match &self.cacert {
            Some(ca) => {
                let ca = read("CA certificate", "--etcd-cacert", ca)?;
                let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
                if let Some(id) = identity.clone() {
                    t = t.identity(id);
                }
                Some(t)
            }
            None if identity.is_some() => return Err(EtcdAccessError::CertWithoutCa),
            None => None,
        };
        let pass = password(self.password_file.as_deref(), password_env)?;
        let user = match (&self.user, pass) {
            (Some(u), _) if u.contains(':') => return Err(EtcdAccessError::PasswordInUser),
            (Some(u), Some(p)) => Some((u.clone(), p)),
            (Some(u), None) => return Err(EtcdAccessError::NoPassword(u.clone())),
            (None, Some(_)) if self.password_file.is_some() => return Err(EtcdAccessError::NoUser),
            // DRUN_ETCD_PASSWORD alone (e.g. exported for another tool) is ignored.
            (None, _) => None,
        };
        Ok(EtcdAccess {
            tls,
            mtls: identity.is_some(),
            user,
        })
    }
}

impl EtcdAccess {
    /// Whether etcd is reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The etcd user, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(u, _)| u.as_str())
    }

    /// `base` with this TLS and user.
    pub fn options(&self, mut base: ConnectOptions) -> ConnectOptions {
        if let Some(t) = &self.tls {
            base = base.with_tls(t.clone());
        }
        if let Some((u, p)) = &self.user {
            base = base.with_user(u.clone(), p.expose().to_string());
        }
        base
    }

    /// The URL of endpoint `ep` (`host:port`, or with a scheme).
    ///
    /// # Errors
    /// An `http://` endpoint with TLS on, or an `https://` one without: one line.
    pub fn url(&self, ep: &str) -> Result<String, EtcdAccessError> {
        match (ep.split_once("://").map(|(s, _)| s), self.is_tls()) {
            (None, true) => Ok(format!("https://{ep}")),
            (None, false) => Ok(format!("http://{ep}")),
            (Some("https"), true) | (Some("http"), false) => Ok(ep.to_string()),
            (Some("https"), false) => Err(EtcdAccessError::HttpsWithoutCa(ep.to_string())),
            _ => Err(EtcdAccessError::NotHttps(ep.to_string())),
        }
    }
}

/// `e` and its sources, `: `-separated (TLS failures hide in the sources of a transport error).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        src = s.source();
    }
    out
}

/// What a failed connection to etcd means for this client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Diagnosis {
    /// etcd refused this client (credentials, permissions, certificates): retrying cannot help.
    Refused(String),
    /// Probably a TLS mismatch, but a connection closed early can also be etcd restarting.
    Hint(String),
}

/// The one-line reason and fix when `error` (etcd's or the TLS stack's message, whole chain)
/// is etcd refusing this client or a likely TLS mismatch; `None` for anything else (etcd down,
/// a timeout). Never includes the password.
pub fn diagnose(error: &str, access: &EtcdAccess) -> Option<Diagnosis> {
    use Diagnosis::{Hint, Refused};
    let e = error.to_ascii_lowercase();
    let user = access.user().unwrap_or("(none)");
    let closed = e.contains("connection reset")
        || e.contains("broken pipe")
        || e.contains("connection closed")
        || e.contains("unexpected end of file")
        || e.contains("h2 protocol error");
    if e.contains("authentication failed") || e.contains("invalid user id or password") {
        Some(Refused(format!(
            "etcd refused the credentials for user {user}: check --etcd-user and the password in --etcd-password-file or {PASSWORD_VAR}"
        )))
    } else if e.contains("user name is empty") || e.contains("invalid auth token") {
        Some(Refused(format!(
            "etcd requires a user (its auth is enabled): give --etcd-user NAME and --etcd-password-file PATH or {PASSWORD_VAR}"
        )))
    } else if e.contains("permission denied") && access.user().is_none() {
        Some(Refused(format!(
            "etcd denied drun's requests (its auth is enabled; with client certificates it takes the certificate's common name as the user): give --etcd-user NAME and --etcd-password-file PATH or {PASSWORD_VAR}, for a user whose role has readwrite on the prefix /drun/"
        )))
    } else if e.contains("permission denied") {
        Some(Refused(format!(
            "etcd user {user} may not read and write drun's keys: grant it a role with readwrite on the prefix /drun/"
        )))
    } else if access.is_tls() && (e.contains("unknownissuer") || e.contains("certificate")) {
        Some(Refused("etcd's certificate is not signed by --etcd-cacert (wrong CA?), or does not name the endpoint's host, or etcd wants a client certificate (--etcd-cert/--etcd-key)".into()))
    } else if access.is_tls() && (e.contains("invalidcontenttype") || e.contains("corrupt message"))
    {
        Some(Refused(
            "etcd does not speak TLS there: drop --etcd-cacert or use etcd's https client URL"
                .into(),
        ))
    } else if access.is_tls() && !access.mtls && closed {
        Some(Hint("etcd closed the TLS connection; it may require a client certificate (--etcd-cert/--etcd-key)".into()))
    } else if !access.is_tls() && closed {
        Some(Hint("etcd may require TLS there; give --etcd-cacert CA.pem (and --etcd-cert/--etcd-key if it checks client certificates)".into()))
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
