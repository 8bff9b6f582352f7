//! The pull endpoints, on one small synchronous HTTP listener:
//!
//! - `/debug/pprof/profile?seconds=N[&pid=P][&service=S]`: a gzip pprof of
//!   the next N seconds (the path `go tool pprof`, Parca and Pyroscope
//!   scrape), built by the run loop;
//! - `/metrics`: the agent's health in Prometheus text format;
//! - `/healthz`: the run loop is turning; `/readyz`: sampling is running.
//!
//! A profile request waits N seconds, so each gets its own thread (a few
//! at once at most); everything else is answered inline.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tiny_http::{Header, Request, Response};

use super::Metrics;

/// Profile pulls served at the same time; more get 429.
const MAX_CONCURRENT_PULLS: usize = 4;
/// How stale the run loop's heartbeat may be before /healthz fails
/// (building a large window's profiles takes a few seconds at most).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(60);

/// A pull the run loop serves: the stacks of the next `seconds` seconds
/// that match the filters, as a gzip pprof.
pub struct PullRequest {
    pub seconds: u64,
    pub pid: Option<u32>,
    pub service: Option<String>,
    pub reply: SyncSender<Result<Vec<u8>, String>>,
}

pub struct Server {
    server: Arc<tiny_http::Server>,
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

impl Server {
    /// Binds `addr` and serves until dropped. Pull requests go to `pulls`.
    pub fn start(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        pulls: Sender<PullRequest>,
        max_pull_seconds: u64,
    ) -> Result<Server, ListenError> {
        let server = tiny_http::Server::http(addr).map_err(|e| ListenError {
            addr,
            message: e.to_string(),
        })?;
        let bound = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let accept = server.clone();
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let thread = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                let _log = tracing::dispatcher::set_default(&dispatch);
                let in_flight = Arc::new(AtomicUsize::new(0));
                for request in accept.incoming_requests() {
                    route(
                        request,
                        &metrics,
                        &pulls,
                        max_pull_seconds,
                        &in_flight,
                        &dispatch,
                    );
                }
            })
            .map_err(|e| ListenError {
                addr,
                message: e.to_string(),
            })?;
        Ok(Server {
            server,
            thread: Some(thread),
            addr: bound,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn route(
    request: Request,
    metrics: &Arc<Metrics>,
    pulls: &Sender<PullRequest>,
    max_pull_seconds: u64,
    in_flight: &Arc<AtomicUsize>,
    dispatch: &tracing::Dispatch,
) {
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    match path {
        "/metrics" => respond(
            request,
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render().into_bytes(),
        ),
        "/healthz" => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let beat = metrics.heartbeat_unix.load(Relaxed);
            if now.saturating_sub(beat) <= HEARTBEAT_TIMEOUT.as_secs() {
                text(request, 200, "ok\n")
            } else {
                text(request, 503, "the run loop has not turned for a minute\n")
            }
        }
        "/readyz" => {
            if metrics.ready.load(Relaxed) && !metrics.shutting_down.load(Relaxed) {
                text(request, 200, "ready\n")
            } else {
                text(request, 503, "not sampling (starting or shutting down)\n")
            }
        }
        "/debug/pprof/profile" => {
            let pull = match parse_pull(query, max_pull_seconds) {
                Ok(pull) => pull,
                Err(message) => {
                    metrics.pulls_rejected.fetch_add(1, Relaxed);
                    return text(request, 400, &format!("{message}\n"));
                }
            };
            if in_flight.fetch_add(1, Relaxed) >= MAX_CONCURRENT_PULLS {
                in_flight.fetch_sub(1, Relaxed);
                metrics.pulls_rejected.fetch_add(1, Relaxed);
                return text(
                    request,
                    429,
                    "too many profiles requested at once; retry later\n",
                );
            }
            let metrics = metrics.clone();
            let pulls = pulls.clone();
            let in_flight = in_flight.clone();
            let dispatch = dispatch.clone();
            let spawned = std::thread::Builder::new()
                .name("pull".into())
                .spawn(move || {
                    let _log = tracing::dispatcher::set_default(&dispatch);
                    serve_pull(request, pull, &metrics, &pulls);
                    in_flight.fetch_sub(1, Relaxed);
                });
            if spawned.is_err() {
                tracing::warn!("could not start a thread for a profile pull");
            }
        }
        _ => text(
            request,
            404,
            "not found: try /debug/pprof/profile?seconds=N, /metrics, /healthz, /readyz\n",
        ),
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
        let value = percent_decode(value);
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

fn serve_pull(request: Request, query: PullQuery, metrics: &Metrics, pulls: &Sender<PullRequest>) {
    let (reply, answer): (_, Receiver<_>) = mpsc::sync_channel(1);
    let seconds = query.seconds;
    let sent = pulls.send(PullRequest {
        seconds,
        pid: query.pid,
        service: query.service,
        reply,
    });
    if sent.is_err() {
        metrics.pulls_rejected.fetch_add(1, Relaxed);
        return text(request, 503, "the agent is shutting down\n");
    }
    match answer.recv_timeout(Duration::from_secs(seconds + 60)) {
        Ok(Ok(pprof)) => {
            metrics.pulls_served.fetch_add(1, Relaxed);
            let response = Response::from_data(pprof)
                .with_header(header("Content-Type", "application/octet-stream"))
                .with_header(header(
                    "Content-Disposition",
                    "attachment; filename=\"profile\"",
                ));
            let _ = request.respond(response);
        }
        Ok(Err(message)) => {
            metrics.pulls_rejected.fetch_add(1, Relaxed);
            text(request, 503, &format!("{message}\n"))
        }
        Err(_) => {
            metrics.pulls_rejected.fetch_add(1, Relaxed);
            text(
                request,
                503,
                "the agent stopped before the profile was complete\n",
            )
        }
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("valid header")
}

fn text(request: Request, status: u16, body: &str) {
    respond(
        request,
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    );
}

fn respond(request: Request, status: u16, content_type: &str, body: Vec<u8>) {
    let response = Response::from_data(body)
        .with_status_code(status)
        .with_header(header("Content-Type", content_type));
    // The client may have gone; nothing to do about it.
    let _ = request.respond(response);
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(parse_pull("seconds=0", 300).is_err());
        assert!(parse_pull("seconds=301", 300).unwrap_err().contains("300"));
        assert!(parse_pull("pid=x", 300).is_err());
        assert_eq!(percent_decode("a%2Fb%"), "a/b%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
