//! Continuous profiling (`profiler-agent run`): the whole node (or a pid
//! selection) sampled without end, cut into windows, one labelled pprof per
//! service per window handed to the exporters (`profiler_export`), pulls
//! served on `/debug/pprof/profile` (and `/debug/pprof/wall`,
//! `/debug/pprof/heap`), health on `/metrics`.
//!
//! - `config`: the TOML file; `settings`: each of its keys as a flag and
//!   an environment variable, from one definition;
//! - `agent`: the run loop (windows, pulls, shutdown);
//! - `wall`: which counted stacks the CPU and wall-clock profiles show;
//! - `heaps`: Go services' heap profiles per window;
//! - `metadata`: service name and container of each process;
//! - `kubernetes`: pod, namespace and container names from the API server;
//! - `probes`: latency histograms of configured probes for `/metrics`.

pub mod agent;
pub mod config;
pub mod heaps;
pub mod kubernetes;
pub mod metadata;
pub mod probes;
pub mod settings;
pub mod wall;

pub use agent::{Agent, RunError, RunSummary};
pub use config::{Config, ConfigError, LogFormat};
