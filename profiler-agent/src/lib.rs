//! profiler-agent: the command line over the products' crates. It parses,
//! calls a library, and prints; no profiling logic lives here.
//!
//! - `record` (the default command): profiler-sampling's recording,
//!   written as pprof, folded stacks or SVG (profiler-profile);
//! - `latency`, `trace`: profiler-latency;
//! - `run`: profiler-continuous;
//! - `probes list`, `symbolize`, `tables`: what profiler-probes,
//!   profiler-symbolize and profiler-unwind see in a binary.
//!
//! The map of every crate is docs/architecture.md.

pub mod cli;
