//! The promises of the agent's parsers, as plain functions of their input: the Slurm hostlist,
//! `--rdzv-conf`, `--rdzv-endpoint` and the other flag values, the worker API's request lines and
//! the worker store's TCPStore queries. Each panics when a promise breaks and returns otherwise.
//!
//! Shared by the property tests (`props`, every `cargo test`) and the coverage-guided fuzz
//! targets under `fuzz/` (`cargo +nightly fuzz run TARGET`, built with `--cfg fuzzing`).

use crate::ckpt::api::ApiRequest;
use crate::config::parse::{parse_nnodes, parse_signals};
use crate::config::timing::parse_rdzv_conf;
use crate::slurm::{parse_hostlist, MAX_HOSTS};
use crate::worker_store::codec::decode;

/// The port `--rdzv-endpoint` entries without one get.
pub const DEFAULT_PORT: u16 = 29_400;

/// A hostlist: names without brackets or commas, at most [`MAX_HOSTS`] of them.
pub fn hostlist(s: &str) {
    if let Ok(hosts) = parse_hostlist(s) {
        assert!(!hosts.is_empty() && hosts.len() <= MAX_HOSTS, "{s:?}");
        for h in &hosts {
            assert!(!h.is_empty(), "{s:?} gave an empty name");
            assert!(!h.contains([',', '[', ']']), "{s:?} gave {h:?}");
        }
    }
}

/// `--rdzv-conf`: trimmed keys without `,` or `=`, values without `,`.
pub fn rdzv_conf(s: &str) {
    if let Ok(conf) = parse_rdzv_conf(s) {
        for (k, v) in &conf {
            assert_eq!(k.trim(), k);
            assert!(
                !k.contains([',', '=']) && !v.contains(','),
                "{s:?}: {k:?}={v:?}"
            );
        }
    }
}

/// `--rdzv-endpoint`: each entry has a host and a port 1–65535, and the resolver's own split
/// (`dns::split`) reads the same port from it.
pub fn endpoint(s: &str) {
    if let Ok(list) = crate::rdzv::endpoints(s, DEFAULT_PORT) {
        assert!(!list.is_empty());
        for e in &list {
            let (host, port) = e.rsplit_once(':').expect("a port");
            let port: u16 = port.parse().expect("a checked port");
            assert!(port > 0 && !host.is_empty(), "{s:?} gave {e:?}");
            assert_eq!(crate::dns::split(e).map(|(_, p)| p), Ok(port), "{e:?}");
        }
    }
    let _ = crate::dns::split(s);
    let _ = drun_rendezvous::endpoint_url(s);
}

/// The other flag values a user types.
pub fn flags(s: &str) {
    if let Ok((min, max)) = parse_nnodes(s) {
        assert!(0 < min && min <= max, "{s:?}");
    }
    let _ = parse_signals(s);
    let _ = crate::status::parse_interval(s);
    let _ = drun_rendezvous::decisions::ckpt_interval::IntervalMode::parse(s);
}

/// Every text target on `s`.
pub fn text(s: &str) {
    hostlist(s);
    rdzv_conf(s);
    endpoint(s);
    flags(s);
}

/// A request line: a request or a serde error, never a panic.
pub fn api_line(bytes: &[u8]) {
    let _ = serde_json::from_slice::<ApiRequest>(bytes);
}

/// A TCPStore byte stream as the server reads it: query after query until the bytes run out or
/// one is malformed. A decoded query used at most the bytes given and decodes the same from
/// exactly those bytes.
pub fn store_stream(mut bytes: &[u8]) {
    while let Ok(Some((q, used))) = decode(bytes) {
        assert!(0 < used && used <= bytes.len());
        assert_eq!(decode(&bytes[..used]), Ok(Some((q, used))));
        bytes = &bytes[used..];
    }
}
