//! The pull endpoints, on a bounded HTTP server:
//!
//! - `/debug/pprof/heap[?pid=P][&service=S]`: the Go heap profiles of the
//!   matching processes now, read from their memory;
//! - `/debug/pprof/profile?seconds=N[&pid=P][&service=S]`: a gzip pprof of
//!   the next N seconds (the path `go tool pprof`, Parca and Pyroscope
//!   scrape), built by the run loop;
//! - `/debug/pprof/wall?seconds=N[&pid=P][&service=S]`: the same seconds as
//!   wall-clock time (CPU and off-CPU), when the run records it;
//! - `/metrics`: the agent's health in Prometheus text format;
//! - `/healthz`: the run loop is turning; `/readyz`: sampling is running.
//!
//! Any pod may reach this port, so nothing a client sends can grow the
//! agent without bound (hyper on one thread, async): at most
//! `MAX_CONNECTIONS` connections (more are closed at once), headers of at
//! most `MAX_HEADER_BYTES` that must arrive within `HEADER_TIMEOUT`
//! (slowloris), TLS handshakes within `HEADER_TIMEOUT` too, and no request
//! body is ever read: a request with one gets 413, a method other than GET
//! or HEAD 405. At most `MAX_CONCURRENT_PULLS` pulls at once (429 beyond).
//! Who may ask is `auth`'s decision (health endpoints stay open).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Semaphore, oneshot};

use crate::Metrics;
use crate::access::Decision;
use crate::auth::Auth;

/// Profile pulls served at the same time; more get 429.
const MAX_CONCURRENT_PULLS: usize = 4;
/// Open connections; more are closed as they arrive (counted).
pub const MAX_CONNECTIONS: usize = 1024;
/// A request's headers (and a TLS handshake) must arrive within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head (request line and headers).
const MAX_HEADER_BYTES: usize = 16 << 10;
/// Threads that may block on authentication (bcrypt, the Kubernetes API)
/// at once.
const AUTH_THREADS: usize = 4;
/// How stale the run loop's heartbeat may be before /healthz fails
/// (building a large window's profiles takes a few seconds at most).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a pull asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullKind {
    /// `/debug/pprof/profile`: the stacks of the next `seconds` seconds.
    Cpu,
    /// `/debug/pprof/wall`: the same, as wall-clock time (CPU samples as
    /// time plus off-CPU time: each thread's stacks add up to its time
    /// alive in those seconds). Named like Go's own endpoints, one path
    /// per profile type.
    Wall,
    /// `/debug/pprof/heap`: the Go heap profiles now, as a Go program's own
    /// `/debug/pprof/heap` answers (allocations since the process
    /// started, in use now).
    Heap,
}

/// A pull the run loop serves, as a gzip pprof: the stacks of the next
/// `seconds` seconds that match the filters, or the matching Go
/// processes' heaps.
pub struct PullRequest {
    pub kind: PullKind,
    pub seconds: u64,
    pub pid: Option<u32>,
    pub service: Option<String>,
    pub reply: oneshot::Sender<Result<Vec<u8>, String>>,
}

pub struct Server {
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub addr: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "cannot listen on {addr}: {message} (choose another address with --listen or \
     PROFILER_AGENT_LISTEN, or \"off\")"
)]
pub struct ListenError {
    addr: SocketAddr,
    message: String,
}

/// What every connection's requests share.
struct State {
    metrics: Arc<Metrics>,
    pulls: Sender<PullRequest>,
    max_pull_seconds: u64,
    pulls_in_flight: AtomicUsize,
    auth: Arc<Auth>,
}

