//! profiler-agent: an eBPF sampling profiler.
//!
//! The data flows through one module per stage:
//! `sampling` (BPF perf events → raw samples) → `record` (aggregation per
//! distinct stack, process capture) → `process` (/proc maps, objects) →
//! `unwind` (which address each frame is looked up as) → `symbolize`
//! (addresses → functions) → `profile` (model and encoders: pprof, folded
//! stacks, SVG), with `golabels` (Go pprof labels the sampling program
//! copies from goroutines). `cli` is a thin layer over them. Beside the profile:
//! `probes` (what and where USDT probes and uprobes are) and `latency`
//! (measuring at them: histograms, traces); `continuous` (the `run`
//! agent) and `export` (its exporters and listener).
//!
//! `process` and `symbolize` are the profiler-symbolize crate (no BPF, no
//! agent), `unwind`'s tables come from profiler-unwind; `probes`,
//! `profile` and `export` are the profiler-probes, profiler-profile and
//! profiler-export crates: re-exported here under the names the stages
//! above use.

mod bpf_loading;
pub mod cli;
pub mod continuous;
pub mod golabels;
pub mod latency;
pub mod record;
pub mod sampling;
pub mod unwind;

pub use profiler_export as export;
pub use profiler_probes as probes;
pub use profiler_profile as profile;
pub use profiler_symbolize as symbolize;
pub use profiler_symbolize::process;

#[cfg(test)]
mod hostile_binaries;
