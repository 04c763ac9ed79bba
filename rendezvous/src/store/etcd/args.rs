//! The flags of a secured etcd (`--etcd-cacert`, `--etcd-cert`, `--etcd-key`, `--etcd-user`,
//! `--etcd-password-file`), flattened into the agent's `Args` and into
//! `drun-rendezvous serve` and `status`. Named like etcdctl's, with `etcd-` before them.

use std::path::PathBuf;

use super::access::EtcdAccessFiles;
use clap::Args;

/// The etcd client TLS and credential flags, raw.
#[derive(Debug, Clone, Default, Args)]
pub struct EtcdArgs {
    /// Reach etcd over TLS, trusting this PEM CA (etcdctl's --cacert). Endpoints are then
    /// `HOST:PORT` or `https://HOST:PORT`.
    #[arg(
        long = "etcd-cacert",
        env = "DRUN_ETCD_CACERT",
        value_name = "PATH",
        help_heading = "etcd access"
    )]
    pub etcd_cacert: Option<PathBuf>,

    /// Client certificate (PEM) for an etcd that checks them (`--client-cert-auth`); with
    /// --etcd-key and --etcd-cacert.
    #[arg(
        long = "etcd-cert",
        env = "DRUN_ETCD_CERT",
        value_name = "PATH",
        help_heading = "etcd access"
    )]
    pub etcd_cert: Option<PathBuf>,

    /// The PEM private key of --etcd-cert.
    #[arg(
        long = "etcd-key",
        env = "DRUN_ETCD_KEY",
        value_name = "PATH",
        help_heading = "etcd access"
    )]
    pub etcd_key: Option<PathBuf>,

    /// The etcd user (for an etcd with auth enabled); its password comes from
    /// --etcd-password-file or DRUN_ETCD_PASSWORD, never from the command line.
    #[arg(
        long = "etcd-user",
        env = "DRUN_ETCD_USER",
        value_name = "NAME",
        help_heading = "etcd access"
    )]
    pub etcd_user: Option<String>,

    /// File whose first line is the password of --etcd-user (else the environment variable
    /// DRUN_ETCD_PASSWORD; the file wins). Neither is passed on to workers.
    #[arg(
        long = "etcd-password-file",
        env = "DRUN_ETCD_PASSWORD_FILE",
        value_name = "PATH",
        help_heading = "etcd access"
    )]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdArgs {
    /// The flags as the library takes them.
    pub fn files(&self) -> EtcdAccessFiles {
        EtcdAccessFiles {
            cacert: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            user: self.etcd_user.clone(),
            password_file: self.etcd_password_file.clone(),
        }
    }
}