impl Server {
    /// Binds `addr` and serves until dropped. Pull requests go to `pulls`.
    pub fn start(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        pulls: Sender<PullRequest>,
        max_pull_seconds: u64,
        auth: Arc<Auth>,
    ) -> Result<Server, ListenError> {
        let fail = |message: String| ListenError { addr, message };
        let listener = std::net::TcpListener::bind(addr).map_err(|e| fail(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        let bound = listener.local_addr().unwrap_or(addr);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(AUTH_THREADS)
            .thread_name("http-auth")
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let (shutdown, stop) = oneshot::channel();
        let state = Arc::new(State {
            metrics,
            pulls,
            max_pull_seconds,
            pulls_in_flight: AtomicUsize::new(0),
            auth,
        });
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let thread = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                let _log = tracing::dispatcher::set_default(&dispatch);
                runtime.block_on(accept_loop(listener, state, stop));
                // Open connections (a pull waiting for its window) end
                // with the runtime.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(|e| fail(e.to_string()))?;
        Ok(Server {
            shutdown: Some(shutdown),
            thread: Some(thread),
            addr: bound,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    state: Arc<State>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!("the HTTP listener failed: {error}");
            return;
        }
    };
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::debug!("accept: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            state.metrics.connections_refused.fetch_add(1, Relaxed);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            state.metrics.connections_open.fetch_add(1, Relaxed);
            serve_connection(stream, &state).await;
            state.metrics.connections_open.fetch_sub(1, Relaxed);
            drop(permit);
        });
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, state: &Arc<State>) {
    match state.auth.tls_acceptor() {
        Some(acceptor) => {
            let tls = match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                _ => return,
            };
            let verified = tls.get_ref().1.peer_certificates().is_some();
            serve_http(TokioIo::new(tls), state, verified).await
        }
        None => serve_http(TokioIo::new(stream), state, false).await,
    }
}

async fn serve_http<I>(io: TokioIo<I>, state: &Arc<State>, client_certificate: bool)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let state = state.clone();
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(request, &state, client_certificate).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true)
        // A client that closes its sending side after the request (nc,
        // some scripts) still gets its answer.
        .half_close(true)
        .serve_connection(io, service);
    // Errors here are the client's (garbage, a timeout, a reset).
    let _ = connection.await;
}

type Answer = Response<Full<Bytes>>;

fn text(status: StatusCode, body: &str) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Whether the request carries a body (which is never read).
fn has_body<B>(request: &Request<B>) -> bool {
    let headers = request.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().map_or(true, |v| v.trim() != "0"))
}

async fn handle(
    request: Request<Incoming>,
    state: &Arc<State>,
    client_certificate: bool,
) -> Answer {
    let mut answer = route(&request, state, client_certificate).await;
    if request.method() == Method::HEAD {
        *answer.body_mut() = Full::new(Bytes::new());
    }
    if has_body(&request) {
        // The body is left unread; the connection cannot be reused.
        answer.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    answer
}

/// The answer to one request (its body, if any, unread).
async fn route<B>(request: &Request<B>, state: &Arc<State>, client_certificate: bool) -> Answer {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut answer = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are served\n",
        );
        answer
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return answer;
    }
    if has_body(request) {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request bodies are not accepted\n",
        );
    }
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    let metrics = &state.metrics;
    match path.as_str() {
        "/healthz" => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let beat = metrics.heartbeat_unix.load(Relaxed);
            return if now.saturating_sub(beat) <= HEARTBEAT_TIMEOUT.as_secs() {
                text(StatusCode::OK, "ok\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the run loop has not turned for a minute\n",
                )
            };
        }
        "/readyz" => {
            return if metrics.ready.load(Relaxed) && !metrics.shutting_down.load(Relaxed) {
                text(StatusCode::OK, "ready\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not sampling (starting or shutting down)\n",
                )
            };
        }
        "/metrics" | "/debug/pprof/profile" | "/debug/pprof/wall" | "/debug/pprof/heap" => {}
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "not found: try /debug/pprof/profile?seconds=N, /debug/pprof/wall?seconds=N, \
                 /debug/pprof/heap, /metrics, /healthz, /readyz\n",
            );
        }
    }
    if let Some(answer) = authorize(request, state, &path, client_certificate).await {
        return answer;
    }
    if path == "/metrics" {
        let mut answer = Response::new(Full::new(Bytes::from(metrics.render())));
        answer.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return answer;
    }
    let pull = match parse_pull(&query, state.max_pull_seconds) {
        Ok(pull) => pull,
        Err(message) => {
            metrics.pulls_rejected.fetch_add(1, Relaxed);
            return text(StatusCode::BAD_REQUEST, &format!("{message}\n"));
        }
    };
    if state.pulls_in_flight.fetch_add(1, Relaxed) >= MAX_CONCURRENT_PULLS {
        state.pulls_in_flight.fetch_sub(1, Relaxed);
        metrics.pulls_rejected.fetch_add(1, Relaxed);
        return text(
            StatusCode::TOO_MANY_REQUESTS,
            "too many profiles requested at once; retry later\n",
        );
    }
    let kind = match path.as_str() {
        "/debug/pprof/heap" => PullKind::Heap,
        "/debug/pprof/wall" => PullKind::Wall,
        _ => PullKind::Cpu,
    };
    let answer = serve_pull(kind, pull, state).await;
    state.pulls_in_flight.fetch_sub(1, Relaxed);
    answer
}

