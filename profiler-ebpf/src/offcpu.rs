//! Off-CPU profiling on the scheduler's tracepoints: how long each traced
//! thread was off its CPU, split into blocked and run-queue time, with its
//! stacks. The design (which tracepoint does what, and why the user stack
//! is walked at every switch-out but sent only when it changed) is in
//! `profiler_common::offcpu`.
//!
//! A Go thread's user stack also carries its goroutine's pprof labels (as
//! CPU samples do), read with it at the switch-out. A goroutine blocked in
//! a system call (file I/O, cgo, a blocking read) stays its thread's
//! `curg`, so that time carries its labels; one parked by the Go scheduler
//! (channels, timers, the netpoller) has left its thread, whose wait in
//! the scheduler is unlabelled.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::task_struct,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_get_task_stack,
        bpf_ktime_get_ns, bpf_loop,
    },
    macros::{btf_tracepoint, map},
    maps::LruHashMap,
    programs::BtfTracePointContext,
};
use profiler_common::offcpu::{
    MAX_OFF_CPU_THREADS, OFF_CPU_STACK_RESEND_NS, OffCpuThread, PF_KTHREAD, TASK_RUNNING,
};
use profiler_common::{
    Counter, MAX_STACK_DEPTH, MAX_USER_WORDS, SAMPLE_FLAG_GO_LABELS, SAMPLE_FLAG_IN_KERNEL,
    SAMPLE_FLAG_KERNEL_STACK_FAILED, SAMPLE_FLAG_UNKNOWN_MAPPING, SAMPLE_KIND_OFF_CPU,
    SAMPLE_KIND_OFF_CPU_STACK, Sample, runtimes::go::GoLabels,
};

use crate::chain::SCHED;
use crate::sampling::KERNEL_STACK_BYTES;
use crate::{SCRATCH_OFF_CPU_INTERVAL, bump, machine, native, runtimes, send, traced, walk};

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

/// Traced threads that are off their CPU, or were: by thread id.
#[map]
static OFF_CPU_THREADS: LruHashMap<u32, OffCpuThread> =
    LruHashMap::with_max_entries(MAX_OFF_CPU_THREADS, 0);

/// The records are assembled in `SCRATCH`: the user stack walked at a
/// switch-out in the chain's slot (`chain::SCHED`), an interval at a
/// switch-in in `SCRATCH_OFF_CPU_INTERVAL`. (The perf-event program has
/// its own: it never interrupts the scheduler's tracepoints, which run
/// with interrupts off.)

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

/// `sched_switch(preempt, prev, next, prev_state)`, run as `prev`. The
/// switch-in first: the switch-out's walk goes on in other programs (the
/// chain) and does not come back here.
#[btf_tracepoint(function = "sched_switch")]
pub fn off_cpu_switch(ctx: BtfTracePointContext) -> u32 {
    let preempt: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let next: *mut task_struct = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    // SAFETY: a monotonic clock read.
    let now = unsafe { bpf_ktime_get_ns() };
    switched_in(next, now);
    switched_out(&ctx, prev, preempt as u8 != 0, prev_state as u32, now);
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
    let comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
    let kernel_thread = task_flags & PF_KTHREAD != 0;
    // Most switches are of threads seen before: update their entry in
    // place (an LRU insert allocates and links a node, several times the
    // cost of a lookup).
    let entry = match OFF_CPU_THREADS.get_ptr_mut(&tid) {
        Some(entry) => entry,
        None => {
            let thread = OffCpuThread {
                out_ns: 0,
                wake_ns: 0,
                state,
                _pad: 0,
                pid,
                stack_id: 0,
                comm,
                stack_hash: 0,
                stack_sent_ns: 0,
            };
            let _ = OFF_CPU_THREADS.insert(&tid, &thread, 0);
            match OFF_CPU_THREADS.get_ptr_mut(&tid) {
                Some(entry) => entry,
                None => return,
            }
        }
    };
    // SAFETY: the entry of the current thread, which only its own switches
    // and its wakeup (which only moves `wake_ns`) touch.
    unsafe {
        if (*entry).out_ns != 0 {
            // Switched out twice with no switch-in seen between (it
            // happens, rarely, on 6.18): that interval's end is unknown,
            // so it is lost.
            bump(Counter::OffCpuLost);
        }
        (*entry).out_ns = now;
        (*entry).wake_ns = 0;
        (*entry).state = state;
        (*entry).pid = pid;
        (*entry).comm = comm;
        (*entry).stack_id = 0;
        // A kernel thread has no user stack.
        if !kernel_thread {
            walk_user_stack(ctx, pid, tid, state, now);
        }
    }
}

