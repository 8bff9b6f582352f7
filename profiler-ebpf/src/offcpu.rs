//! Off-CPU profiling on the scheduler's tracepoints: how long each traced
//! thread was off its CPU, split into blocked and run-queue time, with its
//! stacks. The design (which tracepoint does what, and why the user stack
//! is walked at the system call's return) is in `profiler_common::offcpu`.
//!
//! A Go thread's record also gets its goroutine's pprof labels (as CPU
//! samples do), read where its user stack is walked: at the switch-out of
//! a thread preempted in user mode, and at a system call's return. A
//! goroutine blocked in a system call (file I/O, cgo, a blocking read)
//! stays its thread's `curg`, so that time carries its labels; one parked
//! by the Go scheduler (channels, timers, the netpoller) has left its
//! thread, whose wait in the scheduler is unlabelled.

use aya_ebpf::{
    EbpfContext,
    bindings::task_struct,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_get_stack,
        bpf_get_task_stack, bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, map},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use profiler_common::offcpu::{
    MAX_OFF_CPU_THREADS, MIN_OFF_CPU_PENDING, OffCpuThread, PF_KTHREAD, TASK_RUNNING,
    THREAD_IN_SYSCALL, THREAD_KERNEL, THREAD_STACK_PENDING,
};
use profiler_common::{
    Counter, MAX_SAMPLE_FRAMES, MAX_STACK_DEPTH, SAMPLE_FLAG_GO_LABELS, SAMPLE_FLAG_IN_KERNEL,
    SAMPLE_FLAG_KERNEL_STACK_FAILED, SAMPLE_FLAG_UNKNOWN_MAPPING, SAMPLE_KIND_OFF_CPU, Sample,
    UserRegs,
    runtimes::go::{GoLabels, MAX_GO_LABELS},
};

use crate::{KERNEL_STACK_BYTES, bump, machine, runtimes, send, traced, unwind};

/// Intervals shorter than this are not recorded (set by the loader).
#[unsafe(no_mangle)]
static OFF_CPU_MIN_NS: u64 = 1_000;

/// Sampling period of off-CPU time; 0 records every interval.
#[unsafe(no_mangle)]
static OFF_CPU_PERIOD_NS: u64 = 0;

/// Where `task_struct.pid` and `.flags` are in this kernel (from its BTF).
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_FLAGS_OFFSET: u32 = 0;

/// A pending record this old at a system call's return is not that call's.
const STALE_NS: u64 = 10_000_000_000;

/// Traced threads that are off their CPU, by thread id.
#[map]
static OFF_CPU_THREADS: LruHashMap<u32, OffCpuThread> =
    LruHashMap::with_max_entries(MAX_OFF_CPU_THREADS, 0);

/// Records waiting for their thread: stacks walked at the switch-out
/// (until the switch-in gives the interval), or an interval with its
/// kernel stack (until the system call returns and the user stack is
/// walked). Sized by the loader from the number of CPUs.
///
/// Per-CPU LRU lists (`BPF_F_NO_COMMON_LRU`): with the common list, a CPU
/// whose local free list runs dry refills it 128 nodes at a time and,
/// when fewer are free globally, evicts the oldest entries — live records,
/// in a map of a few hundred entries that is far from full. Per CPU, an
/// entry is only evicted by that CPU's own inserts once its share is in
/// use (by threads that died inside a system call and never came back for
/// their record).
#[map]
static OFF_CPU_PENDING: LruHashMap<u32, Sample> =
    LruHashMap::with_max_entries(MIN_OFF_CPU_PENDING, BPF_F_NO_COMMON_LRU);

/// `BPF_F_NO_COMMON_LRU` of the kernel's UAPI.
const BPF_F_NO_COMMON_LRU: u32 = 1 << 1;

/// Records in `OFF_CPU_PENDING` waiting for a system call's return: while
/// there are none (most of the time, with sampling), `sys_exit` costs one
/// array read instead of a hash lookup. A record evicted from the LRU map
/// keeps the count above zero: the lookups then happen, nothing is lost.
#[map]
static PENDING_SYSCALLS: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
fn count_pending(delta: i64) {
    if let Some(count) = PENDING_SYSCALLS.get_ptr_mut(0) {
        // SAFETY: an 8-byte aligned map value. The BPF target has no
        // compare-and-swap, so core's atomic types lack fetch_add; the
        // intrinsic, its result unused, is BPF's atomic add (XADD).
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                count,
                delta as u64,
            );
        }
    }
}

