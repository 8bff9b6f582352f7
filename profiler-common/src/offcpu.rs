//! Off-CPU profiling: where threads wait, and for how long.
//!
//! Three BTF tracepoints (`tp_btf`; kprobes and fentry are not needed):
//!
//! - `sched_switch`, prev side (runs as the thread leaving its CPU):
//!   remembers when and in which state it left (`OffCpuThread`). Nothing
//!   else for a thread blocked in a system call or a kernel thread. A user
//!   thread that left from user mode or an exception (preempted while
//!   running, or blocked in a page fault) has its stacks walked right
//!   there, the only moment its user memory is readable before it runs
//!   again; they wait in the pending map.
//! - `sched_wakeup` (the waker's context): remembers when the thread
//!   became runnable again, to split the interval into blocked time and
//!   run-queue time.
//! - `sched_switch`, next side (the thread about to run again): the
//!   interval is known. Below the minimum it is dropped; below the
//!   sampling period it is kept with probability interval / period and
//!   then stands for one period (`Sample::weight_ns`), so the expected
//!   total per stack is exact while the stack walks per second stay
//!   bounded by the blocked time per second over the period (Go's block
//!   profile samples the same way). A kept interval takes its kernel
//!   stack from the thread's saved stack (`bpf_get_task_stack`).
//! - `sys_exit` (the thread itself, returning from the system call it
//!   blocked in, its user stack as it was when it blocked): the user stack
//!   is walked, and the record completed and sent. So a thread that blocks
//!   and wakes 100,000 times a second costs a map lookup and a random
//!   draw per switch, not a stack walk.

/// Kernel task states (`prev_state` of `sched_switch`; include/linux/sched.h).
pub const TASK_RUNNING: u32 = 0;
pub const TASK_INTERRUPTIBLE: u32 = 1;
pub const TASK_UNINTERRUPTIBLE: u32 = 2;

/// `task_struct.flags` bit of kernel threads.
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// `OffCpuThread::flags`: it left its CPU inside a system call (its user
/// stack is walked when the call returns).
pub const THREAD_IN_SYSCALL: u32 = 1 << 0;
/// `OffCpuThread::flags`: a kernel thread (no user stack).
pub const THREAD_KERNEL: u32 = 1 << 1;
/// `OffCpuThread::flags`: its stacks were walked at the switch-out and
/// wait in the pending map.
pub const THREAD_STACK_PENDING: u32 = 1 << 2;

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
    /// `THREAD_*`.
    pub flags: u32,
    /// Its process (the kernel's tgid).
    pub pid: u32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

/// Traced threads remembered at once (an LRU map: threads that exited
/// make room for new ones).
pub const MAX_OFF_CPU_THREADS: u32 = 32768;

/// Records waiting for their thread to run again (stacks walked at the
/// switch-out) or to return from its system call, per CPU of the machine
/// (the loader multiplies; the map's LRU lists are per CPU, so this is
/// each CPU's share: a run queue this long of traced threads preempted in
/// user mode), and the floor.
pub const OFF_CPU_PENDING_PER_CPU: u32 = 32;
pub const MIN_OFF_CPU_PENDING: u32 = 256;

/// Globals the loader sets (read-only: the verifier sees constants).
/// Intervals shorter than this many nanoseconds are not recorded.
pub const GLOBAL_OFF_CPU_MIN_NS: &str = "OFF_CPU_MIN_NS";
/// Sampling period in nanoseconds (0: record every interval).
pub const GLOBAL_OFF_CPU_PERIOD_NS: &str = "OFF_CPU_PERIOD_NS";
/// Byte offsets of `task_struct.pid` and `task_struct.flags` in the
/// running kernel, read from its BTF.
pub const GLOBAL_TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
pub const GLOBAL_TASK_FLAGS_OFFSET: &str = "TASK_FLAGS_OFFSET";
