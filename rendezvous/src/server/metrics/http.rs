//! The `/metrics` endpoint: a tiny HTTP/1.1 server (hyper) that answers `GET /metrics` with
//! the OpenMetrics text a render function returns, and 404 for any other path.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The `Content-Type` of a scrape: OpenMetrics text, as `prometheus-client` encodes it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders the current metrics as OpenMetrics text (called once per scrape).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` on `listener` until `shutdown` resolves; each connection is its own
/// task. Errors of one connection (a client that went away) are logged at debug level only.
pub async fn serve(listener: TcpListener, render: Render, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics: accept failed");
                    continue;
                }
            },
        };
        let render = render.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let render = render.clone();
                async move { Ok::<_, Infallible>(answer(&req, &render)) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "metrics: connection ended with an error");
            }
        });
    }
}

/// Spawns [`serve`] on the current runtime for the life of the process.
pub fn spawn(listener: TcpListener, render: Render) {
    tokio::spawn(serve(listener, render, std::future::pending()));
}

fn answer(req: &Request<Incoming>, render: &Render) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, CONTENT_TYPE, render()),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: drun serves /metrics\n".to_string(),
        ),
    };
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, ctype)
        .body(Full::new(Bytes::from(body)))
        .expect("a response from a valid status and header")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn metrics_is_served_and_other_paths_are_404() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        spawn(listener, Arc::new(|| "# EOF\n".to_string()));
        let ok = get(addr, "/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE), "{ok}");
        assert!(ok.ends_with("# EOF\n"), "{ok}");
        let missing = get(addr, "/").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    }
}