/// Where a pending record is assembled (the perf-event program has its
/// own: it can interrupt `sys_exit`, never the scheduler's tracepoints,
/// which run with interrupts off).
#[map]
static OFF_CPU_SCRATCH: PerCpuArray<Sample> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn global<T: Copy>(value: &T) -> T {
    // SAFETY: reading a read-only global the loader initialised.
    unsafe { core::ptr::read_volatile(value) }
}

/// A field of a task the tracepoint handed us. A BTF tracepoint's task
/// pointers are typed for the verifier, which checks a direct load against
/// the kernel's `task_struct` (the offset is a constant to it: a read-only
/// global) and turns a fault into a zero: far cheaper than a probe read,
/// on the hottest path of off-CPU profiling.
#[inline(always)]
fn task_field<T: Copy>(task: *const u8, offset: u32) -> T {
    // SAFETY: see above; the verifier rejects the program rather than let
    // an out-of-bounds load through.
    unsafe { core::ptr::read_volatile(task.add(offset as usize).cast::<T>()) }
}

/// `sched_switch(preempt, prev, next, prev_state)`, run as `prev`.
#[btf_tracepoint(function = "sched_switch")]
pub fn off_cpu_switch(ctx: BtfTracePointContext) -> u32 {
    let preempt: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let next: *mut task_struct = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    // SAFETY: a monotonic clock read.
    let now = unsafe { bpf_ktime_get_ns() };
    switched_out(&ctx, prev, preempt as u8 != 0, prev_state as u32, now);
    switched_in(next, now);
    0
}

/// `sched_wakeup(p)`: `p` is runnable again.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn off_cpu_wakeup(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    let tid: u32 = task_field(task, global(&TASK_PID_OFFSET));
    if let Some(thread) = OFF_CPU_THREADS.get_ptr_mut(&tid) {
        // SAFETY: a map value; a racing update at worst moves the wakeup.
        unsafe {
            if (*thread).out_ns != 0 && (*thread).wake_ns < (*thread).out_ns {
                (*thread).wake_ns = bpf_ktime_get_ns();
            }
        }
    }
    0
}

/// `sys_exit(regs, ret)`, run as the thread returning from a system call:
/// if it blocked in it and the interval was kept, its user stack now is
/// the one it blocked with.
#[btf_tracepoint(function = "sys_exit")]
pub fn off_cpu_syscall_exit(_ctx: BtfTracePointContext) -> u32 {
    // SAFETY: a plain read; a stale value only costs or saves one lookup.
    let waiting = PENDING_SYSCALLS
        .get_ptr(0)
        .map_or(0, |count| unsafe { core::ptr::read_volatile(count) });
    if waiting == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(record) = OFF_CPU_PENDING.get_ptr_mut(&tid) else {
        return 0;
    };
    let pid = (pid_tgid >> 32) as u32;
    // SAFETY: the map value is ours until removed below (the thread is
    // running here, so no other program touches its entry).
    unsafe {
        if (*record).intervals == 0 || (*record).tid != tid {
            return 0;
        }
        // A record older than any system call's return after its wakeup
        // was left by a thread that exited in the call (its id now reused).
        if bpf_ktime_get_ns().saturating_sub((*record).time_ns) > STALE_NS {
            let _ = OFF_CPU_PENDING.remove(&tid);
            count_pending(-1);
            return 0;
        }
        let kernel_frames = ((*record).kernel_frames as u32).min(MAX_STACK_DEPTH as u32);
        let saved = machine::saved_user();
        let walk = unwind::walk_user_stack(
            unwind::WALK_SYSCALL,
            pid,
            &saved.regs,
            saved.in_system_call,
            record,
            kernel_frames,
        );
        (*record).pid = pid;
        (*record).comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
        (*record).user_frames = walk.frames as u16;
        (*record).user_end = walk.end as u8;
        if walk.unknown_leaf {
            (*record).flags |= SAMPLE_FLAG_UNKNOWN_MAPPING;
        }
        append_go_labels(record, pid, &saved.regs, kernel_frames + walk.frames);
        emit(record, kernel_frames + walk.frames, walk.unknown_leaf);
        let _ = OFF_CPU_PENDING.remove(&tid);
        count_pending(-1);
    }
    0
}

