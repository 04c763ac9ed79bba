//! What listens on a rendezvous endpoint that fails the gRPC handshake ([`probe`], [`verdict`]).
//!
//! A plaintext gRPC client that meets something other than a drun server sees only "h2 protocol
//! error" or "connection closed", the same as when the server wants TLS. So after such a failure
//! the link opens one plain TCP connection, sends the HTTP/2 client preface (RFC 9113 §3.4) and
//! reads the first bytes back: an HTTP/2 server answers with a SETTINGS frame, a TLS server with
//! an alert record (RFC 8446 §5.1, content type 21), and anything else — an HTTP/1 server, a
//! torch TCPStore left on the port, a database — with other bytes or nothing. A port held by
//! another program cannot become a rendezvous by waiting (the would-be c10d host could not bind
//! it either), so that ends the wait at once with the fix; a silent listener may be a stopped
//! server and is only named.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the probe waits to connect and for the first bytes back.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);

/// The HTTP/2 client connection preface followed by an empty SETTINGS frame (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// How a listener answered the HTTP/2 preface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A SETTINGS frame: an HTTP/2 server (a drun server, etcd, a proxy).
    Http2,
    /// A TLS record: the server wants TLS.
    Tls,
    /// Other bytes, shown as text (at most 60 characters, first line, control bytes escaped).
    Other(String),
    /// Nothing within [`PROBE_WAIT`], or the connection closed without a byte.
    Silent,
}

/// Classifies the first bytes a listener sent back (pure).
pub fn classify(reply: &[u8]) -> Answer {
    match reply {
        [] => Answer::Silent,
        // A frame header: 24-bit length, type 0x4 (SETTINGS).
        [_, _, _, 0x04, ..] if reply.len() >= 9 => Answer::Http2,
        [0x15 | 0x16, 0x03, ..] => Answer::Tls,
        _ => {
            let text = String::from_utf8_lossy(reply);
            let line = text.trim_start().lines().next().unwrap_or("").trim_end();
            let shown: String = line.chars().take(60).collect();
            Answer::Other(shown.escape_default().to_string())
        }
    }
}

/// Another program holds a rendezvous endpoint: it answered the gRPC handshake otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("what listens on {endpoint} is not a drun rendezvous server: it answered the gRPC handshake with \"{answered}\"; another program holds the port, so stop it or give every node --rdzv-endpoint HOST:PORT with a free port")]
pub struct ForeignServer {
    /// The endpoint, as given.
    pub endpoint: String,
    /// The first line it answered, escaped and cut to 60 characters.
    pub answered: String,
}

/// What to tell the user about `endpoint` after `answer` (pure): `Err` ends the wait with this
/// line (exit 3); `Ok(Some)` replaces the reason of the wait (the line around it names the
/// endpoint); `Ok(None)`: nothing learned.
pub fn verdict(answer: &Answer, endpoint: &str) -> Result<Option<String>, ForeignServer> {
    match answer {
        Answer::Http2 => Ok(None),
        Answer::Tls => Ok(Some(
            "the server speaks TLS: give the agent --rdzv-tls-ca CA.pem".into(),
        )),
        Answer::Other(shown) => Err(ForeignServer {
            endpoint: endpoint.to_string(),
            answered: shown.clone(),
        }),
        Answer::Silent => Ok(Some(
            "it accepts connections but does not answer the gRPC handshake: a stopped server, or a program that is not a drun rendezvous server (a torch TCPStore?) holding the port".into(),
        )),
    }
}

/// Sends the HTTP/2 preface to `addr` (`IP:PORT`) and classifies the answer; None when it cannot
/// connect or send.
pub async fn probe(addr: &str) -> Option<Answer> {
    let connect = tokio::net::TcpStream::connect(addr);
    let mut s = tokio::time::timeout(PROBE_WAIT, connect).await.ok()?.ok()?;
    s.write_all(PREFACE).await.ok()?;
    let mut buf = [0u8; 128];
    let n = match tokio::time::timeout(PROBE_WAIT, s.read(&mut buf)).await {
        Ok(Ok(n)) => n,
        // Reset, or no answer in time.
        Ok(Err(_)) | Err(_) => 0,
    };
    Some(classify(&buf[..n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_told_apart_by_their_first_bytes() {
        // What a drun server (tonic/hyper) sends first: a SETTINGS frame.
        let settings = b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00@";
        assert_eq!(classify(settings), Answer::Http2);
        // What a rustls server sends to a plaintext client: an alert record.
        assert_eq!(classify(b"\x15\x03\x03\x00\x02\x022"), Answer::Tls);
        // Python's http.server: an HTML error page.
        let html = b"<!DOCTYPE HTML>\n<html lang=\"en\">\n    <head>";
        assert_eq!(classify(html), Answer::Other("<!DOCTYPE HTML>".into()));
        assert_eq!(
            classify(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
            Answer::Other("HTTP/1.1 400 Bad Request".into())
        );
        assert_eq!(classify(b"\x01\x02"), Answer::Other("\\u{1}\\u{2}".into()));
        assert_eq!(classify(b""), Answer::Silent);
    }

    #[test]
    fn only_a_program_that_answers_otherwise_ends_the_wait() {
        let end = verdict(&Answer::Other("HTTP/1.0 400".into()), "h:29400")
            .unwrap_err()
            .to_string();
        assert!(
            end.contains("not a drun rendezvous server") && end.contains("--rdzv-endpoint"),
            "{end}"
        );
        assert_eq!(verdict(&Answer::Http2, "h:1"), Ok(None));
        let tls = verdict(&Answer::Tls, "h:1").unwrap().unwrap();
        assert!(tls.contains("--rdzv-tls-ca"), "{tls}");
        let silent = verdict(&Answer::Silent, "h:1").unwrap().unwrap();
        assert!(silent.contains("TCPStore"), "{silent}");
    }
}