/// Starts the walk of the current thread's user stack (the chain, ending
/// in `finish_sched`).
#[inline(always)]
fn walk_user_stack(ctx: &BtfTracePointContext, pid: u32, tid: u32, task_state: u32, now: u64) {
    let (Some(record), Some(state)) = (crate::scratch(SCHED), walk::state(SCHED)) else {
        return;
    };
    // SAFETY: this CPU's scratch record and walk state, ours for the
    // chain's run.
    unsafe {
        init_header(record, pid, tid, task_state);
        (*record).kind = SAMPLE_KIND_OFF_CPU_STACK;
        (*record).time_ns = now;
        let state = &mut *state;
        let saved = machine::saved_user(&mut state.regs_block);
        // The native walk here, and the finish too unless the walk went on
        // in a runtime's walker (a tail call).
        if walk::begin(state, pid, &saved.regs, saved.in_system_call, 0)
            && native::walk_here::<_, SCHED>(ctx, state)
        {
            finish_stack(tid);
        }
    }
}

/// The chain's last program at a switch-out: the walked stack (and the
/// goroutine's labels) sent when it differs from the last one sent for
/// the thread (or that send is old), and its id kept in the thread's
/// entry for the intervals that name it (0 when there is none: the walk or
/// the send failed).
#[btf_tracepoint(function = "sched_switch")]
pub fn finish_sched(_ctx: BtfTracePointContext) -> u32 {
    finish_stack(bpf_get_current_pid_tgid() as u32);
    0
}

/// `finish_sched`'s body, for thread `tid` (the current one).
#[inline(always)]
fn finish_stack(tid: u32) {
    if let (Some(record), Some(state), Some(thread)) = (
        crate::scratch(SCHED),
        walk::state(SCHED),
        OFF_CPU_THREADS.get_ptr_mut(&tid),
    ) {
        // SAFETY: this CPU's scratch record and walk state, and the
        // current thread's entry (only its own switches touch it).
        unsafe {
            (*thread).stack_id = user_stack(thread, record, &*state);
        }
    }
}

/// See `finish_sched`: the stack's id.
///
/// # Safety
/// `thread` must point to the current thread's `OFF_CPU_THREADS` entry,
/// `record` to this CPU's stack record.
#[inline(always)]
unsafe fn user_stack(
    thread: *mut OffCpuThread,
    record: *mut Sample,
    state: &walk::WalkState,
) -> u32 {
    // One bound for every use below: the helpers clamp to the same one,
    // which the compiler folds into this. With two different bounds (the
    // sample's size and this), arm64's 6.1 verifier followed a path where
    // the two clamps contradicted each other and refused the program.
    let frames = state.frames.min(MAX_USER_WORDS as u32);
    if frames == 0 {
        return 0;
    }
    // SAFETY: the caller's promise.
    unsafe {
        let now = (*record).time_ns;
        let pid = (*record).pid;
        (*record).user_frames = frames as u16;
        (*record).user_end = walk::end_of(state) as u8;
        (*record).flags |= state.sample_flags as u16;
        append_go_labels(record, pid, state.callee[runtimes::go::G_REGISTER], frames);
        let hash = stack_hash(record, frames);
        // Ids are the hash's low half, never 0.
        let id = (hash as u32) | 1;
        if hash == (*thread).stack_hash
            && now.saturating_sub((*thread).stack_sent_ns) < OFF_CPU_STACK_RESEND_NS
        {
            return id;
        }
        (*record).stack_id = id;
        if !emit(record, frames) {
            (*thread).stack_hash = 0;
            return 0;
        }
        bump(Counter::OffCpuStacksSent);
        (*thread).stack_hash = hash;
        (*thread).stack_sent_ns = now;
        id
    }
}

/// A hash of what a stack record says: its process, how the walk ended,
/// its flags, and its words from the first frame to the end of its Go
/// labels block (the goroutine and its labels), which follows the frames.
/// One `bpf_loop` over them keeps the verifier's work to one step.
///
/// # Safety
/// `record` must point to this CPU's scratch stack record holding
/// `frames` frames.
#[inline(always)]
unsafe fn stack_hash(record: *mut Sample, frames: u32) -> u64 {
    let frames = (frames as usize).min(MAX_USER_WORDS);
    // SAFETY: the caller's promise; the labels block lies within the
    // sample's `tail` after any number of frames.
    unsafe {
        let mut words = frames;
        if (*record).flags & SAMPLE_FLAG_GO_LABELS != 0 {
            let labels = record
                .cast::<u8>()
                .add(Sample::record_len(frames))
                .cast::<GoLabels>();
            words += (*labels).len() / 8;
        }
        let mut context = HashContext {
            words: (*record).frames.as_ptr(),
            count: words as u64,
            // The process too: a thread id reused by another process's
            // thread with the same addresses is another stack to user
            // space, which keeps each stack with its process.
            hash: mix(
                HASH_SEED,
                u64::from((*record).user_end)
                    | (u64::from((*record).flags) << 8)
                    | (u64::from((*record).pid) << 32),
            ),
        };
        bpf_loop(
            words as u32,
            hash_step as *mut c_void,
            (&mut context as *mut HashContext).cast(),
            0,
        );
        context.hash
    }
}