/// The current thread (`prev`) leaves its CPU.
#[inline(always)]
fn switched_out(
    ctx: &BtfTracePointContext,
    prev: *const u8,
    preempt: bool,
    prev_state: u32,
    now: u64,
) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if pid == 0 || !traced(pid) {
        return;
    }
    bump(Counter::OffCpuSwitches);
    let task_flags: u32 = task_field(prev, global(&TASK_FLAGS_OFFSET));
    let state = if preempt { TASK_RUNNING } else { prev_state };
    let mut comm = [0u8; 16];
    let flags = if task_flags & PF_KTHREAD != 0 {
        // Its record is made at the switch-in, by another task: keep the
        // name now.
        comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
        THREAD_KERNEL
    } else {
        let saved = machine::saved_user();
        if saved.in_system_call {
            THREAD_IN_SYSCALL
        } else if walk_now(ctx, &saved.regs, pid, tid, state) {
            // Preempted in user mode, or blocked in a page fault: the user
            // stack is readable only now.
            THREAD_STACK_PENDING
        } else {
            0
        }
    };
    // Most switches are of threads seen before: update their entry in
    // place (an LRU insert allocates and links a node, several times the
    // cost of a lookup).
    if let Some(entry) = OFF_CPU_THREADS.get_ptr_mut(&tid) {
        // SAFETY: the entry of the current thread, which only its own
        // switches and its wakeup touch.
        unsafe {
            if (*entry).out_ns != 0 {
                // Switched out twice with no switch-in seen between (it
                // happens, rarely, on 6.18): that interval's end is
                // unknown, so it is lost, and the stacks walked for it
                // must not be taken for this one's.
                bump(Counter::OffCpuLost);
                if (*entry).flags & THREAD_STACK_PENDING != 0 && flags & THREAD_STACK_PENDING == 0 {
                    let _ = OFF_CPU_PENDING.remove(&tid);
                }
            }
            (*entry).out_ns = now;
            (*entry).wake_ns = 0;
            (*entry).state = state;
            (*entry).flags = flags;
            (*entry).pid = pid;
            (*entry).comm = comm;
        }
    } else {
        let thread = OffCpuThread {
            out_ns: now,
            wake_ns: 0,
            state,
            flags,
            pid,
            _pad: 0,
            comm,
        };
        let _ = OFF_CPU_THREADS.insert(&tid, &thread, 0);
    }
}

/// Walks both stacks of the current thread into the pending map. False
/// when there is no room (the interval is then lost, and counted).
#[inline(always)]
fn walk_now(
    ctx: &BtfTracePointContext,
    regs: &profiler_common::UserRegs,
    pid: u32,
    tid: u32,
    state: u32,
) -> bool {
    let Some(record) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's scratch record, ours for the program's run; a
    // pending record of the current thread, which no other program touches
    // while it runs.
    unsafe {
        if let Some(old) = OFF_CPU_PENDING.get_ptr(&tid)
            && awaits_syscall_exit(old)
        {
            // Its system call returned without sys_exit taking it (the
            // thread was preempted on the way out, after sys_exit ran):
            // send its time with the kernel stack it has rather than
            // overwrite it.
            emit(old, (*old).kernel_frames as u32, false);
            count_pending(-1);
        }
        let mut flags = 0u16;
        let kernel = bpf_get_stack(
            ctx.as_ptr(),
            (*record).frames.as_mut_ptr().cast(),
            KERNEL_STACK_BYTES,
            0,
        );
        let kernel_frames = if kernel < 0 {
            flags |= SAMPLE_FLAG_KERNEL_STACK_FAILED;
            0
        } else {
            ((kernel as u32) / 8).min(MAX_STACK_DEPTH as u32)
        };
        if kernel_frames > 0 {
            flags |= SAMPLE_FLAG_IN_KERNEL;
        }
        let walk =
            // Never inside a system call here (those walk at its return).
            unwind::walk_user_stack(unwind::WALK_SCHEDULER, pid, regs, false, record, kernel_frames);
        if walk.unknown_leaf {
            flags |= SAMPLE_FLAG_UNKNOWN_MAPPING;
        }
        init_header(record, pid, tid, state);
        (*record).comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
        (*record).kernel_frames = kernel_frames as u16;
        (*record).user_frames = walk.frames as u16;
        (*record).user_end = walk.end as u8;
        (*record).flags = flags;
        append_go_labels(record, pid, regs, kernel_frames + walk.frames);
        if OFF_CPU_PENDING.insert(&tid, &*record, 0).is_err() {
            bump(Counter::OffCpuLost);
            return false;
        }
    }
    true
}

