//! Go in the BPF programs (its user-space home is profiler-runtimes'
//! `go`): the walker's steps through the runtime's stack switches, and the
//! running goroutine's pprof labels.

pub mod labels;
pub mod stacks;

/// The register Go code keeps its current goroutine in
/// (`UserRegs::callee`: R14 on amd64, X28 on arm64; ABIInternal, Go
/// 1.17+): a g only when the interrupted code was Go's.
pub(crate) const G_REGISTER: usize = if cfg!(bpf_target_arch = "aarch64") {
    3
} else {
    2
};
