//! The chain of programs a stack walk runs through, one program array per
//! context.
//!
//! A walk is several programs, each verified on its own with its own
//! instruction budget and stack: the context's entry (the CPU sampler,
//! the scheduler's switch, a probe hit) sets up the walk state
//! (`walk::begin`) and tail-calls the native walker; the native walker
//! tail-calls a runtime's walker when the stack enters the runtime's code
//! (and gets the walk back when it leaves), then the walkers of the
//! interpreters whose activations it marked; the last one tail-calls the
//! context's finishing program, which sends what was walked. The kernel
//! requires every program of one program array to be of one type, so
//! each context has its own array and its own copy of every walker
//! (`walkers!`): the same code, loaded as a perf-event, a BTF tracepoint
//! or a uprobe program. The slots are `profiler_common::runtimes`'
//! `CHAIN_*`.
//!
//! A tail call fails when its slot is empty (a runtime switched off) or
//! when the run took `MAX_CHAIN_CALLS`: the caller then goes on without
//! it. Walkers count their calls in the walk state and keep the last one
//! for the finish, so a sample is always sent.

use aya_ebpf::{EbpfContext, macros::map, maps::ProgramArray};
use profiler_common::Counter;
use profiler_common::runtimes::{
    CHAIN_FINISH, CHAIN_SLOTS, MAX_CHAIN_CALLS, MAX_RUNTIMES, chain_slot,
};

use crate::bump;
use crate::walk::WalkState;

/// Contexts, each with its walk state (`walk::state`) and program array.
/// CPU-clock samples (perf-event programs).
pub(crate) const CPU: u32 = 0;
/// The scheduler's switches of off-CPU profiling (BTF tracepoints).
pub(crate) const SCHED: u32 = 1;
/// Probe hits with stacks (uprobes).
pub(crate) const PROBE: u32 = 2;

#[map]
static CHAIN_CPU: ProgramArray = ProgramArray::with_max_entries(CHAIN_SLOTS, 0);
#[map]
static CHAIN_SCHED: ProgramArray = ProgramArray::with_max_entries(CHAIN_SLOTS, 0);
#[map]
static CHAIN_PROBE: ProgramArray = ProgramArray::with_max_entries(CHAIN_SLOTS, 0);

/// Tail-calls slot `slot` of context `K`'s chain. Returns only when the
/// call failed (an empty slot, or no calls left), with nothing changed.
#[inline(always)]
pub(crate) fn call<C: EbpfContext, const K: u32>(ctx: &C, state: &mut WalkState, slot: u32) {
    state.chain_calls += 1;
    let array = match K {
        CPU => &CHAIN_CPU,
        SCHED => &CHAIN_SCHED,
        _ => &CHAIN_PROBE,
    };
    // SAFETY: a tail call replaces this program; on failure it returns.
    let _ = unsafe { array.tail_call(ctx, slot) };
    state.chain_calls -= 1;
}

/// Whether a walker may hand the walk to another and still get it back
/// and reach the finish.
#[inline(always)]
pub(crate) fn may_hand_over(state: &WalkState) -> bool {
    state.chain_calls + 3 <= MAX_CHAIN_CALLS
}

/// Ends a walker's turn: the interpreters whose activations were marked
/// write their sections, then the finish. Never returns while a program
/// is there to call; if even the finish is missing, the sample is lost
/// (a build problem: the loader fills every context's finish).
#[inline(always)]
pub(crate) fn finish<C: EbpfContext, const K: u32>(ctx: &C, state: &mut WalkState) {
    sections::<C, K>(ctx, state);
    call::<C, K>(ctx, state, CHAIN_FINISH);
}

/// Tail-calls the walker of each interpreter whose activations were
/// marked, to write its section (each one, when done, comes back through
/// `finish`); returns when none is left (or none could be called).
#[inline(always)]
pub(crate) fn sections<C: EbpfContext, const K: u32>(ctx: &C, state: &mut WalkState) {
    if state.marked == 0 {
        return;
    }
    let mut runtime = 1;
    while runtime < MAX_RUNTIMES as u32 {
        let bit = 1 << runtime;
        if state.marked & bit != 0 {
            // Cleared first: a runtime that is not there leaves its marks
            // as native frames.
            state.marked &= !bit;
            if state.chain_calls + 2 > MAX_CHAIN_CALLS {
                bump(Counter::ChainCut);
                return;
            }
            call::<C, K>(ctx, state, chain_slot(runtime as u8));
            bump(Counter::ChainMissing);
        }
        runtime += 1;
    }
}

/// Declares a walker's program in every context: `walkers!(body, cpu,
/// sched, probe)` defines the perf-event program `cpu`, the BTF
/// tracepoint program `sched` (loaded for `sched_switch`, where the
/// off-CPU walk runs) and the uprobe program `probe`, each running
/// `body::<_, CONTEXT>(&ctx)`. Only the loader's choice of slot makes one
/// a native walker, a runtime's or a finish.
#[macro_export]
macro_rules! walkers {
    ($body:ident, $cpu:ident, $sched:ident, $probe:ident) => {
        #[aya_ebpf::macros::perf_event]
        pub fn $cpu(ctx: aya_ebpf::programs::PerfEventContext) -> u32 {
            $body::<_, { $crate::chain::CPU }>(&ctx);
            0
        }

        #[aya_ebpf::macros::btf_tracepoint(function = "sched_switch")]
        pub fn $sched(ctx: aya_ebpf::programs::BtfTracePointContext) -> u32 {
            $body::<_, { $crate::chain::SCHED }>(&ctx);
            0
        }

        #[aya_ebpf::macros::uprobe]
        pub fn $probe(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            $body::<_, { $crate::chain::PROBE }>(&ctx);
            0
        }
    };
}