/// Thread `next` is about to run again: the interval is over.
#[inline(always)]
fn switched_in(next: *mut task_struct, now: u64) {
    let tid: u32 = task_field(next as *const u8, global(&TASK_PID_OFFSET));
    if tid == 0 {
        return;
    }
    let Some(entry) = OFF_CPU_THREADS.get_ptr_mut(&tid) else {
        return;
    };
    // SAFETY: a map value; the thread is not running, so only this CPU's
    // switch (and a wakeup, which only moves wake_ns) touches it.
    let thread = unsafe {
        let thread = *entry;
        (*entry).out_ns = 0;
        thread
    };
    if thread.out_ns == 0 || now <= thread.out_ns {
        return;
    }
    let pending = thread.flags & THREAD_STACK_PENDING != 0;
    let off = now - thread.out_ns;
    let runq = if thread.state == TASK_RUNNING {
        off
    } else if thread.wake_ns >= thread.out_ns && thread.wake_ns <= now {
        now - thread.wake_ns
    } else {
        0
    };
    let weight = weigh(off);
    if weight == 0 {
        if pending {
            let _ = OFF_CPU_PENDING.remove(&tid);
        }
        return;
    }

    if pending {
        // The stacks were walked at the switch-out: complete and send.
        let Some(record) = OFF_CPU_PENDING.get_ptr_mut(&tid) else {
            bump(Counter::OffCpuLost);
            return;
        };
        // SAFETY: the pending map value of a thread that is not running.
        unsafe {
            add_interval(record, now, off, runq, weight);
            let frames = (*record).kernel_frames as u32 + (*record).user_frames as u32;
            emit(record, frames, false);
        }
        let _ = OFF_CPU_PENDING.remove(&tid);
        return;
    }

    if thread.flags & THREAD_IN_SYSCALL != 0
        && let Some(record) = OFF_CPU_PENDING.get_ptr_mut(&tid)
    {
        // SAFETY: as above.
        unsafe {
            if awaits_syscall_exit(record) {
                // Blocked again in the same system call: one record for
                // the call.
                add_interval(record, now, off, runq, weight);
                return;
            }
            // Stacks walked for a switch whose end went unseen: not this
            // interval's. (Merged into, it would never be counted as
            // waiting for sys_exit, and each later interval of the thread
            // would pile onto it until the next walk overwrote them all.)
            let _ = OFF_CPU_PENDING.remove(&tid);
        }
    }

    let Some(record) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch record; `next` is the tracepoint's own
    // task pointer, as bpf_get_task_stack requires.
    unsafe {
        init_header(record, thread.pid, tid, thread.state);
        (*record).comm = thread.comm;
        let kernel = bpf_get_task_stack(
            next,
            (*record).frames.as_mut_ptr().cast(),
            KERNEL_STACK_BYTES,
            0,
        );
        let kernel_frames = if kernel < 0 {
            (*record).flags = SAMPLE_FLAG_KERNEL_STACK_FAILED;
            0
        } else {
            (*record).flags = SAMPLE_FLAG_IN_KERNEL;
            ((kernel as u32) / 8).min(MAX_STACK_DEPTH as u32)
        };
        (*record).kernel_frames = kernel_frames as u16;
        add_interval(record, now, off, runq, weight);
        if thread.flags & THREAD_IN_SYSCALL != 0 {
            // The user stack is walked when the call returns (sys_exit).
            if OFF_CPU_PENDING.insert(&tid, &*record, 0).is_err() {
                bump(Counter::OffCpuLost);
            } else {
                count_pending(1);
            }
        } else {
            // A kernel thread: no user stack.
            emit(record, kernel_frames, false);
        }
    }
}

/// A pending record of intervals that waits for its system call's return
/// (its user stack not walked yet), not stacks walked at a switch-out.
///
/// # Safety
/// `record` must point to a readable `Sample`.
#[inline(always)]
unsafe fn awaits_syscall_exit(record: *const Sample) -> bool {
    // SAFETY: the caller's promise.
    unsafe { (*record).intervals > 0 && (*record).user_frames == 0 }
}

