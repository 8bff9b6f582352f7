//! Off-CPU profiling: where threads wait, and for how long.
//!
//! Two BTF tracepoints (`tp_btf`; kprobes and fentry are not needed):
//!
//! - `sched_switch`, prev side (runs as the thread leaving its CPU, the
//!   only moment its user memory is readable before it runs again):
//!   remembers when and in which state it left (`OffCpuThread`), and walks
//!   its user stack (and reads its Go labels). When that stack differs
//!   from the last one sent for the thread, it goes to the ring buffer as
//!   a `SAMPLE_KIND_OFF_CPU_STACK` record with an id; user space keeps the
//!   last one per thread. A thread that blocks at the same place again
//!   and again (a worker waiting for work) sends its stack once.
//! - `sched_wakeup` (the waker's context): remembers when the thread
//!   became runnable again, to split the interval into blocked time and
//!   run-queue time.
//! - `sched_switch`, next side (the thread about to run again): the
//!   interval is known. Below the minimum it is dropped; below the
//!   sampling period it is kept with probability interval / period and
//!   then stands for one period (`Sample::weight_ns`), so the expected
//!   total per stack is exact (Go's block profile samples the same way).
//!   A kept interval takes its kernel stack from the thread's saved stack
//!   (`bpf_get_task_stack`) and is sent naming its user stack by id
//!   (`Sample::stack_id`); user space joins the two.
//!
//! Why not walk the user stack at the system call's return (`sys_exit`),
//! only for the intervals kept: any program on `sys_exit` puts every
//! system call of every process on the machine on the kernel's slow
//! path. Measured on this project's 6.18 VM, a pipe write+read loop ran
//! 26% slower under such a program (an empty bpftrace one: 30-60%); a Go
//! HTTP server makes 150 system calls per context switch.

/// Kernel task states (`prev_state` of `sched_switch`; include/linux/sched.h).
pub const TASK_RUNNING: u32 = 0;
pub const TASK_INTERRUPTIBLE: u32 = 1;
pub const TASK_UNINTERRUPTIBLE: u32 = 2;

/// `task_struct.flags` bit of kernel threads.
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// A traced thread while it is off its CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuThread {
    /// `bpf_ktime_get_ns()` at the switch-out; 0 once the switch-in used it.
    pub out_ns: u64,
    /// When it was woken (0 or older than `out_ns`: not yet).
    pub wake_ns: u64,
    /// Task state at the switch-out (`TASK_RUNNING` when preempted).
    pub state: u32,
    pub _pad: u32,
    /// Its process (the kernel's tgid).
    pub pid: u32,
    /// The id of the user stack it left its CPU with (0: none sent).
    pub stack_id: u32,
    pub comm: [u8; 16],
    /// Hash of the last user stack sent for it (0: none), and when it was
    /// sent (sent again after `OFF_CPU_STACK_RESEND_NS`, in case user
    /// space lost it).
    pub stack_hash: u64,
    pub stack_sent_ns: u64,
}

/// Traced threads remembered at once (an LRU map: threads that exited
/// make room for new ones).
pub const MAX_OFF_CPU_THREADS: u32 = 32768;

/// A thread's user stack is sent again when the last send is this old,
/// even unchanged: a record user space lost (its queue full) costs at most
/// this long of that thread's intervals.
pub const OFF_CPU_STACK_RESEND_NS: u64 = 1_000_000_000;

/// Globals the loader sets (read-only: the verifier sees constants).
/// Intervals shorter than this many nanoseconds are not recorded.
pub const GLOBAL_OFF_CPU_MIN_NS: &str = "OFF_CPU_MIN_NS";
/// Sampling period in nanoseconds (0: record every interval).
pub const GLOBAL_OFF_CPU_PERIOD_NS: &str = "OFF_CPU_PERIOD_NS";
/// Byte offsets of `task_struct.pid` and `task_struct.flags` in the
/// running kernel, read from its BTF.
pub const GLOBAL_TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
pub const GLOBAL_TASK_FLAGS_OFFSET: &str = "TASK_FLAGS_OFFSET";
