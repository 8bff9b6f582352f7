//! The CPU profile pipeline every product shares, in the order samples
//! flow through it:
//!
//! - [`sampler`]: the BPF sampling program on a CPU-clock perf event on
//!   every CPU (and the off-CPU tracepoints), its pid filter, and the
//!   thread that empties its ring buffer;
//! - [`tables`]: the unwind tables (built by profiler-unwind and the
//!   runtimes) loaded into the BPF walker's arrays, once per node, within
//!   a memory bound;
//! - [`record`]: samples aggregated per distinct stack of each thread, the
//!   processes captured as they are first seen, and the recording turned
//!   into a symbolized `profiler_profile::Profile`.
//!
//! The one-shot `record` command, the probes' stacks (profiler-latency)
//! and the continuous agent (profiler-continuous) are built on it.

pub mod record;
pub mod sampler;
pub mod tables;
