//! The command line of `drun-rendezvous` below its global flags: the `serve` and `status`
//! subcommands, as clap parses them and as tests build them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::ServerError;
use crate::store::etcd::access::{EtcdAccess, PASSWORD_VAR};
use crate::store::etcd::args::EtcdArgs;

/// A subcommand of `drun-rendezvous`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the drun.v1 rendezvous protocol until SIGTERM/SIGINT.
    Serve(ServeConfig),
    /// Print a run's state: members, generation, ranks, each node's state, standbys, restarts by
    /// cause, the last formation and its duration, the latest checkpoint and the work the last
    /// re-form lost. Read from etcd (--etcd-endpoints) or asked of a running server
    /// (--endpoint). Exit 2: bad flags; 3: store or server unreachable or refusing these
    /// credentials, or no such run.
    Status(StatusArgs),
}

/// Where a server keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// State in this process only (single server, no HA).
    Memory,
    /// State in etcd v3; run several replicas against the same etcd for HA.
    Etcd,
}

/// The flags of `drun-rendezvous serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address to listen on (`HOST:PORT`; port 0 picks a free one, printed at start).
    #[arg(long, env = "DRUN_RDZV_LISTEN", default_value = "0.0.0.0:29400")]
    pub listen: String,
    /// Where the state lives.
    #[arg(long, value_enum, default_value = "memory")]
    pub store: StoreKind,
    /// etcd client endpoints, comma-separated (with --store etcd).
    #[arg(
        long = "etcd-endpoints",
        env = "DRUN_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    pub etcd_endpoints: Vec<String>,
    /// Serve Prometheus metrics at `http://HOST:PORT/metrics` (OpenMetrics text per run:
    /// sessions, waiting agents (standbys), generation, members and world size, re-forms by
    /// cause; lease keep-alive failures, etcd request errors). Port 0 picks a free one, printed at start.
    /// Off by default.
    #[arg(long, env = "DRUN_RDZV_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Accept only agents sending a token listed in PATH (repeatable): one `TOKEN` (any run)
    /// or `RUN_ID TOKEN` (that run only) per line, `#` comments. Looked at again at most
    /// once a second and read again when changed, so tokens rotate without a restart. Without it the control plane is open.
    #[arg(long = "token-file", value_name = "PATH")]
    pub token_files: Vec<PathBuf>,
    /// Serve over TLS with this PEM certificate (chain); needs --tls-key.
    #[arg(long = "tls-cert", value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long = "tls-key", value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this PEM CA (mutual TLS); needs --tls-cert.
    #[arg(long = "tls-client-ca", value_name = "PATH", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// TLS and credentials to etcd (with --store etcd).
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Serve at most N runs at once (a run counts while any of its agents holds a
    /// session); an agent of a new run past it is refused with RESOURCE_EXHAUSTED.
    #[arg(long = "max-runs", env = "DRUN_RDZV_MAX_RUNS", value_name = "N", default_value_t = crate::server::run_limit::DEFAULT_MAX_RUNS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_runs: usize,
}

/// The flags of `drun-rendezvous status`: one source, etcd or servers.
#[derive(Debug, Clone, Args)]
#[command(group(
    clap::ArgGroup::new("source")
        .required(true)
        .args(["etcd_endpoints", "endpoint"])
))]
pub struct StatusArgs {
    /// The run id (the agents' --rdzv-id).
    pub run: String,
    /// etcd client endpoints, comma-separated `HOST:PORT`, read directly.
    #[arg(
        long = "etcd-endpoints",
        env = "DRUN_ETCD_ENDPOINTS",
        value_delimiter = ','
    )]
    pub etcd_endpoints: Vec<String>,
    /// Ask a running drun-rendezvous server (or the agent hosting a c10d/embedded
    /// rendezvous) instead, `HOST:PORT`; comma-separated replicas are tried in turn. The
    /// only way to read a server with `--store memory`.
    #[arg(long, conflicts_with = "etcd_endpoints", value_delimiter = ',')]
    pub endpoint: Vec<String>,
    /// Print one JSON document (a stable superset of the fields the human view shows)
    /// instead of the human view; with --watch, one compact document per line per refresh.
    #[arg(long)]
    pub json: bool,
    /// File whose first line is the token sent to --endpoint (else DRUN_RDZV_TOKEN).
    #[arg(
        long = "rdzv-token-file",
        env = "DRUN_RDZV_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub rdzv_token_file: Option<PathBuf>,
    /// Reach --endpoint over TLS, trusting this PEM CA.
    #[arg(long = "rdzv-tls-ca", value_name = "PATH")]
    pub rdzv_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a server requiring mutual TLS; needs --rdzv-tls-key.
    #[arg(long = "rdzv-tls-cert", value_name = "PATH", requires = "rdzv_tls_key")]
    pub rdzv_tls_cert: Option<PathBuf>,
    /// The PEM private key of --rdzv-tls-cert.
    #[arg(long = "rdzv-tls-key", value_name = "PATH", requires = "rdzv_tls_cert")]
    pub rdzv_tls_key: Option<PathBuf>,
    /// TLS and credentials to etcd (with --etcd-endpoints).
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Redraw every INTERVAL until Ctrl-C: seconds (`5`, `0.5`) or `500ms`/`2s`/`1m`,
    /// from 50 ms to 1 day; `--watch` alone: 2 s.
    #[arg(
        long,
        value_name = "INTERVAL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "2",
        value_parser = crate::status::client::parse_interval
    )]
    pub watch: Option<Duration>,
}

/// The etcd access of `args`, the password read from its file or `DRUN_ETCD_PASSWORD`.
pub(super) fn etcd_access(args: &EtcdArgs) -> Result<EtcdAccess, ServerError> {
    let env = std::env::var(PASSWORD_VAR).ok();
    args.files()
        .load(env.as_deref())
        .map_err(ServerError::EtcdAccess)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The subcommands under a bare parser, as the binary mounts them.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[test]
    fn serve_defaults_and_status_needs_one_source() {
        let Command::Serve(c) = Cli::try_parse_from(["d", "serve"]).unwrap().command else {
            panic!("serve parses as Serve");
        };
        assert_eq!(c.store, StoreKind::Memory);
        assert_eq!(c.max_runs, crate::server::run_limit::DEFAULT_MAX_RUNS);
        assert!(Cli::try_parse_from(["d", "status", "r"]).is_err());
        let both = [
            "d",
            "status",
            "r",
            "--endpoint",
            "a:1",
            "--etcd-endpoints",
            "b:1",
        ];
        assert!(Cli::try_parse_from(both).is_err());
        let Command::Status(s) =
            Cli::try_parse_from(["d", "status", "r", "--endpoint", "a:1,b:2", "--watch"])
                .unwrap()
                .command
        else {
            panic!("status parses as Status");
        };
        assert_eq!(s.endpoint, ["a:1", "b:2"]);
        assert_eq!(s.watch, Some(crate::status::client::DEFAULT_WATCH));
    }
}
