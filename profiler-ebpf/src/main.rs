//! BPF side of the profiler: one program on a CPU-clock perf event per CPU,
//! and the scheduler tracepoints of off-CPU profiling (`offcpu`).
//!
//! Each sample is streamed to user space through a ring buffer: the kernel
//! stack (`bpf_get_stack`), the user stack walked by our own unwinder
//! (`unwind`: unwind-table rows where user space loaded a table for the
//! code, frame pointers elsewhere, up to `MAX_USER_FRAMES`), and who ran.
//! Streaming instead of in-kernel counting keeps window boundaries exact:
//! every sample reaches user space before the window it was drained in
//! closes, so each sample lands in exactly one window.
#![no_std]
#![no_main]

mod machine;
mod offcpu;
mod runtimes;
mod unwind;
mod walk;
mod words;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_stack, bpf_ktime_get_ns,
        generated::bpf_get_current_comm as get_comm,
    },
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
};
use profiler_common::{
    COUNTER_SLOTS, Counter, MAX_PID_FILTER, MAX_SAMPLE_FRAMES, MAX_STACK_DEPTH, RING_BUFFER_BYTES,
    SAMPLE_FLAG_GO_LABELS, SAMPLE_FLAG_IN_KERNEL, SAMPLE_FLAG_KERNEL_STACK_FAILED,
    SAMPLE_FLAG_PY_THREAD_UNKNOWN, SAMPLE_FLAG_UNKNOWN_MAPPING, SAMPLE_KIND_CPU, Sample,
    runtimes::go::GoLabels,
};

/// Set by the loader: non-zero means "only pids in `PID_FILTER`". A
/// read-only global, so the verifier treats it as a constant.
#[unsafe(no_mangle)]
static FILTER_PIDS: u8 = 0;

#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(RING_BUFFER_BYTES, 0);

/// Processes (tgids) to sample when `FILTER_PIDS` is set.
#[map]
static PID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PID_FILTER, 0);

/// Per-CPU event counters, indexed by `profiler_common::Counter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Where a sample is assembled before it is copied, cut to its length, into
/// the ring buffer (a full `Sample` is 9 KiB; most stacks need far less).
#[map]
static SCRATCH: PerCpuArray<Sample> = PerCpuArray::with_max_entries(1, 0);

pub(crate) const KERNEL_STACK_BYTES: u32 = (MAX_STACK_DEPTH * 8) as u32;

#[perf_event]
pub fn sample_stack(ctx: PerfEventContext) -> u32 {
    record_sample(&ctx);
    0
}

