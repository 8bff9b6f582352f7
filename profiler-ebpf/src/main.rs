//! BPF side of the profiler, one object: the CPU-clock sampler
//! (`sampling`), the scheduler tracepoints of off-CPU profiling
//! (`offcpu`), the probes' programs (`probes`), and the stack walk they
//! share, a chain of programs (`chain`): the native walker (`native`),
//! each runtime's walker (`runtimes`) and each context's finish.
//!
//! Each sample is streamed to user space through a ring buffer: the kernel
//! stack (`bpf_get_stack`), the user stack walked by our own unwinder
//! (unwind-table rows where user space loaded a table for the code, frame
//! pointers elsewhere, up to `MAX_USER_FRAMES`), and who ran. Streaming
//! instead of in-kernel counting keeps window boundaries exact: every
//! sample reaches user space before the window it was drained in closes,
//! so each sample lands in exactly one window.
#![no_std]
#![no_main]

mod chain;
mod machine;
mod native;
mod offcpu;
mod probes;
mod runtimes;
mod sampling;
mod walk;
mod words;

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
};
use profiler_common::runtimes::RUNTIME_COUNTER_SLOTS;
use profiler_common::{COUNTER_SLOTS, Counter, MAX_PID_FILTER, RING_BUFFER_BYTES, Sample};

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

/// Per-CPU counters of the runtimes' walkers
/// (`profiler_common::runtimes::RuntimeCounter::slot`).
#[map]
static RUNTIME_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(RUNTIME_COUNTER_SLOTS, 0);

/// Where a record is assembled before it is copied, cut to its length,
/// into the ring buffer (a full `Sample` is 9 KiB; most stacks need far
/// less): one slot per `SCRATCH_*`.
#[map]
static SCRATCH: PerCpuArray<Sample> = PerCpuArray::with_max_entries(4, 0);

/// `SCRATCH` slots: the walked stack of each chain context (`chain::CPU`,
/// `SCHED`, `PROBE` are 0, 1 and 2), and the off-CPU interval record.
pub(crate) const SCRATCH_OFF_CPU_INTERVAL: u32 = 3;

/// This CPU's record of slot `slot` (a chain context's, or
/// `SCRATCH_OFF_CPU_INTERVAL`).
#[inline(always)]
pub(crate) fn scratch(slot: u32) -> Option<*mut Sample> {
    SCRATCH.get_ptr_mut(slot)
}

#[inline(always)]
pub(crate) fn bump(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot; programs of one context do not nest on
        // one CPU, and an increment lost to another context is a count.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
pub(crate) fn bump_runtime(slot: u32) {
    if let Some(slot) = RUNTIME_COUNTERS.get_ptr_mut(slot) {
        // SAFETY: as in `bump`.
        unsafe { *slot += 1 };
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
