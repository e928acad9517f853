//! The exporter's HTTP/1.1 server (hyper on a one-thread tokio runtime),
//! built so that no client can stop it or starve a scrape:
//!
//! - memory per connection is bounded: a request head (request line and
//!   headers) of at most `HEAD_BYTES` and `MAX_HEADERS` headers (else 431),
//!   a request body is never read into memory, and the exposition is one
//!   shared buffer, not a copy per client;
//! - a client that sends nothing for `READ_IDLE`, takes longer than
//!   `HEAD_TIMEOUT` over a request head, or reads nothing of its answer for
//!   `WRITE_STALL` is disconnected (`deadline`);
//! - at most `MAX_CONNECTIONS` connections at once; one more is closed at
//!   once, said on stderr the first time;
//! - each connection is a task of its own, so a stalled one holds up
//!   nobody else; scrapes that arrive while one is being read share the
//!   next (`Coalesced`), so pipelined requests cannot queue work.
//!
//! Routes: `GET /metrics` (and HEAD), `/healthz`, `/`; other paths 404,
//! other methods 405.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::deadline::Deadline;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 512;
/// Bytes of one request's line and headers.
pub const HEAD_BYTES: usize = 16 * 1024;
/// Headers of one request.
pub const MAX_HEADERS: usize = 64;
/// Time to send a whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client may send nothing (idle keep-alive included).
pub const READ_IDLE: Duration = Duration::from_secs(60);
/// Time a client may read nothing of an answer.
pub const WRITE_STALL: Duration = Duration::from_secs(10);

/// The exposition's content type (what `prometheus-client` encodes).
pub const CONTENT_TYPE_METRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One exposition at a time, shared by every request that arrived before
/// it was begun: a request never gets figures read before it arrived.
pub struct Coalesced {
    produce: Arc<Mutex<dyn FnMut() -> String + Send>>,
    last: tokio::sync::Mutex<Option<(Instant, Bytes)>>,
}

impl Coalesced {
    /// `produce` reads and encodes one exposition (blocking work).
    pub fn new(produce: impl FnMut() -> String + Send + 'static) -> Coalesced {
        Coalesced {
            produce: Arc::new(Mutex::new(produce)),
            last: tokio::sync::Mutex::new(None),
        }
    }

    async fn get(&self, arrived: Instant) -> Bytes {
        let mut last = self.last.lock().await;
        if let Some((begun, body)) = &*last
            && *begun >= arrived
        {
            return body.clone();
        }
        let begun = Instant::now();
        let produce = self.produce.clone();
        let run = move || (produce.lock().unwrap_or_else(PoisonError::into_inner))();
        let body = match tokio::task::spawn_blocking(run).await {
            Ok(text) => Bytes::from(text),
            // The scrape panicked: the next request tries again.
            Err(_) => return Bytes::new(),
        };
        *last = Some((begun, body.clone()));
        body
    }
}

/// Serves `listener` until the process is stopped.
pub fn serve(listener: std::net::TcpListener, metrics: Coalesced) -> Result<(), String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("the listening socket: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(2)
        .build()
        .map_err(|e| format!("the HTTP server's runtime: {e}"))?;
    rt.block_on(accept(listener, Arc::new(metrics)))
}

async fn accept(listener: std::net::TcpListener, metrics: Arc<Coalesced>) -> Result<(), String> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| format!("the listening socket: {e}"))?;
    let open = Arc::new(AtomicUsize::new(0));
    let said_full = AtomicBool::new(false);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, a connection reset before accept:
                // wait a moment rather than spin.
                eprintln!("vgpuctl serve: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            if !said_full.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "vgpuctl serve: {MAX_CONNECTIONS} connections open; closing new ones (from {peer} first) until some end"
                );
            }
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        open.fetch_add(1, Ordering::Relaxed);
        let conn = Connection {
            open: open.clone(),
            metrics: metrics.clone(),
        };
        tokio::spawn(conn.run(stream, peer));
    }
}

/// One client's connection; counted open until dropped.
struct Connection {
    open: Arc<AtomicUsize>,
    metrics: Arc<Coalesced>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connection {
    async fn run(self, stream: tokio::net::TcpStream, _peer: SocketAddr) {
        let io = TokioIo::new(Deadline::new(stream, READ_IDLE, WRITE_STALL));
        let metrics = self.metrics.clone();
        let service = hyper::service::service_fn(move |req| {
            let metrics = metrics.clone();
            async move { Ok::<_, Infallible>(route(&req, &metrics).await) }
        });
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(HEAD_BYTES)
            .max_header_size(HEAD_BYTES)
            .max_headers(MAX_HEADERS);
        // An error here is the client's (a timeout, a bad request, a
        // reset): the connection ends, nothing else does.
        let _ = http.serve_connection(io, service).await;
        drop(self);
    }
}

async fn route(req: &Request<Incoming>, metrics: &Coalesced) -> Response<Full<Bytes>> {
    let arrived = Instant::now();
    let path = req.uri().path();
    let known = matches!(path, "/metrics" | "/healthz" | "/");
    if !known {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match path {
        "/metrics" => {
            let body = metrics.get(arrived).await;
            if body.is_empty() {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "the scrape failed\n");
            }
            let mut r = Response::new(Full::new(body));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_METRICS));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        _ => text(StatusCode::OK, "vgpuctl serve: metrics at /metrics\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn requests_share_a_scrape_begun_after_they_arrived_and_never_an_older_one() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let n = Arc::new(AtomicU32::new(0));
        let count = n.clone();
        let c = Coalesced::new(move || format!("{}", count.fetch_add(1, Ordering::SeqCst)));
        rt.block_on(async {
            let early = Instant::now();
            let a = c.get(early).await;
            // Arrived before scrape 0 began: it is shared.
            let b = c.get(early).await;
            assert_eq!((a.as_ref(), b.as_ref()), (&b"0"[..], &b"0"[..]));
            // Arrived after: a fresh one.
            let late = Instant::now();
            assert_eq!(c.get(late).await.as_ref(), b"1");
        });
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }
}
