//! OTLP profiles: `ProfilesService/Export` with one request per window,
//! over HTTP/protobuf (`POST /v1development/profiles`, the Collector's
//! port 4318) or gRPC (port 4317). Each service is one resource whose
//! attributes follow the OpenTelemetry conventions (`service.name`,
//! `host.name`, `container.id`, `k8s.pod.name`, ...); see
//! `profile::otlp` for the message itself.
//!
//! gRPC is framed here on top of `h2` (one unary call: a 5-byte prefix,
//! the message, `grpc-status` in the trailers) rather than through tonic:
//! the agent is synchronous and one call per window needs no tower stack.

use crate::http_client::HttpConfig;
use serde::Deserialize;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use prost::Message;

use crate::http_client::{ClientError, HttpClient, auth_headers, ca_certificates};
use crate::{Batch, ExportError, Exporter};

use profiler_profile::otlp::{ResourceProfile, export_request};

/// Where the HTTP/protobuf binding posts when the URL has no path.
pub const HTTP_PATH: &str = "/v1development/profiles";
/// The gRPC method.
pub const GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

pub struct OtlpExporter {
    url: String,
    transport: Transport,
}

enum Transport {
    Http(HttpClient),
    Grpc(Box<grpc::Client>),
}

impl OtlpExporter {
    pub fn new(config: &OtlpConfig) -> Result<Self, ClientError> {
        let base = config.url.trim_end_matches('/');
        Ok(match config.protocol {
            OtlpProtocol::HttpProtobuf => {
                // Like OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT: a URL with a
                // path is used as is, a bare host gets the signal's path.
                let has_path = base
                    .split_once("://")
                    .is_some_and(|(_, rest)| rest.contains('/'));
                OtlpExporter {
                    url: if has_path {
                        base.to_string()
                    } else {
                        format!("{base}{HTTP_PATH}")
                    },
                    transport: Transport::Http(HttpClient::new(&config.http)?),
                }
            }
            OtlpProtocol::Grpc => OtlpExporter {
                url: format!("{base}{GRPC_PATH}"),
                transport: Transport::Grpc(Box::new(grpc::Client::new(config)?)),
            },
        })
    }
}

/// The request for one window: a resource per service.
pub fn window_request(batch: &Batch) -> Vec<u8> {
    let resources: Vec<ResourceProfile<'_>> = batch
        .profiles
        .iter()
        .map(|p| ResourceProfile {
            attributes: p.labels.clone(),
            profile: &p.profile,
        })
        .collect();
    export_request(&resources, env!("CARGO_PKG_VERSION")).encode_to_vec()
}

impl Exporter for OtlpExporter {
    fn name(&self) -> &str {
        "otlp"
    }

    fn export(&mut self, batch: &Batch) -> Result<(), ExportError> {
        if batch.profiles.is_empty() {
            return Ok(());
        }
        let body = window_request(batch);
        let started = batch.started.duration_since(UNIX_EPOCH).unwrap_or_default();
        tracing::debug!(
            bytes = body.len(),
            window_start_s = started.as_secs(),
            "otlp export"
        );
        match &mut self.transport {
            Transport::Http(client) => client.post(&self.url, "application/x-protobuf", &[], &body),
            Transport::Grpc(client) => client.call(&self.url, body),
        }
    }
}

mod grpc {
    use std::net::ToSocketAddrs;

    use bytes::Bytes;
    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};

    use super::*;

    /// One tokio runtime on the exporter's thread; a connection per call
    /// (one call per window: reconnecting costs nothing that matters and
    /// a backend that restarted is picked up without bookkeeping).
    pub struct Client {
        runtime: tokio::runtime::Runtime,
        tls: Option<TlsConnector>,
        headers: Vec<(String, String)>,
        timeout: Duration,
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
            let runtime = tokio::runtime::Builder::new_current_thread()
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
            })
        }

        /// One unary call; OK only for `grpc-status: 0`.
        pub fn call(&mut self, url: &str, message: Vec<u8>) -> Result<(), ExportError> {
            let failed = |message: String| ExportError::Http {
                url: url.to_string(),
                message,
            };
            let uri: http::Uri = url.parse().map_err(|e| failed(format!("bad URL: {e}")))?;
            let future = call(uri, self.tls.clone(), &self.headers, message);
            match self
                .runtime
                .block_on(async { tokio::time::timeout(self.timeout, future).await })
            {
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

    async fn call(
        uri: http::Uri,
        tls: Option<TlsConnector>,
        headers: &[(String, String)],
        message: Vec<u8>,
    ) -> Result<(), CallError> {
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
                exchange(stream, uri, headers, message).await
            }
            None => exchange(tcp, uri, headers, message).await,
        }
    }

    async fn exchange<IO>(
        io: IO,
        uri: http::Uri,
        headers: &[(String, String)],
        message: Vec<u8>,
    ) -> Result<(), CallError>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (send, connection) = h2::client::handshake(io)
            .await
            .map_err(|e| transport("HTTP/2 handshake")(e.to_string()))?;
        // The connection is driven next to the call on this thread.
        let driver = tokio::spawn(connection);
        let result = request(send, uri, headers, message).await;
        driver.abort();
        result
    }

    async fn request(
        send: h2::client::SendRequest<Bytes>,
        uri: http::Uri,
        headers: &[(String, String)],
        message: Vec<u8>,
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
        // Length-prefixed message: not compressed, 4-byte big-endian size.
        let mut framed = Vec::with_capacity(message.len() + 5);
        framed.push(0);
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        body.send_data(Bytes::from(framed), true)
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
}

/// Exports each window as OTLP profiles (`ProfilesService/Export`).
#[derive(serde::Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The receiver, e.g. `http://otel-collector:4318` for HTTP/protobuf
    /// (`/v1development/profiles` is appended when the URL has no path) or
    /// `http://otel-collector:4317` for gRPC; empty disables.
    pub url: String,
    /// grpc or http/protobuf.
    pub protocol: OtlpProtocol,
    #[serde(flatten)]
    pub http: HttpConfig,
    /// Windows queued while the receiver is slow or down, before the
    /// oldest is dropped.
    pub queue_size: usize,
    /// Attempts per window before it is dropped.
    pub max_attempts: u32,
}

/// The OTLP transports, named as `OTEL_EXPORTER_OTLP_PROTOCOL` names them.
#[derive(
    serde::Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default,
)]
pub enum OtlpProtocol {
    #[serde(rename = "grpc")]
    Grpc,
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl std::str::FromStr for OtlpProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "grpc" => Ok(OtlpProtocol::Grpc),
            "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
            _ => Err(format!(
                "{s:?} is not an OTLP protocol: use grpc or http/protobuf"
            )),
        }
    }
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            url: String::new(),
            protocol: OtlpProtocol::default(),
            http: HttpConfig::default(),
            queue_size: 8,
            max_attempts: 5,
        }
    }
}
