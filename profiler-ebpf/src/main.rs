//! BPF side of the profiler: one program on a CPU-clock perf event per CPU.
//!
//! Each sample is streamed to user space through a ring buffer with its
//! user and kernel stacks copied in place (`bpf_get_stack` writes straight
//! into the reserved record, so there is no extra copy). Streaming instead
//! of in-kernel counting keeps window boundaries exact (user space assigns
//! samples to windows by timestamp) and carries the user registers an
//! unwinder needs; the cost per sample is measured by `cargo xtask bench`.
#![no_std]
#![no_main]

mod arch;

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_get_stack,
        bpf_ktime_get_ns,
    },
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
};
use profiler_common::{
    COUNTER_SLOTS, Counter, MAX_PID_FILTER, MAX_STACK_DEPTH, RING_BUFFER_BYTES,
    SAMPLE_FLAG_IN_KERNEL, SAMPLE_FLAG_KERNEL_STACK_FAILED, SAMPLE_FLAG_USER_STACK_FAILED, Sample,
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

const STACK_BYTES: u32 = (MAX_STACK_DEPTH * 8) as u32;

#[perf_event]
pub fn sample_stack(ctx: PerfEventContext) -> u32 {
    record_sample(&ctx);
    0
}

#[inline(always)]
fn bump(counter: Counter) {
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
    // SAFETY: reading a read-only global the loader initialised.
    let filter = unsafe { core::ptr::read_volatile(&FILTER_PIDS) };
    // SAFETY: the value is only tested for presence.
    if filter != 0 && unsafe { PID_FILTER.get(&pid) }.is_none() {
        bump(Counter::FilteredOut);
        return;
    }

    let Some(mut entry) = SAMPLES.reserve::<Sample>(0) else {
        bump(Counter::RingBufferFull);
        return;
    };
    let sample = entry.as_mut_ptr();
    // SAFETY: `sample` points at a reserved, exclusively owned ring-buffer
    // record of size_of::<Sample>() bytes; every field is written below
    // (stacks past the returned length stay uninitialised and are never read).
    unsafe {
        let mut flags = 0u32;
        let user = bpf_get_stack(
            ctx.as_ptr(),
            (*sample).user_stack.as_mut_ptr().cast(),
            STACK_BYTES,
            BPF_F_USER_STACK as u64,
        );
        let user_frames = if user < 0 {
            flags |= SAMPLE_FLAG_USER_STACK_FAILED;
            bump(Counter::UserStackFailed);
            0
        } else {
            (user as u32) / 8
        };
        let kernel = bpf_get_stack(
            ctx.as_ptr(),
            (*sample).kernel_stack.as_mut_ptr().cast(),
            STACK_BYTES,
            0,
        );
        let kernel_frames = if kernel < 0 {
            flags |= SAMPLE_FLAG_KERNEL_STACK_FAILED;
            bump(Counter::KernelStackFailed);
            0
        } else {
            (kernel as u32) / 8
        };
        if kernel_frames > 0 {
            flags |= SAMPLE_FLAG_IN_KERNEL;
        }
        (*sample).time_ns = bpf_ktime_get_ns();
        (*sample).pid = pid;
        (*sample).tid = tid;
        (*sample).cpu = bpf_get_smp_processor_id();
        (*sample).flags = flags;
        (*sample).user_frames = user_frames;
        (*sample).kernel_frames = kernel_frames;
        (*sample).user_regs = arch::user_regs();
        (*sample).comm = bpf_get_current_comm().unwrap_or([0u8; 16]);
    }
    entry.submit(0);
    bump(Counter::Sent);
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
