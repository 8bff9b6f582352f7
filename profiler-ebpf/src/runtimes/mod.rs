//! Language runtimes' BPF walkers, one module each (their user-space
//! home is profiler-runtimes, their shared types
//! `profiler_common::runtimes`).

pub mod go;
pub mod hotspot;
pub mod python;
