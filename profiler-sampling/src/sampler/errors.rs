//! What can go wrong while loading and attaching the sampler, in words a
//! user can act on.

use aya::EbpfError;

use aya::maps::MapError;
use aya::programs::ProgramError;
use profiler_bpf::loading::error_chain;

#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    #[error(
        "profiling needs root, or the capabilities CAP_BPF and CAP_PERFMON \
         (for example `sudo setcap cap_bpf,cap_perfmon+ep $(which profiler-agent)`); \
         this process has {have} (kernel.perf_event_paranoid = {paranoid})"
    )]
    Privileges { have: String, paranoid: String },

    #[error("starting the ring-buffer reader thread: {0}")]
    Reader(std::io::Error),

    #[error("--frequency must be at least 1 Hz (got {0})")]
    BadFrequency(u64),

    #[error("--pid was given {given} times; the in-kernel filter holds at most {max} pids")]
    TooManyPids { given: usize, max: usize },

    #[error("the kernel refused to load the BPF object: {0}{hint}", hint = permission_hint(.1))]
    Load(String, bool),

    #[error("the kernel refused the BPF program `sample_stack`: {0}{hint}", hint = permission_hint(.1))]
    Program(String, bool),

    #[error(
        "could not open a CPU-clock perf event on CPU {cpu}: {source} \
         (perf events must be enabled in the kernel; check kernel.perf_event_paranoid \
         and that no seccomp profile blocks perf_event_open)"
    )]
    Attach {
        cpu: u32,
        #[source]
        source: ProgramError,
    },

    #[error("BPF map {0}: {1}")]
    Map(&'static str, #[source] MapError),

    #[error(transparent)]
    MapTake(#[from] profiler_bpf::maps::MapTakeError),

    #[error("unwind tables: {0}")]
    UnwindArray(#[from] crate::tables::ArrayError),

    #[error("starting the unwind-table thread: {0}")]
    UnwindThread(std::io::Error),

    #[error("the runtimes' walkers: {0}")]
    Runtimes(#[from] profiler_runtimes::RuntimeError),

    #[error("the stack walk's chain of programs: {0}")]
    Chain(profiler_bpf::chain::ChainError),

    #[error(
        "the embedded BPF object has no program {0} (a build problem: run `cargo xtask setup`)"
    )]
    MissingProgram(&'static str),

    #[error(
        "off-CPU profiling needs the kernel's BTF type information \
         (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF=y): {0}"
    )]
    OffCpuBtf(String),

    #[error(
        "the kernel refused the off-CPU program on the `{tracepoint}` tracepoint: {message} \
         (off-CPU profiling needs BTF tracepoints, Linux 5.5 or later with \
         CONFIG_DEBUG_INFO_BTF=y){hint}",
        hint = permission_hint(.permission_denied)
    )]
    OffCpuProgram {
        tracepoint: &'static str,
        message: String,
        permission_denied: bool,
    },

    #[error("--off-cpu-period must be shorter than an hour (got {0:?})")]
    OffCpuPeriod(std::time::Duration),

    #[error("could not list online CPUs from {0}: {1}")]
    OnlineCpus(&'static str, #[source] std::io::Error),
}

fn permission_hint(permission_denied: &bool) -> &'static str {
    if *permission_denied {
        " — permission denied: run as root, or grant CAP_BPF and CAP_PERFMON"
    } else {
        ""
    }
}

fn is_permission_error(text: &str) -> bool {
    text.contains("Operation not permitted") || text.contains("Permission denied")
}

impl SamplingError {
    pub(super) fn load(error: EbpfError) -> Self {
        let text = error_chain(&error);
        let denied = is_permission_error(&text);
        SamplingError::Load(text, denied)
    }

    pub(super) fn program(error: ProgramError) -> Self {
        let text = error_chain(&error);
        let denied = is_permission_error(&text);
        SamplingError::Program(text, denied)
    }
}
