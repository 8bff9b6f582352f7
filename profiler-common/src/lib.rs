//! Types shared by the BPF programs (`profiler-ebpf`) and the agent.
//!
//! Everything here is `#[repr(C)]` plain data: the BPF side writes it into
//! maps and the ring buffer, the agent reads the same bytes back. With the
//! `user` feature the types implement `aya::Pod` so aya's typed maps accept
//! them.
#![no_std]

pub mod latency;

/// Deepest kernel stack for one sample. It matches the kernel's default
/// `kernel.perf_event_max_stack` (127): asking `bpf_get_stack` for more
/// fails with -EFAULT on kernels that keep the default.
pub const MAX_STACK_DEPTH: usize = 127;

/// Deepest user stack our own unwinder walks (the kernel's walk stops at
/// 127; deep recursion needs more). Each frame costs two user-memory
/// reads, so the bound is also a cost bound.
pub const MAX_USER_FRAMES: usize = 1024;

/// Size of the sample ring buffer. Records are variable-length (a typical
/// stack of 30 frames is about 1.3 KiB): 8 MiB holds some 6,000 of them,
/// about a second of 64 busy CPUs at 100 Hz for a drain loop that wakes
/// every 100 ms.
pub const RING_BUFFER_BYTES: u32 = 8 << 20;

/// Most pids `--pid` may name at once (entries of the in-kernel filter).
pub const MAX_PID_FILTER: u32 = 1024;

/// One stack sample, written by the BPF program into the ring buffer.
///
/// Stacks are arrays of program counters, leaf first; `*_frames` says how
/// many entries are valid. The ring-buffer record is cut after the last
/// valid user frame (`Sample::record_len`), so `user_stack` comes last.
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
    pub kernel_stack: [u64; MAX_STACK_DEPTH],
    pub user_stack: [u64; MAX_USER_FRAMES],
}

impl Sample {
    /// Bytes before `user_stack`.
    pub const HEADER_LEN: usize = core::mem::offset_of!(Sample, user_stack);

    /// Length of a record holding `user_frames` user frames.
    pub const fn record_len(user_frames: usize) -> usize {
        Self::HEADER_LEN + 8 * user_frames
    }
}

/// The sample interrupted kernel code (the kernel stack is non-empty).
pub const SAMPLE_FLAG_IN_KERNEL: u32 = 1 << 0;
/// The user stack walk stopped on a failed read of user memory.
pub const SAMPLE_FLAG_USER_STACK_FAILED: u32 = 1 << 1;
/// `bpf_get_stack` failed for the kernel stack.
pub const SAMPLE_FLAG_KERNEL_STACK_FAILED: u32 = 1 << 2;
/// The user stack walk stopped at `MAX_USER_FRAMES`.
pub const SAMPLE_FLAG_USER_STACK_TRUNCATED: u32 = 1 << 3;
/// The user stack walk ended at a frame an unwind table marks as a root
/// (e.g. Go's `runtime.goexit`).
pub const SAMPLE_FLAG_USER_STACK_AT_ROOT: u32 = 1 << 4;

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
    /// A user-memory read failed during the user stack walk (sample still
    /// sent with the frames found so far).
    UserStackFailed = 5,
    /// `bpf_get_stack` failed for the kernel stack (sample still sent).
    KernelStackFailed = 6,
    /// The user stack walk hit `MAX_USER_FRAMES`.
    UserStackTruncated = 7,
    /// User frames unwound with a table row (not frame pointers).
    FramesFromTables = 8,
}

/// Number of `Counter` slots.
pub const COUNTER_SLOTS: u32 = 16;

impl Counter {
    pub const ALL: [Counter; 9] = [
        Counter::Fired,
        Counter::Idle,
        Counter::FilteredOut,
        Counter::Sent,
        Counter::RingBufferFull,
        Counter::UserStackFailed,
        Counter::KernelStackFailed,
        Counter::UserStackTruncated,
        Counter::FramesFromTables,
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
            Counter::UserStackTruncated => "user_stack_truncated",
            Counter::FramesFromTables => "frames_from_tables",
        }
    }
}

/// One row of an unwind table: from `pc` (an offset from the table's base
/// address) up to the next row's `pc`, how to find the caller's frame.
///
/// x86_64 rules (the return address is always at CFA - 8):
/// `CFA = (flags & UNWIND_CFA_FP ? FP : SP) + cfa_offset`; the caller's
/// frame pointer is at `CFA + fp_offset` when `fp_offset != 0`, else FP
/// is unchanged. Rows come from Go's pcsp tables today and are meant to
/// come from `.eh_frame` CFI next.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    pub cfa_offset: i32,
    pub fp_offset: i16,
    pub flags: u16,
}

/// CFA is relative to the frame pointer instead of the stack pointer.
pub const UNWIND_CFA_FP: u16 = 1 << 0;
/// This frame is a root (or switches stacks): emit it and stop.
pub const UNWIND_STOP: u16 = 1 << 1;
/// No rule here (a gap between functions): walk frame pointers.
pub const UNWIND_FRAME_POINTER: u16 = 1 << 2;
/// With `UNWIND_STOP`: the frame is a genuine root of a stack (Go's
/// `runtime.goexit`, `runtime.mstart`), not just a place we cannot pass.
pub const UNWIND_ROOT: u16 = 1 << 3;

/// Rows of all unwind tables together (one BPF array).
pub const MAX_UNWIND_ROWS: u32 = 1 << 20;

/// Most mappings with unwind tables one process can have.
pub const MAX_UNWIND_MAPPINGS: usize = 8;

/// Most processes with unwind tables at once.
pub const MAX_UNWIND_PROCESSES: u32 = 8192;

/// A mapping of a process whose code has an unwind table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    /// Runtime address range the table covers.
    pub start: u64,
    pub end: u64,
    /// Runtime address of the table's base: row pc = address - base.
    pub base: u64,
    /// First row in the global row array, and how many rows.
    pub first_row: u32,
    pub row_count: u32,
}

/// Unwind tables of one process (value of the per-pid map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessUnwind {
    pub count: u32,
    pub _pad: u32,
    pub mappings: [UnwindMapping; MAX_UNWIND_MAPPINGS],
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
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindRow {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcessUnwind {}
    // SAFETY: as above (latency types: integers and byte arrays).
    unsafe impl aya::Pod for super::latency::LatencyConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::SiteConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::HistKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::latency::HistValue {}
}
