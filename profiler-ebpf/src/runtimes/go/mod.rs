//! Go in the BPF programs (its user-space home is profiler-runtimes'
//! `go`): the walker's steps through the runtime's stack switches, and the
//! running goroutine's pprof labels.

pub mod labels;
pub mod stacks;
