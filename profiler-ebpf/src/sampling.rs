//! The CPU-clock sampler: one perf event per CPU runs `sample_stack`,
//! which takes the kernel stack and starts the user stack's walk (the
//! chain, `chain::CPU`); `finish_cpu`, the chain's last program, adds the
//! goroutine's labels of a Go process and sends the record.
//! `sample_page_fault` is the same on the `page-faults` software event
//! (one in N faults), its records marked `SAMPLE_KIND_PAGE_FAULT`. The two
//! share the CPU context's scratch record and walk state: the kernel runs
//! no perf-event program inside another on one CPU (`bpf_prog_active`).

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_stack, bpf_ktime_get_ns,
        generated::bpf_get_current_comm as get_comm,
    },
    macros::perf_event,
    programs::PerfEventContext,
};
use profiler_common::unwind::UserStackEnd;
use profiler_common::{
    Counter, MAX_SAMPLE_FRAMES, MAX_STACK_DEPTH, MAX_USER_WORDS, SAMPLE_FLAG_GO_LABELS,
    SAMPLE_FLAG_IN_KERNEL, SAMPLE_FLAG_KERNEL_STACK_FAILED, SAMPLE_FLAG_UNKNOWN_MAPPING,
    SAMPLE_KIND_CPU, SAMPLE_KIND_PAGE_FAULT, Sample, runtimes::go::GoLabels,
};

use crate::chain::CPU;
use crate::{bump, machine, native, runtimes, send, traced, walk, words};

pub(crate) const KERNEL_STACK_BYTES: u32 = (MAX_STACK_DEPTH * 8) as u32;

#[perf_event]
pub fn sample_stack(ctx: PerfEventContext) -> u32 {
    start(&ctx, SAMPLE_KIND_CPU);
    0
}

#[perf_event]
pub fn sample_page_fault(ctx: PerfEventContext) -> u32 {
    start(&ctx, SAMPLE_KIND_PAGE_FAULT);
    0
}

/// The sample's header and kernel stack, then the user stack's walk.
#[inline(always)]
fn start(ctx: &PerfEventContext, kind: u8) {
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
    let (Some(sample), Some(state)) = (crate::scratch(CPU), walk::state(CPU)) else {
        return;
    };
    // SAFETY: this CPU's scratch record and walk state, exclusively ours
    // for the chain's run; every header field is written here or in the
    // finish.
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
        words::set(&raw mut (*sample).flags, flags);
        words::set(&raw mut (*sample).kind, kind);
        words::set(&raw mut (*sample).off_cpu_ns, 0);
        words::set(&raw mut (*sample).runq_ns, 0);
        words::set(&raw mut (*sample).weight_ns, 0);
        words::set(&raw mut (*sample).task_state, 0);
        words::set(&raw mut (*sample).intervals, 0);
        let state = &mut *state;
        let saved = interrupted_user.unwrap_or_else(|| machine::saved_user(&mut state.regs_block));
        // The native walk here, and the finish too unless the walk went on
        // in a runtime's walker (a tail call).
        if !walk::begin(state, pid, &saved.regs, saved.in_system_call, kernel_frames)
            || native::walk_here::<_, CPU>(ctx, state)
        {
            finish(ctx);
        }
    }
}

#[perf_event]
pub fn finish_cpu(ctx: PerfEventContext) -> u32 {
    finish(&ctx);
    0
}

/// The walked stack's length and end, the goroutine's labels, and the
/// send.
#[inline(always)]
fn finish(_ctx: &PerfEventContext) {
    let (Some(sample), Some(state)) = (crate::scratch(CPU), walk::state(CPU)) else {
        return;
    };
    // SAFETY: this CPU's scratch record and walk state, ours for the
    // chain's run.
    unsafe {
        let state = &*state;
        let kernel_frames = (*sample).kernel_frames as u32;
        // Bounded once (see offcpu's `user_stack`): the walkers never write
        // more.
        let user_frames = state.frames.min(MAX_USER_WORDS as u32);
        let end = walk::end_of(state);
        if end == UserStackEnd::Truncated {
            bump(Counter::UserStackTruncated);
        }
        let mut flags = (*sample).flags | state.sample_flags as u16;
        let frames = ((kernel_frames + user_frames) as usize).min(MAX_SAMPLE_FRAMES);
        let mut record_len = Sample::record_len(frames);
        // A goroutine's labels go after the last frame (the sample's
        // `tail` leaves room for them however many frames there are).
        if runtimes::go::labels::enabled()
            && let Some(len) = runtimes::go::labels::read(
                state.pid,
                state.callee[runtimes::go::G_REGISTER],
                sample.cast::<u8>().add(record_len).cast::<GoLabels>(),
                runtimes::go::labels::READS_SAMPLING,
            )
        {
            flags |= SAMPLE_FLAG_GO_LABELS;
            record_len += len;
        }
        words::set(&raw mut (*sample).user_frames, user_frames as u16);
        words::set(&raw mut (*sample).flags, flags);
        words::set(&raw mut (*sample).user_end, end as u8);
        let bytes = core::slice::from_raw_parts(sample.cast::<u8>(), record_len);
        // Waking the reader for every sample costs an irq_work and a
        // context switch per sample; the agent drains on a timer instead,
        // and is woken early only when the buffer is a quarter full.
        // A sample in code mapped since the agent last read the process's
        // maps wakes it at once: until it reads them again and loads that
        // code's table, the process's stacks there are cut.
        if send(bytes, flags & SAMPLE_FLAG_UNKNOWN_MAPPING != 0) {
            bump(Counter::Sent);
        } else {
            bump(Counter::RingBufferFull);
        }
    }
}