#[inline(always)]
pub(crate) fn bump(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot; this program is the only writer on its CPU
        // and perf-event programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn record_sample(ctx: &PerfEventContext) {
    bump(Counter::Fired);
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // The idle task (pid 0) is not a process; count it and move on.
    if pid == 0 {
        bump(Counter::Idle);
        return;
    }
    if !traced(pid) {
        bump(Counter::FilteredOut);
        return;
    }
    let Some(sample) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: `sample` is this CPU's scratch value, exclusively ours for
    // the duration of the program; every header field is written below.
    unsafe {
        let mut flags = 0u16;
        // A sample of user code has no kernel stack, and its registers are
        // the context's: no stack walk (the helper would also zero the
        // whole 1 KiB it was given) and no read of the saved registers.
        let interrupted_user = machine::interrupted_user(ctx.as_ptr().cast());
        // The kernel stack goes first in `frames`; the user stack follows
        // it, so the record is one contiguous run of frames.
        let kernel = if interrupted_user.is_some() {
            0
        } else {
            bpf_get_stack(
                ctx.as_ptr(),
                (*sample).frames.as_mut_ptr().cast(),
                KERNEL_STACK_BYTES,
                0,
            )
        };
        let kernel_frames = if kernel < 0 {
            flags |= SAMPLE_FLAG_KERNEL_STACK_FAILED;
            bump(Counter::KernelStackFailed);
            0
        } else {
            ((kernel as u32) / 8).min(MAX_STACK_DEPTH as u32)
        };
        if kernel_frames > 0 {
            flags |= SAMPLE_FLAG_IN_KERNEL;
        }
        let saved = interrupted_user.unwrap_or_else(machine::saved_user);
        let regs = saved.regs;
        let walk = unwind::walk_user_stack(
            unwind::WALK_SAMPLING,
            pid,
            &regs,
            saved.in_system_call,
            sample,
            kernel_frames,
        );
        let (user_frames, user_end) = (walk.frames, walk.end);
        if walk.unknown_leaf {
            flags |= SAMPLE_FLAG_UNKNOWN_MAPPING;
        }
        if walk.python_thread_unknown {
            flags |= SAMPLE_FLAG_PY_THREAD_UNKNOWN;
        }

        let frames = ((kernel_frames + user_frames) as usize).min(MAX_SAMPLE_FRAMES);
        let mut record_len = Sample::record_len(frames);
        // A goroutine's labels go after the last frame (the sample's
        // `tail` leaves room for them however many frames there are).
        if runtimes::go::labels::enabled()
            && let Some(len) = runtimes::go::labels::read(
                pid,
                &regs,
                sample.cast::<u8>().add(record_len).cast::<GoLabels>(),
                runtimes::go::labels::READS_SAMPLING,
            )
        {
            flags |= SAMPLE_FLAG_GO_LABELS;
            record_len += len;
        }

        // Field by field (`words`: no byte-wise memset).
        words::set(&raw mut (*sample).time_ns, bpf_ktime_get_ns());
        words::set(&raw mut (*sample).pid, pid);
        words::set(&raw mut (*sample).tid, tid);
        // Into the record directly; the helper zeroes it when it fails.
        get_comm(
            (*sample).comm.as_mut_ptr().cast(),
            (*sample).comm.len() as u32,
        );
        words::set(&raw mut (*sample).kernel_frames, kernel_frames as u16);
        words::set(&raw mut (*sample).user_frames, user_frames as u16);
        words::set(&raw mut (*sample).flags, flags);
        words::set(&raw mut (*sample).user_end, user_end as u8);
        words::set(&raw mut (*sample).kind, SAMPLE_KIND_CPU);
        words::set(&raw mut (*sample).off_cpu_ns, 0);
        words::set(&raw mut (*sample).runq_ns, 0);
        words::set(&raw mut (*sample).weight_ns, 0);
        words::set(&raw mut (*sample).task_state, 0);
        words::set(&raw mut (*sample).intervals, 0);

        let bytes = core::slice::from_raw_parts(sample.cast::<u8>(), record_len);
        // Waking the reader for every sample costs an irq_work and a
        // context switch per sample; the agent drains on a timer instead,
        // and is woken early only when the buffer is a quarter full.
        // A sample in code mapped since the agent last read the process's
        // maps wakes it at once: until it reads them again and loads that
        // code's table, the process's stacks there are cut.
        if send(bytes, walk.unknown_leaf) {
            bump(Counter::Sent);
        } else {
            bump(Counter::RingBufferFull);
        }
    }
}

/// Whether process `pid` passes the `--pid` filter.
#[inline(always)]
pub(crate) fn traced(pid: u32) -> bool {
    // SAFETY: reading a read-only global the loader initialised.
    let filter = unsafe { core::ptr::read_volatile(&FILTER_PIDS) };
    // SAFETY: the value is only tested for presence.
    filter == 0 || unsafe { PID_FILTER.get(&pid) }.is_some()
}

/// Copies one record into the ring buffer; false when it is full.
#[inline(always)]
pub(crate) fn send(bytes: &[u8], wake_now: bool) -> bool {
    let wakeup =
        if wake_now || SAMPLES.query(BPF_RB_AVAIL_DATA as u64) > (RING_BUFFER_BYTES / 4) as u64 {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        };
    SAMPLES.output::<[u8]>(bytes, wakeup as u64).is_ok()
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
