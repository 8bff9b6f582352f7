//! `profiler-agent latency`: time operations between two probes (or a
//! function's entry and return) in the kernel, as bpftrace's `hist()`
//! would, without bpftrace.
//!
//! - [`plan`](mod@plan): specs and options to the uprobes to open, checked first.
//! - [`session`]: load the BPF programs, attach, read the maps.
//! - [`render`]: bpftrace's text, summary lines, Prometheus.

pub mod plan;
pub mod render;
pub mod session;

pub use plan::{
    KeyBy, LatencyOptions, Measure, Plan, PlanError, Role, TraceFilter, TraceOptions, plan,
};
pub use session::{Session, SessionError, Snapshot};
