//! `drun --status`: where the agent's own rendezvous flags say a run's state is read. Asking
//! and printing is the rendezvous crate's status client ([`drun_rendezvous::status::client`]),
//! shared with `drun-rendezvous status` and re-exported here.

pub use drun_rendezvous::status::client::{
    fetch, parse_interval, show, Source, StatusError, StatusQuery, DEFAULT_WATCH,
};

use crate::RendezvousMode;

/// Where an agent of `mode` finds its rendezvous.
///
/// # Errors
/// [`StatusError::NoRendezvous`] for the embedded (`--standalone`, one node) and static
/// modes.
pub fn source(mode: &RendezvousMode) -> Result<Source, StatusError> {
    match mode {
        RendezvousMode::Server { endpoints } => Ok(Source::Server(endpoints.clone())),
        RendezvousMode::C10d { endpoint, .. } => Ok(Source::Server(vec![endpoint.clone()])),
        RendezvousMode::Etcd { endpoints } => Ok(Source::Etcd(endpoints.clone())),
        RendezvousMode::Embedded { .. } | RendezvousMode::Static { .. } => {
            Err(StatusError::NoRendezvous)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_and_static_runs_have_nothing_to_ask() {
        let embedded = RendezvousMode::Embedded {
            master_addr: "127.0.0.1".into(),
            fixed_port: None,
        };
        let err = source(&embedded).unwrap_err();
        assert_eq!(err.code(), 2);
        assert!(err.to_string().contains("--rdzv-endpoint"), "{err}");
        let c10d = RendezvousMode::C10d {
            endpoint: "h:1".into(),
            is_host: None,
        };
        assert_eq!(source(&c10d).unwrap(), Source::Server(vec!["h:1".into()]));
    }
}
