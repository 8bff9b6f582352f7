//! OTLP over gRPC: one unary call per window (a 5-byte prefix, the
//! message, `grpc-status` in the trailers), framed on `h2` rather than
//! through tonic: the exporter is synchronous and one call per window
//! needs no tower stack.
//!
//! Windows share one HTTP/2 connection, each call a stream of it, as gRPC
//! clients keep theirs: no TCP and TLS handshake per window, and a
//! Collector behind a load balancer sees one long-lived client. Its
//! driver runs on the runtime's own thread between windows, so it answers
//! the server's pings and notices a close (a restart, an idle timeout, a
//! proxy's cut) when it happens; the next call then opens a new
//! connection. A call that fails on a connection already in use, before
//! the server answered, is sent once more on a new one at once (the old
//! one had broken without saying so yet); any other failure is the
//! queue's to retry, with its backoff, and the retry connects anew.
//! Connections opened after the first are counted (`/metrics`:
//! `profiler_agent_export_reconnects_total`).

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use super::OtlpConfig;
use crate::ExportError;
use crate::http_client::{ClientError, auth_headers, ca_certificates};

pub struct Client {
    /// One worker thread: drives the connection between calls.
    runtime: tokio::runtime::Runtime,
    tls: Option<TlsConnector>,
    headers: Vec<(String, String)>,
    timeout: Duration,
    /// The connection windows share; None before the first call and once
    /// it broke.
    connection: Option<Connection>,
    /// Connections opened so far.
    opened: u64,
}

/// One HTTP/2 connection: the handle that opens streams, and the task
/// that drives it (ended when the connection is).
struct Connection {
    send: h2::client::SendRequest<Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

impl Connection {
    fn is_open(&self) -> bool {
        !self.driver.is_finished()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Client {
    pub fn new(config: &OtlpConfig) -> Result<Client, ClientError> {
        let tls = if config.url.starts_with("https://") {
            let mut roots = RootCertStore::empty();
            match ca_certificates(&config.http)? {
                Some(certs) => {
                    for der in certs {
                        // A certificate rustls cannot use is skipped;
                        // the handshake then names the failure.
                        let _ = roots.add(CertificateDer::from(der));
                    }
                }
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
            let mut tls = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            tls.alpn_protocols = vec![b"h2".to_vec()];
            Some(TlsConnector::from(Arc::new(tls)))
        } else {
            None
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("export-otlp-h2")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|source| ClientError::Runtime { source })?;
        let headers = auth_headers(&config.http)
            .into_iter()
            // HTTP/2 header names are lower case.
            .map(|(name, value)| (name.to_ascii_lowercase(), value))
            .collect();
        Ok(Client {
            runtime,
            tls,
            headers,
            timeout: config.http.timeout.max(Duration::from_millis(1)),
            connection: None,
            opened: 0,
        })
    }

    /// Connections opened after the first.
    pub fn reconnects(&self) -> u64 {
        self.opened.saturating_sub(1)
    }

    /// One unary call; OK only for `grpc-status: 0`.
    pub fn call(&mut self, url: &str, message: &[u8]) -> Result<(), ExportError> {
        let failed = |message: String| ExportError::Http {
            url: url.to_string(),
            message,
        };
        let uri: http::Uri = url.parse().map_err(|e| failed(format!("bad URL: {e}")))?;
        // Length-prefixed message: not compressed, 4-byte big-endian size.
        let mut framed = Vec::with_capacity(message.len() + 5);
        framed.push(0);
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(message);
        let framed = Bytes::from(framed);
        let Client {
            runtime,
            tls,
            headers,
            timeout,
            connection,
            opened,
        } = self;
        let call = call(&uri, tls, headers, framed, connection, opened);
        let answer = runtime.block_on(async { tokio::time::timeout(*timeout, call).await });
        if !matches!(answer, Ok(Ok(())) | Ok(Err(CallError::Grpc { .. }))) {
            // A transport failure or a timeout leaves the connection in a
            // state nobody knows: the next call opens a new one.
            self.connection = None;
        }
        match answer {
            Ok(Ok(())) => Ok(()),
            Ok(Err(CallError::Transport(message))) => Err(failed(message)),
            Ok(Err(CallError::Status { status, message })) => Err(ExportError::Status {
                url: url.to_string(),
                status,
                body: message,
            }),
            Ok(Err(CallError::Grpc { code, message })) => Err(ExportError::Grpc {
                url: url.to_string(),
                code,
                name: code_name(code),
                message,
            }),
            Err(_) => Err(failed(format!("no answer within {:?}", self.timeout))),
        }
    }
}

enum CallError {
    Transport(String),
    /// An HTTP status other than 200: not a gRPC server.
    Status {
        status: u16,
        message: String,
    },
    /// A gRPC status other than OK.
    Grpc {
        code: u16,
        message: String,
    },
}

fn transport(context: &'static str) -> impl Fn(String) -> CallError {
    move |e| CallError::Transport(format!("{context}: {e}"))
}

/// The call on the shared connection, opened first when there is none
/// (or it closed since the last call).
async fn call(
    uri: &http::Uri,
    tls: &Option<TlsConnector>,
    headers: &[(String, String)],
    framed: Bytes,
    connection: &mut Option<Connection>,
    opened: &mut u64,
) -> Result<(), CallError> {
    if connection.as_ref().is_some_and(|c| !c.is_open()) {
        *connection = None;
    }
    let reused = connection.is_some();
    if connection.is_none() {
        *connection = Some(connect(uri, tls.clone()).await?);
        *opened += 1;
    }
    let send = connection.as_ref().expect("connected above").send.clone();
    match request(send, uri.clone(), headers, framed.clone()).await {
        Err(CallError::Transport(why)) if reused => {
            tracing::debug!("otlp: the shared connection failed ({why}); sending on a new one");
            *connection = None;
            let fresh = connect(uri, tls.clone()).await?;
            *opened += 1;
            let send = fresh.send.clone();
            *connection = Some(fresh);
            request(send, uri.clone(), headers, framed).await
        }
        result => result,
    }
}

/// A new HTTP/2 connection to the URI's host (TLS when configured), its
/// driver spawned on the runtime.
async fn connect(uri: &http::Uri, tls: Option<TlsConnector>) -> Result<Connection, CallError> {
    let host = uri.host().unwrap_or_default().to_string();
    let port = uri
        .port_u16()
        .unwrap_or(if tls.is_some() { 443 } else { 80 });
    let addr = (host.trim_matches(['[', ']']), port)
        .to_socket_addrs()
        .map_err(|e| transport("resolving")(e.to_string()))?
        .next()
        .ok_or_else(|| CallError::Transport(format!("{host} has no address")))?;
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| transport("connecting")(e.to_string()))?;
    tcp.set_nodelay(true).ok();
    match tls {
        Some(tls) => {
            let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .map_err(|e| transport("server name")(e.to_string()))?;
            let stream = tls
                .connect(name, tcp)
                .await
                .map_err(|e| transport("TLS handshake")(e.to_string()))?;
            handshake(stream).await
        }
        None => handshake(tcp).await,
    }
}

async fn handshake<IO>(io: IO) -> Result<Connection, CallError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, connection) = h2::client::handshake(io)
        .await
        .map_err(|e| transport("HTTP/2 handshake")(e.to_string()))?;
    let driver = tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!("otlp: the gRPC connection ended: {error}");
        }
    });
    Ok(Connection { send, driver })
}

