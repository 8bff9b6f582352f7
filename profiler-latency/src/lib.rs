//! Measurement at probes (where `probes` says what and where they are):
//! `profiler-agent latency` times operations between two probes (or a
//! function's entry and return) in the kernel, as bpftrace's `hist()`
//! would, without bpftrace; `profiler-agent trace` prints each hit.
//!
//! - [`plan`](mod@plan): specs and options to the uprobes to open, checked first.
//! - [`session`]: load the BPF programs, attach, read the maps and the
//!   trace ring buffer.
//! - [`render`]: bpftrace's text, summary lines, Prometheus.
//! - [`histogram`]: bpftrace's log2/linear buckets, its text output, and
//!   Prometheus exposition.
//! - [`breaker`]: the budget of hits per second that detaches a probe
//!   costing its process too much.

pub mod breaker;
mod errors;
pub mod histogram;
pub mod plan;
pub mod render;
pub mod session;
pub mod stacks;

pub use errors::SessionError;
pub use plan::{
    KeyBy, LatencyOptions, Measure, Plan, PlanError, Role, TraceFilter, TraceOptions, plan,
};
pub use session::{Session, Snapshot};
