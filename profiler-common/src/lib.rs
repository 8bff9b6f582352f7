//! Types shared by the BPF programs (`profiler-ebpf`) and the agent.
//!
//! Everything here is `#[repr(C)]` plain data: the BPF side writes it into
//! maps and the ring buffer, the agent reads the same bytes back. With the
//! `user` feature the types implement `aya::Pod` so aya's typed maps accept
//! them.
#![no_std]

/// Deepest stack the kernel walks for one sample. It matches the kernel's
/// default `kernel.perf_event_max_stack` (127): asking for more makes
/// `bpf_get_stack` fail with -EFAULT on kernels that keep the default.
pub const MAX_STACK_DEPTH: usize = 127;

/// Size of the sample ring buffer. 4 MiB holds about 1,900 samples: at
/// 100 Hz on 64 CPUs that is 300 ms of slack for a drain loop that wakes
/// every 50 ms.
pub const RING_BUFFER_BYTES: u32 = 4 << 20;

/// Most pids `--pid` may name at once (entries of the in-kernel filter).
pub const MAX_PID_FILTER: u32 = 1024;

/// One stack sample, written by the BPF program into the ring buffer.
///
/// Stacks are arrays of program counters, leaf first, as `bpf_get_stack`
/// returns them; `*_frames` says how many entries are valid.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Sample {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub time_ns: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    pub cpu: u32,
    /// Bit set of `SAMPLE_FLAG_*`.
    pub flags: u32,
    pub user_frames: u32,
    pub kernel_frames: u32,
    /// The task's user-space registers at the sample, taken from the
    /// task's saved pt_regs when the sample interrupted the kernel. The
    /// unwinder needs them to repair frame-pointer walks.
    pub user_regs: UserRegs,
    /// Thread name (`task->comm`), NUL-padded.
    pub comm: [u8; 16],
    pub user_stack: [u64; MAX_STACK_DEPTH],
    pub kernel_stack: [u64; MAX_STACK_DEPTH],
}

/// The sample interrupted kernel code (the kernel stack is non-empty).
pub const SAMPLE_FLAG_IN_KERNEL: u32 = 1 << 0;
/// `bpf_get_stack` failed for the user stack.
pub const SAMPLE_FLAG_USER_STACK_FAILED: u32 = 1 << 1;
/// `bpf_get_stack` failed for the kernel stack.
pub const SAMPLE_FLAG_KERNEL_STACK_FAILED: u32 = 1 << 2;
/// The task is a kernel thread: it has no user stack.
pub const SAMPLE_FLAG_KERNEL_THREAD: u32 = 1 << 3;

/// User-space registers an unwinder starts from. On x86_64 `fp` is RBP and
/// `lr` is 0; on arm64 `fp` is X29 and `lr` is X30.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct UserRegs {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
}

/// Indices into the per-CPU `COUNTERS` array: what happened to every
/// sample the perf event delivered. The agent sums them over CPUs and
/// reports them at the end of a run.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// The perf event fired and the program ran.
    Fired = 0,
    /// The sample hit the idle task (pid 0) and was not recorded.
    Idle = 1,
    /// The sample belonged to a process outside the `--pid` filter.
    FilteredOut = 2,
    /// The sample was written to the ring buffer.
    Sent = 3,
    /// The ring buffer was full: the sample was lost.
    RingBufferFull = 4,
    /// `bpf_get_stack` failed for the user stack (sample still sent).
    UserStackFailed = 5,
    /// `bpf_get_stack` failed for the kernel stack (sample still sent).
    KernelStackFailed = 6,
}

/// Number of `Counter` slots.
pub const COUNTER_SLOTS: u32 = 8;

impl Counter {
    pub const ALL: [Counter; 7] = [
        Counter::Fired,
        Counter::Idle,
        Counter::FilteredOut,
        Counter::Sent,
        Counter::RingBufferFull,
        Counter::UserStackFailed,
        Counter::KernelStackFailed,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Counter::Fired => "fired",
            Counter::Idle => "idle",
            Counter::FilteredOut => "filtered_out",
            Counter::Sent => "sent",
            Counter::RingBufferFull => "ring_buffer_full",
            Counter::UserStackFailed => "user_stack_failed",
            Counter::KernelStackFailed => "kernel_stack_failed",
        }
    }
}

/// Name of the read-only global that switches the in-kernel pid filter on.
/// The loader sets it (`EbpfLoader::set_global`) before loading, so the
/// verifier sees a constant and prunes the filter when it is off.
pub const GLOBAL_FILTER_PIDS: &str = "FILTER_PIDS";

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data with no padding-sensitive invariants;
    // any bit pattern is a valid value.
    unsafe impl aya::Pod for super::Sample {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UserRegs {}
}
