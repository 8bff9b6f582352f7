//! Pyroscope push: Connect RPC `POST /push.v1.PusherService/Push` with a
//! protobuf `PushRequest` body, one series per service, each carrying the
//! window's gzip pprof. Series labels: `__name__="process_cpu"` (the
//! CPU profile; `wall`, `memory` and `probe_<name>` for the others),
//! `service_name`, `node`, and the container when one service is one
//! container.

use crate::http_client::HttpConfig;
use serde::Deserialize;

use crate::http_client::{ClientError, HttpClient};
use crate::{Batch, ExportError, Exporter};

/// push/v1/push.proto and types/v1/types.proto, generated from `proto/`
/// at build time.
pub mod proto {
    // Nested as the proto packages are: generated code names types.v1's
    // messages through `super::super::types::v1`.
    pub mod types {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/types.v1.rs"));
        }
    }
    pub mod push {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
        }
    }
    pub use push::v1::{PushRequest, RawProfileSeries, RawSample};
    pub use types::v1::LabelPair;
}

const PUSH_PATH: &str = "/push.v1.PusherService/Push";

pub struct PyroscopeExporter {
    url: String,
    client: HttpClient,
}

impl PyroscopeExporter {
    pub fn new(config: &PyroscopeConfig) -> Result<Self, ClientError> {
        Ok(PyroscopeExporter {
            url: format!("{}{PUSH_PATH}", config.url.trim_end_matches('/')),
            client: HttpClient::new(&config.http)?,
        })
    }
}

/// The request for one window.
pub fn push_request(batch: &Batch) -> proto::PushRequest {
    let series = batch
        .profiles
        .iter()
        .map(|profile| {
            // Pyroscope's name for a process's CPU profile; the others
            // (wall, memory, a probe's) are series of their own names.
            let name = if profile.name == crate::CPU_PROFILE {
                "process_cpu".to_string()
            } else {
                profile.name.clone()
            };
            let mut labels = vec![proto::LabelPair {
                name: "__name__".into(),
                value: name,
            }];
            // A heap's allocations are per window already: Pyroscope must
            // not take differences again (as for Alloy's memory profiles).
            if profile.name == crate::MEMORY_PROFILE {
                labels.push(proto::LabelPair {
                    name: "__delta__".into(),
                    value: "false".into(),
                });
            }
            labels.extend(profile.labels.iter().map(|(name, value)| proto::LabelPair {
                name: name.clone(),
                value: value.clone(),
            }));
            // Pyroscope wants labels sorted by name.
            labels.sort_by(|a, b| a.name.cmp(&b.name));
            proto::RawProfileSeries {
                labels,
                samples: vec![proto::RawSample {
                    raw_profile: profile.pprof.as_ref().clone(),
                    id: uuid_v4(),
                }],
            }
        })
        .collect();
    proto::PushRequest { series }
}

impl Exporter for PyroscopeExporter {
    fn name(&self) -> &str {
        "pyroscope"
    }

    fn export(&mut self, batch: &Batch) -> Result<(), ExportError> {
        if batch.profiles.is_empty() {
            return Ok(());
        }
        let body = prost::Message::encode_to_vec(&push_request(batch));
        self.client.post(
            &self.url,
            "application/proto",
            &[("Connect-Protocol-Version", "1")],
            &body,
        )
    }
}

/// A random (version 4) UUID.
fn uuid_v4() -> String {
    let mut bytes = fastrand::u128(..).to_le_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Pushes each window to Pyroscope (`POST /push.v1.PusherService/Push`).
#[derive(serde::Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PyroscopeConfig {
    /// Base URL, e.g. `http://pyroscope.monitoring:4040`; empty disables.
    pub url: String,
    #[serde(flatten)]
    pub http: HttpConfig,
    /// Windows queued while Pyroscope is slow or down, before the oldest
    /// is dropped.
    pub queue_size: usize,
    /// Attempts per window before it is dropped.
    pub max_attempts: u32,
}

impl Default for PyroscopeConfig {
    fn default() -> Self {
        PyroscopeConfig {
            url: String::new(),
            http: HttpConfig::default(),
            queue_size: 8,
            max_attempts: 5,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::SystemTime;

    use prost::Message;

    use super::*;
    use crate::ServiceProfile;

    #[test]
    fn the_request_has_one_series_per_service_with_sorted_labels() {
        let batch = Batch {
            started: SystemTime::now(),
            ended: SystemTime::now(),
            profiles: vec![ServiceProfile {
                name: crate::CPU_PROFILE.into(),
                service: "nginx".into(),
                labels: vec![
                    ("service_name".into(), "nginx".into()),
                    ("node".into(), "n1".into()),
                ],
                pprof: Arc::new(vec![1, 2, 3]),
                profile: Arc::default(),
            }],
        };
        let bytes = push_request(&batch).encode_to_vec();
        let decoded = proto::PushRequest::decode(bytes.as_slice()).unwrap();
        let series = &decoded.series[0];
        let labels: Vec<(&str, &str)> = series
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("__name__", "process_cpu"),
                ("node", "n1"),
                ("service_name", "nginx")
            ]
        );
        assert_eq!(series.samples[0].raw_profile, [1, 2, 3]);
        let id = &series.samples[0].id;
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(uuid_v4(), uuid_v4());
    }

    #[test]
    fn the_wall_clock_profile_is_a_series_named_wall() {
        let profile = |name: &str| ServiceProfile {
            name: name.into(),
            service: "shop".into(),
            labels: vec![("service_name".into(), "shop".into())],
            pprof: Arc::new(vec![1]),
            profile: Arc::default(),
        };
        let batch = Batch {
            started: SystemTime::now(),
            ended: SystemTime::now(),
            profiles: vec![profile(crate::CPU_PROFILE), profile(crate::WALL_PROFILE)],
        };
        let names: Vec<String> = push_request(&batch)
            .series
            .iter()
            .map(|s| {
                let name = s.labels.iter().find(|l| l.name == "__name__").unwrap();
                // A wall-clock window is a delta like the CPU one.
                assert!(!s.labels.iter().any(|l| l.name == "__delta__"));
                name.value.clone()
            })
            .collect();
        assert_eq!(names, ["process_cpu", "wall"]);
    }
}