/// None when the request may go on, else the 401 or 403 to send.
async fn authorize<B>(
    request: &Request<B>,
    state: &Arc<State>,
    path: &str,
    client_certificate: bool,
) -> Option<Answer> {
    if !state.auth.enabled() {
        return None;
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let auth = state.auth.clone();
    let path = path.to_string();
    // bcrypt and the API server block: off the event loop, on a bounded pool.
    let decision = tokio::task::spawn_blocking(move || {
        auth.decide(&path, authorization.as_deref(), client_certificate)
    })
    .await
    .unwrap_or_else(|_| Decision::Unauthenticated("authentication failed".into()));
    match decision {
        Decision::Allow => None,
        Decision::Unauthenticated(why) => {
            state.metrics.requests_unauthenticated.fetch_add(1, Relaxed);
            let mut answer = text(StatusCode::UNAUTHORIZED, &format!("{why}\n"));
            answer.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"profiler-agent\", Bearer"),
            );
            Some(answer)
        }
        Decision::Forbidden(why) => {
            state.metrics.requests_forbidden.fetch_add(1, Relaxed);
            Some(text(StatusCode::FORBIDDEN, &format!("{why}\n")))
        }
    }
}

/// Parsed query of a profile pull (the reply channel is added later).
#[derive(Debug, PartialEq, Eq)]
pub struct PullQuery {
    pub seconds: u64,
    pub pid: Option<u32>,
    pub service: Option<String>,
}

/// `seconds` defaults to 30 as in Go's net/http/pprof.
pub fn parse_pull(query: &str, max_seconds: u64) -> Result<PullQuery, String> {
    let mut pull = PullQuery {
        seconds: 30,
        pid: None,
        service: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_encoding::percent_decode_str(&value.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned();
        match key {
            "seconds" => {
                pull.seconds = value
                    .parse()
                    .ok()
                    .filter(|s| (1..=max_seconds).contains(s))
                    .ok_or_else(|| {
                        format!("seconds={value:?}: give a whole number from 1 to {max_seconds}")
                    })?
            }
            "pid" => {
                pull.pid = Some(
                    value
                        .parse()
                        .map_err(|_| format!("pid={value:?} is not a process id"))?,
                )
            }
            "service" => pull.service = Some(value),
            // go tool pprof and scrapers may add their own parameters.
            _ => {}
        }
    }
    Ok(pull)
}

async fn serve_pull(kind: PullKind, query: PullQuery, state: &Arc<State>) -> Answer {
    let metrics = &state.metrics;
    let (reply, answer) = oneshot::channel();
    // A heap is read at once: no seconds to wait.
    let seconds = match kind {
        PullKind::Cpu | PullKind::Wall => query.seconds,
        PullKind::Heap => 0,
    };
    let sent = state.pulls.send(PullRequest {
        kind,
        seconds,
        pid: query.pid,
        service: query.service,
        reply,
    });
    if sent.is_err() {
        metrics.pulls_rejected.fetch_add(1, Relaxed);
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the agent is shutting down\n",
        );
    }
    match tokio::time::timeout(Duration::from_secs(seconds + 60), answer).await {
        Ok(Ok(Ok(pprof))) => {
            metrics.pulls_served.fetch_add(1, Relaxed);
            let mut response = Response::new(Full::new(Bytes::from(pprof)));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(
                header::CONTENT_DISPOSITION,
                header::HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            response
        }
        Ok(Ok(Err(message))) => {
            metrics.pulls_rejected.fetch_add(1, Relaxed);
            text(StatusCode::SERVICE_UNAVAILABLE, &format!("{message}\n"))
        }
        _ => {
            metrics.pulls_rejected.fetch_add(1, Relaxed);
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the agent stopped before the profile was complete\n",
            )
        }
    }
}

