//! Asking a run's rendezvous for its state and printing it: `drun-rendezvous status` and
//! `drun --status` (the human view of [`crate::status::view`], or `--json`), once or every
//! `--watch` interval until Ctrl-C.
//!
//! Where the state comes from ([`Source`]): a `drun-rendezvous` server, or the agent hosting a
//! c10d/embedded rendezvous, answers the `Status` RPC; etcd is read directly. A `--standalone`
//! or static run has no rendezvous another process could ask (the agent picks its source from
//! its own flags).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use drun_proto::v1::rendezvous_client::RendezvousClient;
use drun_proto::v1::StatusRequest;

use crate::client::foreign::{self, Answer as Heard};
use crate::error::{error_chain, status_chain};
use crate::status::view;
use crate::status::{read_status, RunStatus};
use crate::{EtcdStore, ServiceError, Store};

/// The default `--watch` interval.
pub const DEFAULT_WATCH: Duration = Duration::from_secs(2);

/// Where a run's state is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// etcd v3 client endpoints (`HOST:PORT`), read directly.
    Etcd(Vec<String>),
    /// `drun-rendezvous` replicas or a c10d/embedded host (`HOST:PORT`), asked in turn.
    Server(Vec<String>),
}

/// What `status` prints, and how often.
#[derive(Debug, Clone)]
pub struct StatusQuery {
    /// The run id.
    pub run: String,
    /// Where to read it.
    pub source: Source,
    /// One JSON document instead of the human view.
    pub json: bool,
    /// Refresh every this long until Ctrl-C (`None`: print once).
    pub watch: Option<Duration>,
    /// The token sent to a server (`--rdzv-token-file`, `DRUN_RDZV_TOKEN`).
    pub token: Option<crate::server::auth::Secret>,
    /// TLS to a server (`--rdzv-tls-ca`, ...).
    pub tls: Option<crate::server::tls::ClientTls>,
    /// TLS and user to etcd (`--etcd-cacert`, `--etcd-user`, ...).
    pub etcd: crate::store::etcd::access::EtcdAccess,
}

/// Why `status` printed nothing useful. [`StatusError::code`] is the exit code.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A `--standalone` or static run: nothing to ask (said by the agent, which picks the
    /// source from its flags).
    #[error("this run has no rendezvous to ask: --standalone and static runs keep their state inside the agent; give the job's --rdzv-backend, --rdzv-endpoint and --rdzv-id")]
    NoRendezvous,
    /// No run id given.
    #[error("--rdzv-id is missing: give the run id the job was started with")]
    NoRunId,
    /// The server or etcd did not answer.
    #[error("cannot reach {what} at {endpoints}: {detail}; is it running, and is that the job's --rdzv-endpoint?")]
    Unreachable {
        /// "the rendezvous server" or "etcd".
        what: &'static str,
        /// The endpoints tried.
        endpoints: String,
        /// The last error.
        detail: String,
    },
    /// The server refused the request (no token, or one not accepted for this run).
    #[error("the rendezvous server at {endpoint} refused: {detail}")]
    Refused {
        /// The endpoint that refused.
        endpoint: String,
        /// Its one-line reason.
        detail: String,
    },
    /// The server answered, but could not read the run (its store is unreachable, ...).
    #[error("the rendezvous server at {endpoint} answered but cannot read the run: {detail}")]
    ServerFailed {
        /// The endpoint that answered.
        endpoint: String,
        /// Its one-line reason.
        detail: String,
    },
    /// The store knows nothing of the run.
    #[error("no run named '{0}' in this store (nothing waiting, formed or finished); check the run id (--rdzv-id) and the endpoint")]
    UnknownRun(String),
    /// The answer did not decode (a newer or foreign server).
    #[error("the status answer does not decode: {0}")]
    Decode(String),
}

impl StatusError {
    /// The exit code: 2 for usage (nothing to ask, no run id), 3 for the rendezvous (unreachable,
    /// unknown run, undecodable answer), as the agent's codes
    /// (`docs/reference/exit-codes.md`).
    pub fn code(&self) -> u8 {
        match self {
            StatusError::NoRendezvous | StatusError::NoRunId => 2,
            _ => 3,
        }
    }
}

