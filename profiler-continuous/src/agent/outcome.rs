//! Why a run stops, and what it did.

use profiler_sampling::sampler::SamplingError;

use crate::kubernetes;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Listen(#[from] profiler_export::server::ListenError),
    #[error("starting the {name} exporter: {message}")]
    Exporter { name: &'static str, message: String },
    #[error("kubernetes metadata: {0}")]
    Kubernetes(#[from] kubernetes::WatcherError),
    #[error("[auth]: {0}")]
    Auth(#[from] profiler_export::access::AuthError),
}

/// What a run did, for the final log line.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunSummary {
    pub windows: u64,
    pub profiles: u64,
    /// Exporters that had not delivered everything when the grace period
    /// ended.
    pub exporters_unfinished: usize,
}