/// The off-CPU time an interval of `off` nanoseconds stands for, or 0 when
/// it is not recorded: below the minimum never; below the sampling period
/// with probability off / period, standing for one period.
#[inline(always)]
fn weigh(off: u64) -> u64 {
    if off < global(&OFF_CPU_MIN_NS) {
        bump(Counter::OffCpuShort);
        return 0;
    }
    let period = global(&OFF_CPU_PERIOD_NS);
    if period == 0 || off >= period {
        return off;
    }
    // SAFETY: helper calls without arguments.
    let draw = unsafe { ((bpf_get_prandom_u32() as u64) << 32) | bpf_get_prandom_u32() as u64 };
    if draw % period < off {
        period
    } else {
        bump(Counter::OffCpuUnsampled);
        0
    }
}

/// Clears a record's header for thread `tid` of process `pid`.
///
/// # Safety
/// `record` must point to a writable `Sample`.
#[inline(always)]
unsafe fn init_header(record: *mut Sample, pid: u32, tid: u32, state: u32) {
    // SAFETY: the caller's promise.
    unsafe {
        (*record).time_ns = 0;
        (*record).pid = pid;
        (*record).tid = tid;
        (*record).kernel_frames = 0;
        (*record).user_frames = 0;
        (*record).flags = 0;
        (*record).user_end = 0;
        (*record).kind = SAMPLE_KIND_OFF_CPU;
        (*record).off_cpu_ns = 0;
        (*record).runq_ns = 0;
        (*record).weight_ns = 0;
        (*record).task_state = state;
        (*record).intervals = 0;
    }
}

/// Adds one interval ending at `now` to a record.
///
/// # Safety
/// `record` must point to a writable `Sample`.
#[inline(always)]
unsafe fn add_interval(record: *mut Sample, now: u64, off: u64, runq: u64, weight: u64) {
    // SAFETY: the caller's promise.
    unsafe {
        (*record).time_ns = now;
        (*record).off_cpu_ns += off;
        (*record).runq_ns += runq;
        (*record).weight_ns += weight;
        (*record).intervals += 1;
    }
}

/// Appends the labels of the goroutine running on the current thread of
/// `pid` (a registered Go process) after the record's first `frames`
/// frames, and flags the record.
///
/// # Safety
/// `record` must point to a writable `Sample` that only this program
/// context writes (the scheduler's scratch record, or the thread's own
/// pending record at its system call's return).
#[inline(always)]
unsafe fn append_go_labels(record: *mut Sample, pid: u32, regs: &UserRegs, frames: u32) {
    if !runtimes::go::labels::enabled() {
        return;
    }
    let frames = (frames as usize).min(MAX_SAMPLE_FRAMES);
    // SAFETY: the caller's promise; the block fits in the sample's `tail`
    // after any number of frames, and the record is this context's own.
    unsafe {
        let block = record
            .cast::<u8>()
            .add(Sample::record_len(frames))
            .cast::<GoLabels>();
        if runtimes::go::labels::read(pid, regs, block, runtimes::go::labels::READS_OFF_CPU)
            .is_some()
        {
            (*record).flags |= SAMPLE_FLAG_GO_LABELS;
        }
    }
}

/// Sends the first `frames` frames of a record, and its Go labels when it
/// has them (right after those frames).
///
/// # Safety
/// `record` must point to a readable `Sample`.
#[inline(always)]
unsafe fn emit(record: *const Sample, frames: u32, wake_now: bool) {
    let frames = (frames as usize).min(MAX_SAMPLE_FRAMES);
    let mut len = Sample::record_len(frames);
    // SAFETY: the caller's promise; the labels block lies within the
    // sample's `tail` after any number of frames.
    unsafe {
        if (*record).flags & SAMPLE_FLAG_GO_LABELS != 0 {
            let labels = record.cast::<u8>().add(len).cast::<GoLabels>();
            len += GoLabels::block_len(((*labels).count as usize).min(MAX_GO_LABELS));
        }
    }
    // SAFETY: the caller's promise; len <= size_of Sample.
    let bytes = unsafe { core::slice::from_raw_parts(record.cast::<u8>(), len) };
    if send(bytes, wake_now) {
        bump(Counter::OffCpuSent);
    } else {
        bump(Counter::OffCpuRingBufferFull);
    }
}
