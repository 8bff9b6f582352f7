//! Getting profiles out of the agent: push exporters (a directory of pprof
//! files, Pyroscope, OTLP), each behind its own bounded queue and thread so a
//! slow or dead backend never blocks sampling, and the pull endpoints
//! (`/debug/pprof/profile`, `/debug/pprof/wall`, `/debug/pprof/heap`,
//! `/metrics`, `/healthz`, `/readyz`).

pub mod access;
pub mod auth;
pub mod directory;
pub mod http_client;
pub mod kubernetes_api;
pub mod metrics;
pub mod otlp;
pub mod pyroscope;
pub mod queue;
pub mod server;
mod tls;
mod token_review;
pub mod web_config;

use std::sync::Arc;
use std::time::SystemTime;

use profiler_profile::Profile;

pub use metrics::{ExporterStats, Metrics};
pub use queue::{Exporter, ExporterHandle};

/// What the sampled CPU profile is called ([`ServiceProfile::name`]).
pub const CPU_PROFILE: &str = "cpu";

/// What the wall-clock profile is called (`wall = true`): CPU samples as
/// time plus off-CPU time, each thread's stacks adding up to its time
/// alive in the window. Pyroscope's name for wall-clock profiles too.
pub const WALL_PROFILE: &str = "wall";

/// What page-fault profiles are called (`page_faults = true`): one sample
/// per `page_fault_period` page faults, with the stack that first touched
/// the page: where a service's resident memory grows.
pub const PAGE_FAULTS_PROFILE: &str = "page_faults";

/// What Go heap profiles are called: Pyroscope's name for them (its
/// `memory:alloc_space:bytes:space:bytes` and the other three types).
pub const MEMORY_PROFILE: &str = "memory";

/// The name of a configured probe's profile of operations at its hits.
pub fn probe_profile_name(probe: &str) -> String {
    format!("probe_{probe}")
}

/// The profile of one service for one window, encoded once and shared by
/// every exporter.
#[derive(Debug, Clone)]
pub struct ServiceProfile {
    /// What the profile measures: [`CPU_PROFILE`] for the sampled profile,
    /// [`WALL_PROFILE`] for its wall-clock view, [`MEMORY_PROFILE`] for Go
    /// heaps, [`probe_profile_name`] for a configured probe's stacks. Names
    /// directory files (`<name>-<service>-<ms>.pb.gz`) and Pyroscope's
    /// `__name__` (`process_cpu` for the CPU profile).
    pub name: String,
    /// The `service_name` label; also names directory files.
    pub service: String,
    /// Series labels for backends that index them (Pyroscope):
    /// `service_name`, `node`, and the container when all the service's
    /// processes share one.
    pub labels: Vec<(String, String)>,
    /// gzip-compressed pprof.
    pub pprof: Arc<Vec<u8>>,
    /// The profile itself, for exporters that write another format (OTLP).
    pub profile: Arc<Profile>,
}

/// Everything one window produced.
#[derive(Debug, Clone)]
pub struct Batch {
    pub started: SystemTime,
    pub ended: SystemTime,
    pub profiles: Vec<ServiceProfile>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("HTTP request to {url} failed: {message}")]
    Http { url: String, message: String },
    #[error("{url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url} answered gRPC status {code} ({name}): {message}")]
    Grpc {
        url: String,
        code: u16,
        name: &'static str,
        message: String,
    },
}
