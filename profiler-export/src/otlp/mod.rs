//! OTLP profiles: `ProfilesService/Export` with one request per window,
//! over HTTP/protobuf (`POST /v1development/profiles`, the Collector's
//! port 4318) or gRPC (port 4317). Each service is one resource whose
//! attributes follow the OpenTelemetry conventions (`service.name`,
//! `host.name`, `container.id`, `k8s.pod.name`, ...); see
//! `profile::otlp` for the message itself; `grpc` for the gRPC transport
//! (one HTTP/2 connection for every window).

use crate::http_client::HttpConfig;
use serde::Deserialize;

use std::time::UNIX_EPOCH;

use prost::Message;

use crate::http_client::{ClientError, HttpClient};
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
            Transport::Grpc(client) => client.call(&self.url, &body),
        }
    }

    fn reconnects(&self) -> Option<u64> {
        match &self.transport {
            Transport::Http(_) => None,
            Transport::Grpc(client) => Some(client.reconnects()),
        }
    }
}

mod grpc;

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
