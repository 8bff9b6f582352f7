//! The BPF programs as the agent loads them: the objects the build script
//! compiles from `profiler-ebpf` (nightly, `bpf-linker`), embedded here so
//! every product that loads one links the same bytes, and the steps every
//! loader shares.
//!
//! - [`OBJECT`]: every program (`profiler-ebpf/src/main.rs`): the
//!   CPU-clock sampler, the off-CPU tracepoints, the probes' programs and
//!   the chain of stack walkers they share; each product loads the
//!   programs it uses ([`chain`] fills the walkers' program arrays);
//! - [`maps`]: the object's maps as typed handles;
//! - [`loading`]: the memlock limit and aya's errors in one line;
//! - [`btf`]: field offsets of the running kernel's structs;
//! - [`stack_budget`]: each program's stack as the verifier adds it up.

pub mod btf;
pub mod chain;
pub mod loading;
pub mod maps;
pub mod stack_budget;

/// The BPF object: every program and map.
#[cfg(feature = "objects")]
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));
