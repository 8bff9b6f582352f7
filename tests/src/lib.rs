//! Helpers for the end-to-end tests, one module per concern: the agent
//! under test (`agent`), the programs started and stopped (`processes`),
//! fixtures built from source (`fixtures`, `go`), reading what the agent
//! wrote (`profiles`, `pprof_raw`, `windows`), the continuous agent's
//! endpoints (`http`) and a proxy counting its clients' connections
//! (`tcp_proxy`), the tools compared against (`perf`, the `arm64`
//! guest), and how far a sampled share may stray by chance (`shares`).
//!
//! These tests load real BPF programs. Without root (or CAP_BPF and
//! CAP_PERFMON) they fail with the reason; they never skip.

pub mod agent;
pub mod arm64;
pub mod fixtures;
pub mod go;
pub mod go_state;
pub mod http;
pub mod java;
pub mod perf;
pub mod pprof_raw;
pub mod processes;
pub mod profiles;
pub mod shares;
pub mod tcp_proxy;
pub mod windows;