/// A `--watch` interval: seconds (`2`, `0.5`) or with a unit (`500ms`, `2s`, `1m`); > 0.
///
/// ```
/// use std::time::Duration;
/// use drun_rendezvous::status::client::parse_interval;
/// assert_eq!(parse_interval("2").unwrap(), Duration::from_secs(2));
/// assert_eq!(parse_interval("500ms").unwrap(), Duration::from_millis(500));
/// assert!(parse_interval("0").is_err());
/// ```
pub fn parse_interval(s: &str) -> Result<Duration, IntervalError> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v * scale >= 0.05 && v * scale <= 86_400.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(IntervalError(s.to_string())),
    }
}

/// A `--watch` value that is not an interval of 50 ms to 1 day ([`parse_interval`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not an interval of 50 ms to 1 day: give seconds (2, 0.5) or 500ms, 2s, 1m")]
pub struct IntervalError(pub String);

/// The run's state from `query`'s source: the document as served (a superset of [`RunStatus`] when a
/// newer server answers) and its decoded form.
///
/// # Errors
/// [`StatusError::Unreachable`] when no endpoint answers, [`StatusError::Refused`] when one
/// refuses the token, [`StatusError::Decode`].
pub async fn fetch(query: &StatusQuery) -> Result<(serde_json::Value, RunStatus), StatusError> {
    let run = query.run.as_str();
    let json = match &query.source {
        Source::Etcd(endpoints) => {
            let unreachable = |e: &dyn std::fmt::Display| StatusError::Unreachable {
                what: "etcd",
                endpoints: endpoints.join(","),
                detail: e.to_string(),
            };
            let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(
                EtcdStore::connect_with(endpoints, &query.etcd)
                    .await
                    .map_err(|e| unreachable(&e))?,
            );
            let status = read_status(&store, run)
                .await
                .map_err(|e| unreachable(&e))?;
            serde_json::to_value(status).expect("a run status serializes")
        }
        Source::Server(endpoints) => {
            ask_servers(endpoints, run, query.token.as_ref(), query.tls.as_ref()).await?
        }
    };
    let status =
        serde_json::from_value(json.clone()).map_err(|e| StatusError::Decode(e.to_string()))?;
    Ok((json, status))
}

/// How one endpoint's `Status` call ended, short of an answer.
enum Answer {
    /// No connection, no server behind it, or an undecodable reply: try the next endpoint.
    NotReached,
    /// The server refused the token.
    Refused,
    /// The server answered with its own error (its store is unreachable, ...).
    Failed,
}

/// The `Status` RPC of the first of `endpoints` that answers.
async fn ask_servers(
    endpoints: &[String],
    run: &str,
    token: Option<&crate::server::auth::Secret>,
    tls: Option<&crate::server::tls::ClientTls>,
) -> Result<serde_json::Value, StatusError> {
    let mut last = String::from("no endpoint given");
    // A replica that answered with its own error; another may still answer.
    let mut failed = None;
    for ep in endpoints {
        let answer = async {
            let channel = crate::server::tls::endpoint(ep, tls, None)
                .map_err(|e| (Answer::NotReached, e.to_string()))?
                .connect()
                .await
                .map_err(|e| {
                    let mut why = error_chain(&e);
                    if let Some(h) =
                        crate::server::tls::hint(&why, crate::server::tls::Mode::of(tls))
                    {
                        why = format!("{why}; {h}");
                    }
                    (Answer::NotReached, why)
                })?;
            let mut client = RendezvousClient::new(channel);
            let mut request = tonic::Request::new(StatusRequest {
                run_id: run.to_string(),
            });
            crate::server::auth::attach(&mut request, token);
            let resp = client.status(request).await.map_err(|s| {
                let e = ServiceError::from_status(&s);
                let mut why = if e.is_refusal() {
                    e.to_string()
                } else {
                    status_chain(&s)
                };
                // A plaintext client of a TLS server fails here, at the first request.
                if let Some(h) = crate::server::tls::hint(&why, crate::server::tls::Mode::of(tls)) {
                    why = format!("{why}; {h}");
                }
                let kind = match &e {
                    ServiceError::Unauthenticated(_) => Answer::Refused,
                    _ if ServiceError::answered_by_server(&s) => Answer::Failed,
                    _ => Answer::NotReached,
                };
                (kind, why)
            })?;
            serde_json::from_str(&resp.into_inner().json)
                .map_err(|e| (Answer::NotReached, e.to_string()))
        };
        match tokio::time::timeout(Duration::from_secs(10), answer).await {
            Ok(Ok(json)) => return Ok(json),
            Ok(Err((Answer::Refused, detail))) => {
                return Err(StatusError::Refused {
                    endpoint: ep.clone(),
                    detail,
                })
            }
            Ok(Err((Answer::Failed, detail))) => {
                failed = Some(StatusError::ServerFailed {
                    endpoint: ep.clone(),
                    detail,
                })
            }
            Ok(Err((Answer::NotReached, e))) => last = with_listener(ep, tls, e).await,
            Err(_) => last = "no answer within 10 s".into(),
        }
    }
    Err(failed.unwrap_or(StatusError::Unreachable {
        what: "the rendezvous server",
        endpoints: endpoints.join(","),
        detail: last,
    }))
}

