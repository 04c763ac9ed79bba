//! `drun-rendezvous status`: its flags turned into a [`StatusQuery`] for the status client
//! ([`crate::status::client`]), which asks and prints.

use super::args::StatusArgs;
use super::ServerError;
use crate::client::token::{self as client_token, TOKEN_VAR};
use crate::server::tls::ClientTls;
use crate::status::client::{show, Source, StatusQuery};

/// Prints the state of `args.run` once, or every `--watch` interval until Ctrl-C.
///
/// # Errors
/// Bad flags or files ([`ServerError::code`] 2); what the status client says otherwise
/// ([`ServerError::Status`]).
pub async fn status(args: StatusArgs) -> Result<(), ServerError> {
    let etcd = super::args::etcd_access(&args.etcd)?;
    let tls = args
        .rdzv_tls_ca
        .map(|ca| {
            ClientTls::from_files(
                &ca,
                args.rdzv_tls_cert.as_deref(),
                args.rdzv_tls_key.as_deref(),
            )
        })
        .transpose()
        .map_err(ServerError::Tls)?;
    let token = client_token::resolve(
        args.rdzv_token_file.as_deref(),
        std::env::var(TOKEN_VAR).ok().as_deref(),
    )
    .map_err(ServerError::Token)?;
    let source = if args.endpoint.is_empty() {
        Source::Etcd(args.etcd_endpoints)
    } else {
        Source::Server(args.endpoint)
    };
    let query = StatusQuery {
        run: args.run,
        source,
        json: args.json,
        watch: args.watch,
        token,
        tls,
        etcd,
    };
    Ok(show(&query).await?)
}
