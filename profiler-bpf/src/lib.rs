//! The BPF programs as the agent loads them: the objects the build script
//! compiles from `profiler-ebpf` (nightly, `bpf-linker`), embedded here so
//! every product that loads one links the same bytes, and the steps every
//! loader shares.
//!
//! - [`SAMPLING_OBJECT`]: the CPU-clock sampler and the off-CPU programs
//!   (`profiler-ebpf/src/main.rs`);
//! - [`LATENCY_OBJECT`]: the probes' programs (`profiler-ebpf/src/latency`);
//! - [`loading`]: the memlock limit and aya's errors in one line;
//! - [`btf`]: field offsets of the running kernel's structs;
//! - [`stack_budget`]: each program's stack as the verifier adds it up.

pub mod btf;
pub mod loading;
pub mod stack_budget;

/// The sampling object: `sample_stack` and the off-CPU tracepoints.
#[cfg(feature = "objects")]
pub static SAMPLING_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

/// The latency object: start/end probes, counts, traces, stacks at hits.
#[cfg(feature = "objects")]
pub static LATENCY_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/latency"));