/// `why` a plaintext `Status` to `ep` failed, told more precisely by what listens there
/// ([`foreign`]): another program holding the port replaces it, a silent listener is named.
async fn with_listener(
    ep: &str,
    tls: Option<&crate::server::tls::ClientTls>,
    why: String,
) -> String {
    if tls.is_some() {
        return why;
    }
    let Ok(addr) = crate::client::dns::resolve(ep).await else {
        return why;
    };
    match foreign::probe(&addr.to_string()).await {
        Some(answer @ (Heard::Other(_) | Heard::Silent)) => match foreign::verdict(&answer, ep) {
            Err(line) => line.to_string(),
            Ok(Some(reason)) => format!("{why}; {reason}"),
            Ok(None) => why,
        },
        // A TLS server: the hint on `why` says so already; HTTP/2 or nothing: no news.
        _ => why,
    }
}

/// Prints the run's state once, or every `query.watch` until Ctrl-C (then `Ok`).
///
/// # Errors
/// Printing once: every [`StatusError`], including [`StatusError::UnknownRun`]. Watching, a
/// failed refresh is shown in place of the view and the next one tried.
pub async fn show(query: &StatusQuery) -> Result<(), StatusError> {
    if query.run.is_empty() || query.run == "none" {
        return Err(StatusError::NoRunId);
    }
    let Some(every) = query.watch else {
        let (json, status) = fetch(query).await?;
        if status.is_unknown() {
            return Err(StatusError::UnknownRun(query.run.clone()));
        }
        let text = if query.json {
            serde_json::to_string_pretty(&json).expect("json")
        } else {
            view(&status).join("\n")
        };
        print(&text, false);
        return Ok(());
    };
    let clear = !query.json && std::io::stdout().is_terminal();
    loop {
        let text = match fetch(query).await {
            Ok((json, _)) if query.json => json.to_string(),
            Ok((_, s)) if s.is_unknown() => StatusError::UnknownRun(query.run.clone()).to_string(),
            Ok((_, s)) => view(&s).join("\n") + if clear { "" } else { "\n" },
            Err(e) if query.json => {
                serde_json::json!({ "run": query.run, "error": e.to_string() }).to_string()
            }
            Err(e) => e.to_string(),
        };
        print(&text, clear);
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

fn view(status: &RunStatus) -> Vec<String> {
    view::render(status, crate::clock::now_ms())
}

/// Writes `text` and a newline to stdout (after clearing the screen if `clear`); a closed
/// pipe (`| head`) is not an error worth a panic.
fn print(text: &str, clear: bool) {
    let mut out = std::io::stdout().lock();
    if clear {
        let _ = write!(out, "\x1b[H\x1b[2J");
    }
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_take_seconds_or_a_unit() {
        assert_eq!(parse_interval("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_interval("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_interval("1m").unwrap(), Duration::from_secs(60));
        for bad in ["", "x", "-1", "0.01", "inf", "2h"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exit_codes_split_usage_from_rendezvous_errors() {
        assert_eq!(StatusError::NoRunId.code(), 2);
        assert_eq!(StatusError::UnknownRun("r".into()).code(), 3);
    }
}