/// One connection's bytes through the real request path (hyper's parser,
/// the limits, routing, authentication with nothing configured), for the
/// `http_request` fuzz target: whatever the bytes, an answer or a closed
/// connection, within a bounded time.
#[doc(hidden)]
pub fn serve_bytes_for_fuzzing(input: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (pulls, _requests) = std::sync::mpsc::channel();
    let state = Arc::new(State {
        metrics: Arc::new(Metrics::default()),
        pulls,
        max_pull_seconds: 1,
        pulls_in_flight: AtomicUsize::new(0),
        auth: Arc::new(Auth::open()),
    });
    runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 << 10);
        let served =
            tokio::spawn(async move { serve_http(TokioIo::new(server), &state, false).await });
        let _ = client.write_all(input).await;
        let _ = client.shutdown().await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), client.read_to_end(&mut answer)).await;
        served.abort();
        answer
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_path_answers_raw_bytes() {
        let answer = serve_bytes_for_fuzzing(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            answer.starts_with(b"HTTP/1.1 503"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let answer = serve_bytes_for_fuzzing(
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\nab",
        );
        assert!(
            answer.starts_with(b"HTTP/1.1 405"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let answer = serve_bytes_for_fuzzing(b"\x00\x01garbage\r\n\r\n");
        assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 400"));
    }

    #[test]
    fn pull_queries() {
        assert_eq!(
            parse_pull("seconds=3", 300).unwrap(),
            PullQuery {
                seconds: 3,
                pid: None,
                service: None
            }
        );
        assert_eq!(parse_pull("", 300).unwrap().seconds, 30);
        let q = parse_pull("seconds=5&pid=42&service=my%20svc&debug=1", 300).unwrap();
        assert_eq!((q.pid, q.service.as_deref()), (Some(42), Some("my svc")));
        assert_eq!(
            parse_pull("service=a+b", 300).unwrap().service.as_deref(),
            Some("a b")
        );
        assert!(parse_pull("seconds=0", 300).is_err());
        assert!(parse_pull("seconds=301", 300).unwrap_err().contains("300"));
        assert!(parse_pull("pid=x", 300).is_err());
        assert_eq!(
            parse_pull("service=a%2Fb%", 300)
                .unwrap()
                .service
                .as_deref(),
            Some("a/b%")
        );
    }

    fn state() -> Arc<State> {
        let (pulls, _) = std::sync::mpsc::channel();
        Arc::new(State {
            metrics: Arc::new(Metrics::default()),
            pulls,
            max_pull_seconds: 300,
            pulls_in_flight: AtomicUsize::new(0),
            auth: Arc::new(Auth::open()),
        })
    }

    fn status(request: Request<()>) -> StatusCode {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(route(&request, &state(), false)).status()
    }

    #[test]
    fn methods_and_bodies_are_refused_without_reading_them() {
        let request = |method: &str, path: &str| Request::builder().method(method).uri(path);
        assert_eq!(status(request("POST", "/metrics").body(()).unwrap()), 405);
        assert_eq!(status(request("DELETE", "/healthz").body(()).unwrap()), 405);
        // A huge declared length is answered, never allocated.
        let huge = request("GET", "/metrics")
            .header("Content-Length", "99999999999")
            .body(())
            .unwrap();
        assert_eq!(status(huge), 413);
        let chunked = request("GET", "/metrics")
            .header("Transfer-Encoding", "chunked")
            .body(())
            .unwrap();
        assert_eq!(status(chunked), 413);
        let empty = request("GET", "/metrics")
            .header("Content-Length", "0")
            .body(())
            .unwrap();
        assert_eq!(status(empty), 200);
        assert_eq!(status(request("GET", "/nope").body(()).unwrap()), 404);
        assert_eq!(status(request("HEAD", "/readyz").body(()).unwrap()), 503);
        assert_eq!(
            status(
                request("GET", "/debug/pprof/profile?seconds=0")
                    .body(())
                    .unwrap()
            ),
            400
        );
    }
}