async fn request(
    send: h2::client::SendRequest<Bytes>,
    uri: http::Uri,
    headers: &[(String, String)],
    framed: Bytes,
) -> Result<(), CallError> {
    let mut send = send
        .ready()
        .await
        .map_err(|e| transport("HTTP/2")(e.to_string()))?;
    let mut builder = http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header(
            "user-agent",
            concat!("profiler-agent/", env!("CARGO_PKG_VERSION")),
        );
    for (name, value) in headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let request = builder
        .body(())
        .map_err(|e| transport("request")(e.to_string()))?;
    let (response, mut body) = send
        .send_request(request, false)
        .map_err(|e| transport("sending")(e.to_string()))?;
    body.send_data(framed, true)
        .map_err(|e| transport("sending")(e.to_string()))?;
    let response = response
        .await
        .map_err(|e| transport("awaiting the answer")(e.to_string()))?;
    let status = response.status();
    // A trailers-only answer carries grpc-status in the headers.
    if let Some(result) = grpc_status(response.headers()) {
        return result;
    }
    if status != http::StatusCode::OK {
        return Err(CallError::Status {
            status: status.as_u16(),
            message: "not a gRPC answer".into(),
        });
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| transport("reading the answer")(e.to_string()))?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| transport("reading the trailers")(e.to_string()))?
        .unwrap_or_default();
    grpc_status(&trailers).unwrap_or_else(|| {
        Err(CallError::Transport(
            "the answer ended without grpc-status".into(),
        ))
    })
}

/// `grpc-status` 0 is success; any other code is reported with
/// `grpc-message`.
fn grpc_status(headers: &http::HeaderMap) -> Option<Result<(), CallError>> {
    let code: u16 = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    if code == 0 {
        return Some(Ok(()));
    }
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or_default();
    Some(Err(CallError::Grpc {
        code,
        message: message.to_string(),
    }))
}

fn code_name(code: u16) -> &'static str {
    match code {
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        16 => "UNAUTHENTICATED",
        _ => "other",
    }
}
