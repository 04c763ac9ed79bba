//! The TLS identity of an agent that hosts its job's rendezvous (`--rdzv-backend c10d`),
//! flattened into [`super::Args`].

use std::path::PathBuf;

use clap::Args;

/// `--rdzv-host-tls-cert` and `--rdzv-host-tls-key`, raw.
#[derive(Debug, Clone, Default, Args)]
pub struct HostTlsArgs {
    /// With `--rdzv-backend c10d`: the agent that hosts the rendezvous serves it over TLS with
    /// this PEM certificate (chain), which must name the `--rdzv-endpoint` host. Any node may
    /// host, so give every node the same pair, and `--rdzv-tls-ca` to trust it; with
    /// `--rdzv-tls-cert` the host also requires client certificates signed by `--rdzv-tls-ca`
    /// (mutual TLS).
    #[arg(
        long = "rdzv-host-tls-cert",
        env = "DRUN_RDZV_HOST_TLS_CERT",
        value_name = "PATH",
        requires = "rdzv_host_tls_key",
        help_heading = "Rendezvous"
    )]
    pub rdzv_host_tls_cert: Option<PathBuf>,

    /// The PEM private key of `--rdzv-host-tls-cert`.
    #[arg(
        long = "rdzv-host-tls-key",
        env = "DRUN_RDZV_HOST_TLS_KEY",
        value_name = "PATH",
        requires = "rdzv_host_tls_cert",
        help_heading = "Rendezvous"
    )]
    pub rdzv_host_tls_key: Option<PathBuf>,
}