const HASH_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// Words of a sample from its first frame to the end of its `tail`.
const SAMPLE_WORDS: u64 = ((core::mem::size_of::<Sample>() - Sample::HEADER_LEN) / 8) as u64;

#[inline(always)]
fn mix(hash: u64, word: u64) -> u64 {
    (hash ^ word).wrapping_mul(HASH_SEED).rotate_left(29)
}

#[repr(C)]
struct HashContext {
    words: *const u64,
    count: u64,
    hash: u64,
}

extern "C" fn hash_step(index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `context` is the HashContext on stack_hash's stack; `words`
    // points into this CPU's scratch record, `SAMPLE_WORDS` long.
    unsafe {
        let context = &mut *(context as *mut HashContext);
        if index >= context.count || index >= SAMPLE_WORDS {
            return 1;
        }
        context.hash = mix(context.hash, *context.words.add(index as usize));
    }
    0
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
        return;
    }
    let Some(record) = crate::scratch(SCRATCH_OFF_CPU_INTERVAL) else {
        return;
    };
    // SAFETY: this CPU's scratch record; `next` is the tracepoint's own
    // task pointer, as bpf_get_task_stack requires.
    unsafe {
        init_header(record, thread.pid, tid, thread.state);
        (*record).comm = thread.comm;
        (*record).stack_id = thread.stack_id;
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
        (*record).time_ns = now;
        (*record).off_cpu_ns = off;
        (*record).runq_ns = runq;
        (*record).weight_ns = weight;
        (*record).intervals = 1;
        if emit(record, kernel_frames) {
            bump(Counter::OffCpuSent);
        }
    }
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
        (*record).stack_id = 0;
        (*record)._reserved = 0;
    }
}

/// Appends the labels of the goroutine running on the current thread of
/// `pid` (a registered Go process) after the record's first `frames`
/// frames, and flags the record.
///
/// # Safety
/// `record` must point to this CPU's scratch stack record.
#[inline(always)]
unsafe fn append_go_labels(record: *mut Sample, pid: u32, g: u64, frames: u32) {
    if !runtimes::go::labels::enabled() {
        return;
    }
    let frames = (frames as usize).min(MAX_USER_WORDS);
    // SAFETY: the caller's promise; the block fits in the sample's `tail`
    // after any number of frames, and the record is this context's own.
    unsafe {
        let block = record
            .cast::<u8>()
            .add(Sample::record_len(frames))
            .cast::<GoLabels>();
        if runtimes::go::labels::read(pid, g, block, runtimes::go::labels::READS_OFF_CPU).is_some()
        {
            (*record).flags |= SAMPLE_FLAG_GO_LABELS;
        }
    }
}

/// Sends the first `frames` frames of a record, and its Go labels when it
/// has them (right after those frames). False when the ring buffer is
/// full.
///
/// # Safety
/// `record` must point to a readable `Sample`.
#[inline(always)]
unsafe fn emit(record: *const Sample, frames: u32) -> bool {
    // A stack record's user frames, or an interval's kernel frames.
    let frames = (frames as usize).min(MAX_USER_WORDS);
    let mut len = Sample::record_len(frames);
    // SAFETY: the caller's promise; the labels block lies within the
    // sample's `tail` after any number of frames.
    unsafe {
        if (*record).flags & SAMPLE_FLAG_GO_LABELS != 0 {
            let labels = record.cast::<u8>().add(len).cast::<GoLabels>();
            len += (*labels).len();
        }
    }
    // SAFETY: the caller's promise; len <= size_of Sample.
    let bytes = unsafe { core::slice::from_raw_parts(record.cast::<u8>(), len) };
    // A leaf in code mapped since the agent last read the process's maps
    // wakes it at once (as CPU samples do), before the code can go.
    // SAFETY: the caller's promise.
    let wake_now = unsafe { (*record).flags } & SAMPLE_FLAG_UNKNOWN_MAPPING != 0;
    if send(bytes, wake_now) {
        true
    } else {
        bump(Counter::OffCpuRingBufferFull);
        false
    }
}
