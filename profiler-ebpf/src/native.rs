//! The native walker: the chain's first program (`chain`).
//!
//! Starting from the task's user registers, each step finds the caller's
//! (pc, sp, fp): by the rule of the unwind-table row that covers `pc` when
//! user space loaded a table for its object (Go's pcsp, `.eh_frame` /
//! `.debug_frame` CFI, signal trampolines), else by the frame pointer. The
//! layout of the tables and the cost of a lookup are described in
//! `profiler_common::unwind`. `bpf_loop` keeps the verifier's work to one
//! step, and the step is a global function (`profiler_walk_step`) that the
//! kernel verifies on its own: kernels that treat a loop callback as a
//! loop prune none of its states until the loop converges. The rules found
//! are kept in the walk state for the next samples (`WalkState::rule_cache`):
//! a service's stacks return to the same few hundred addresses, and most
//! lookups end there.
//!
//! Runtimes: a PC in a runtime's code (a code region user space
//! registered for the process, or a `RULE_RUNTIME` row) ends the loop and
//! hands the walk to that runtime's walker, which gives it back when the
//! stack leaves its code; an interpreter's eval loop (a row with
//! `RULE_FLAG_INTERPRETER`) gets an activation mark in place of its frame,
//! and is unwound natively.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::bpf_loop,
    macros::map,
    maps::{Array, HashMap},
};
use profiler_common::runtimes::{CHAIN_FINISH, RuntimeCounter, chain_slot};
use profiler_common::unwind::{
    DEFAULT_UNWIND_ROW_BLOCKS, FRAME_EXACT_PC, FRAME_RECORD_RANGES, MAX_PROCESS_UNWIND_MAPPINGS,
    MAX_UNWIND_MAPPINGS, MAX_UNWIND_PAGES, MAX_UNWIND_PROCESSES, MAX_UNWIND_RULES, ProcessUnwind,
    RULE_CACHE_GRANULE_SHIFT, RULE_CACHE_SLOTS, RULE_CFA_DEREF_FP, RULE_CFA_FP, RULE_CFA_SP,
    RULE_FLAG_FP_FROM_FP, RULE_FLAG_FP_LOST, RULE_FLAG_GO_INJECTED_CALL, RULE_FLAG_INTERPRETER,
    RULE_FLAG_UNSUPPORTED, RULE_FRAME_POINTER, RULE_GO_CGOCALL, RULE_GO_CGOCALLBACK, RULE_PLT,
    RULE_ROOT, RULE_RUNTIME, RULE_SIGNAL, RULE_STOP, UNWIND_PAGE_SHIFT, UNWIND_ROWS_PER_BLOCK,
    UnwindMapping, UnwindPage, UnwindRowBlock, UnwindRule, UserStackEnd,
};
use profiler_common::{
    Counter, MAX_SAMPLE_FRAMES, MAX_USER_FRAMES, SAMPLE_FLAG_UNKNOWN_MAPPING, Sample,
};

use crate::walk::{
    self, CachedRule, Step, WalkState, bump_runtime, read_user, return_to, stack_pair, stack_word,
};
use crate::{bump, chain, machine, runtimes, words};

/// `BPF_F_MMAPABLE`: user space writes the tables through a shared
/// mapping of the arrays, with no system call per row.
const MMAPABLE: u32 = 1 << 10;

/// Rows of every loaded table, in blocks (`UNWIND_ROWS_PER_BLOCK` a block).
/// Sized by the agent at load time from its memory bound.
#[map]
static UNWIND_ROWS: Array<UnwindRowBlock> =
    Array::with_max_entries(DEFAULT_UNWIND_ROW_BLOCKS, MMAPABLE);

/// Per-page row ranges of every loaded table.
#[map]
static UNWIND_PAGES: Array<UnwindPage> = Array::with_max_entries(MAX_UNWIND_PAGES, MMAPABLE);

/// Distinct rules, node-wide; rule 0 walks frame pointers.
#[map]
static UNWIND_RULES: Array<UnwindRule> = Array::with_max_entries(MAX_UNWIND_RULES, MMAPABLE);

/// Mappings with tables, each process's sorted and contiguous.
#[map]
static UNWIND_MAPPINGS: Array<UnwindMapping> =
    Array::with_max_entries(MAX_UNWIND_MAPPINGS, MMAPABLE);

/// Where each process's mappings are.
#[map]
static UNWIND_PROCESSES: HashMap<u32, ProcessUnwind> =
    HashMap::with_max_entries(MAX_UNWIND_PROCESSES, 0);

crate::walkers!(walk, walk_native_cpu, walk_native_sched, walk_native_probe);

/// `WalkState::ready`'s bit for the native walker (runtimes' ids start at
/// 1): the process's mappings are loaded.
const NATIVE_READY: u32 = 1;

/// Set by the loader with `--frame-pointers-only`: the walk follows frame
/// records alone (`walk_frame_pointers`), as perf and bpftrace do. A
/// read-only global, so the verifier drops the other walk.
#[unsafe(no_mangle)]
static FRAME_POINTERS_ONLY: u8 = 0;

/// What each loop step needs, passed through `bpf_loop`'s context pointer.
#[repr(C)]
struct StepContext {
    state: *mut WalkState,
    sample: *mut Sample,
}

/// The native walker's program run: steps frames until the walk ends or
/// reaches a runtime's code, then hands over (to the runtime, or to the
/// marked interpreters and the finish).
#[inline(always)]
fn walk<C: EbpfContext, const K: u32>(ctx: &C) {
    if let Some(state) = walk::state(K) {
        // SAFETY: this CPU's walk state of context K, ours while the chain
        // runs (programs of one context do not nest on a CPU).
        let state = unsafe { &mut *state };
        if walk_here::<C, K>(ctx, state) {
            chain::call::<C, K>(ctx, state, CHAIN_FINISH);
        }
    }
}

/// The native walk, in the program that calls it: steps frames until the
/// walk ends or reaches a runtime's code, and hands over to that runtime,
/// or to the interpreters whose activations it marked (tail calls, which
/// do not return). True when nothing is left but the finish: the caller
/// finishes, in place (the context's entry, where most samples, of native
/// code only, take no tail call at all: each program is code of its own,
/// and a sample that ran three was measured 1.1x a sample that ran one)
/// or by a tail call (this walker's own program).
#[inline(always)]
pub(crate) fn walk_here<C: EbpfContext, const K: u32>(ctx: &C, state: &mut WalkState) -> bool {
    let Some(sample) = crate::scratch(K) else {
        return false;
    };
    // SAFETY: a read-only global the loader initialised.
    if unsafe { core::ptr::read_volatile(&FRAME_POINTERS_ONLY) } != 0 {
        walk_frame_pointers(state, sample);
        return true;
    }
    if state.ready & NATIVE_READY == 0 {
        // The walk's first turn: its process's mappings.
        state.ready |= NATIVE_READY;
        // SAFETY: the value is copied out of the map.
        if let Some(process) = unsafe { UNWIND_PROCESSES.get(&state.pid) } {
            state.first_mapping = process.first_mapping;
            state.mapping_count = process.mapping_count;
            state.generation = process.generation;
        }
    }
    // Twice at most: a runtime's walker that is not there (switched off)
    // leaves its frame to this one.
    for _ in 0..2 {
        state.next = CHAIN_FINISH;
        let mut context = StepContext {
            state: &raw mut *state,
            sample,
        };
        // SAFETY: the callback and its context live through the call.
        unsafe {
            bpf_loop(
                MAX_USER_FRAMES as u32 / 2 + 1,
                step as *mut c_void,
                (&mut context as *mut StepContext).cast(),
                0,
            )
        };
        let slot = state.next;
        if slot == CHAIN_FINISH {
            break;
        }
        if chain::may_hand_over(state) {
            chain::call::<C, K>(ctx, state, slot);
            bump(Counter::ChainMissing);
        } else {
            bump(Counter::ChainCut);
        }
        // Not walked by its runtime: by frame pointer, here.
        state.native_once = 1;
    }
    chain::sections::<C, K>(ctx, state);
    true
}

const CONTINUE: i64 = 0;
const STOP: i64 = 1;

/// `bpf_loop`'s callback: two frames, each by `profiler_walk_step` (a
/// loop iteration is an indirect call and a check the step's own call is
/// not: two frames an iteration were 0.93x the walk of 100-frame C stacks,
/// timed when the walker shared one program with the runtimes', and did
/// not fit arm64's stack then).
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `context` is the StepContext on walk's stack.
    let context = unsafe { &*(context as *const StepContext) };
    for _ in 0..2 {
        // The verifier knows nothing of a global function's result, and a
        // callback must return 0 or 1.
        let stepped = profiler_walk_step(context.state, context.sample);
        // SAFETY: a local; the volatile read keeps the compiler, which
        // sees the function's body, from folding the test away.
        if unsafe { core::ptr::read_volatile(&stepped) } != CONTINUE {
            return STOP;
        }
    }
    CONTINUE
}

/// The walk by frame records alone (`--frame-pointers-only`): no table, no
/// runtime, four frames a loop iteration (0.82-0.85x the general step's
/// walk of 100-frame C stacks by frame pointers, timed before the chain).
#[inline(always)]
fn walk_frame_pointers(state: &mut WalkState, sample: *mut Sample) {
    let mut context = StepContext {
        state: &raw mut *state,
        sample,
    };
    // SAFETY: the callback and its context live through the call.
    unsafe {
        bpf_loop(
            MAX_USER_FRAMES as u32 / 4 + 1,
            frame_pointer_steps as *mut c_void,
            (&mut context as *mut StepContext).cast(),
            0,
        )
    };
}

/// `bpf_loop`'s callback of `walk_frame_pointers`: four frames.
extern "C" fn frame_pointer_steps(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `context` is the StepContext on walk_frame_pointers' stack.
    let context = unsafe { &*(context as *const StepContext) };
    for _ in 0..4 {
        let stepped = profiler_frame_pointer_step(context.state, context.sample);
        // SAFETY: a local; see `step`.
        if unsafe { core::ptr::read_volatile(&stepped) } != CONTINUE {
            return STOP;
        }
    }
    CONTINUE
}

/// One frame by its frame record: record `pc`, then the caller the record
/// names. A global function, as `profiler_walk_step`.
#[inline(never)]
#[unsafe(no_mangle)]
pub(crate) extern "C" fn profiler_frame_pointer_step(
    state: *mut WalkState,
    sample: *mut Sample,
) -> i64 {
    if state.is_null() || sample.is_null() {
        return STOP;
    }
    // SAFETY: the StepContext's pointers, ours while the program runs.
    let (state, sample) = unsafe { (&mut *state, &mut *sample) };
    let n = state.frames;
    let slot = state.kernel_frames as u64 + n as u64;
    if n as usize >= MAX_USER_FRAMES || slot >= MAX_SAMPLE_FRAMES as u64 {
        return STOP; // end stays Truncated
    }
    record(state, sample, slot as usize);
    let stepped = frame_pointer_step(state);
    finish_step(state, stepped)
}

/// One frame: record `pc`, then move to the caller. Returns STOP when the
/// walk is over (with `state.end` saying why) or leaves for a runtime's
/// walker (`state.next`).
///
/// A global function (exported to bpf-linker by profiler-bpf's build, so
/// its BTF linkage stays global): the kernel verifies it once, on its
/// own, with its pointers as any memory of their types' size that may be
/// null, and each call only checks its arguments. Kernels with "bpf:
/// bpf_scc_visit instance and backedges accumulation for bpf_loop()"
/// (6.19.4, and backported) treat a `bpf_loop` callback as a loop and
/// prune none of its states until the loop converges; with the frame's
/// whole step inside the callback, the walker's branches ran the
/// verifier past its million instructions. Verified apart, they are
/// pruned as in any loop-free program, and the callback left is a call.
#[inline(never)]
#[unsafe(no_mangle)]
pub(crate) extern "C" fn profiler_walk_step(state: *mut WalkState, sample: *mut Sample) -> i64 {
    if state.is_null() || sample.is_null() {
        return STOP;
    }
    // SAFETY: the StepContext's pointers, this CPU's walk state and
    // scratch sample, ours while the program runs.
    let (state, sample) = unsafe { (&mut *state, &mut *sample) };
    let n = state.frames;
    // 64-bit arithmetic and one bounds check on the very value used as the
    // index: the verifier must see the write stay inside the sample.
    let slot = state.kernel_frames as u64 + n as u64;
    if n as usize >= MAX_USER_FRAMES || slot >= MAX_SAMPLE_FRAMES as u64 {
        return STOP; // end stays Truncated
    }
    let slot = slot as usize;

    // A caller's pc is a return address: look up the call instruction.
    let exact_pc = state.exact_pc != 0;
    let lookup = if (n == 0 && state.leaf_in_system_call == 0) || exact_pc {
        state.pc
    } else {
        state.pc - 1
    };
    let native_once = state.native_once != 0;
    state.native_once = 0;
    // A Go caller whose frame record is its unwind: the step without the
    // rule (a lookup, most often a hit in the rule cache, is one cold line
    // of memory a frame where the record's words are already in the
    // stack window).
    if n > 0 && !exact_pc && state.fp_from_record != 0 && is_frame_record_caller(state, lookup) {
        record(state, sample, slot);
        bump(Counter::FramesFromFrameRecords);
        let stepped = frame_pointer_step(state);
        return finish_step(state, stepped);
    }
    let (rule, mapped) = find_rule(state, lookup);
    if n == 0 && !mapped && state.mapping_count > 0 {
        state.sample_flags |= SAMPLE_FLAG_UNKNOWN_MAPPING as u32;
    }
    // A runtime's code: its walker writes the frame (unless it just found
    // none of its own here). Its regions are anonymous code, which no
    // table describes: only a frame without a row is looked for there.
    let runtime = match rule.kind {
        RULE_RUNTIME => rule.param as u8,
        RULE_FRAME_POINTER => walk::region_of(state, state.pc),
        _ => 0,
    };
    let runtime = if native_once {
        // The frame lies in a runtime's code that had no frame there.
        if runtime != 0 {
            bump_runtime(runtime, RuntimeCounter::Fallback);
        }
        0
    } else {
        runtime
    };
    if runtime != 0 && runtimes::enabled(runtime) {
        state.next = chain_slot(runtime);
        return STOP;
    }
    // An interpreter's eval loop: an activation mark in place of its
    // native frame (its frames come later, see `chain::finish`), unwound
    // natively by the rest of its rule.
    if rule.flags & RULE_FLAG_INTERPRETER != 0 && runtimes::enabled(rule.param as u8) {
        if !walk::write_activation(state, sample, rule.param as u8) {
            return STOP; // no room left: end stays Truncated
        }
    } else {
        record(state, sample, slot);
    }
    state.exact_pc = 0;
    let stepped = match rule.kind {
        RULE_FRAME_POINTER | RULE_RUNTIME => {
            if rule.flags & RULE_FLAG_UNSUPPORTED != 0 {
                bump(Counter::FramesUnsupportedCfi);
            }
            frame_pointer_step(state)
        }
        RULE_CFA_SP | RULE_CFA_FP | RULE_CFA_DEREF_FP | RULE_PLT => {
            bump(Counter::FramesFromTables);
            table_step(state, &rule, lookup)
        }
        RULE_GO_CGOCALLBACK => {
            bump(Counter::FramesFromTables);
            let g = runtimes::go::stacks::g_register(state);
            if let Ok(Some(system_sp)) = runtimes::go::stacks::system_stack_of(g, state.sp) {
                // Continue on the system stack, in cgocallback's frame
                // there: the C code that called back is its caller.
                state.sp = system_sp;
            }
            table_step(state, &rule, lookup)
        }
        RULE_SIGNAL => {
            bump(Counter::SignalFrames);
            // The trampoline was not called: its address is exact.
            if let Some(frame) = sample.frames.get_mut(slot) {
                *frame |= FRAME_EXACT_PC;
            }
            signal_step(state)
        }
        // The rule is for the call inside asmcgocall: at its own leaf the
        // stacks have not been switched yet.
        RULE_GO_CGOCALL if n > 0 => {
            bump(Counter::FramesFromTables);
            let stepped = runtimes::go::stacks::cgocall_step(state, &rule);
            state.fp_from_record = 0;
            stepped
        }
        RULE_ROOT => Ok(Step::End(UserStackEnd::Root)),
        // RULE_STOP, and a kind this walker does not know.
        RULE_STOP | _ => Ok(Step::End(UserStackEnd::TableStop)),
    };
    finish_step(state, stepped)
}

/// Writes the current frame's PC into the sample.
#[inline(always)]
fn record(state: &mut WalkState, sample: &mut Sample, slot: usize) {
    let exact = if state.exact_pc != 0 {
        FRAME_EXACT_PC
    } else {
        0
    };
    if let Some(frame) = sample.frames.get_mut(slot) {
        *frame = state.pc | exact;
    }
    state.frames += 1;
    state.exact_pc = 0;
}

/// CONTINUE after a step to the caller, or STOP with the walk's end.
#[inline(always)]
fn finish_step(state: &mut WalkState, stepped: Result<Step, ()>) -> i64 {
    let end = match stepped {
        Ok(Step::Next) => return CONTINUE,
        Ok(Step::End(end)) => end as u32,
        Err(()) => {
            bump(Counter::UserStackFailed);
            UserStackEnd::ReadFault as u32
        }
    };
    state.end = end;
    STOP
}

/// Caller by frame-pointer record.
#[inline(always)]
fn frame_pointer_step(state: &mut WalkState) -> Result<Step, ()> {
    let fp = state.fp;
    // A frame record lives above the stack pointer; anything else is not a
    // frame pointer (or the outermost frame's 0).
    if fp == 0 || fp < state.sp {
        return Ok(Step::End(UserStackEnd::NoTable));
    }
    // The whole two-word record at once, from the stack window (a helper
    // call per frame was the walker's main per-frame cost).
    let record = stack_pair(state, fp)?;
    let return_address = record[(machine::FRAME_RECORD_RETURN_ADDRESS / 8) as usize];
    state.fp = record[(machine::FRAME_RECORD_CALLER_FP / 8) as usize];
    state.sp = fp + machine::FRAME_RECORD_SIZE;
    state.fp_from_record = 1;
    if return_address == 0 {
        return Ok(Step::End(UserStackEnd::NoTable));
    }
    Ok(return_to(state, return_address))
}

/// Caller by a CFA rule.
#[inline(always)]
fn table_step(state: &mut WalkState, rule: &UnwindRule, pc: u64) -> Result<Step, ()> {
    let offset = rule.cfa_offset as i64 as u64;
    // RULE_CFA_SP, and RULE_GO_CGOCALLBACK on whichever stack SP is.
    let cfa = match rule.kind {
        RULE_CFA_FP => state.fp.wrapping_add(offset),
        RULE_CFA_DEREF_FP => stack_word(state, state.fp.wrapping_add(offset))?,
        RULE_PLT if (pc & 15) as i16 >= rule.param => state.sp.wrapping_add(offset + 8),
        _ => state.sp.wrapping_add(offset),
    };
    // The caller's frame is above this one. With the return address still
    // in the link register (arm64 leaves) the frame may be empty.
    let in_lr = rule.ra_offset == 0;
    if cfa < state.sp || (cfa == state.sp && !in_lr) || cfa >= machine::USER_LIMIT {
        return Ok(Step::End(UserStackEnd::TableStop));
    }
    let fp_lost = rule.flags & RULE_FLAG_FP_LOST != 0;
    let fp_base = if rule.flags & RULE_FLAG_FP_FROM_FP != 0 {
        state.fp
    } else {
        cfa
    };
    let return_address;
    if in_lr {
        if state.lr == 0 {
            return Ok(Step::End(UserStackEnd::TableStop));
        }
        return_address = state.lr;
        if rule.fp_offset != 0 && !fp_lost {
            state.fp = stack_word(state, fp_base.wrapping_add(rule.fp_offset as i64 as u64))?;
        }
    } else if rule.fp_offset != 0
        && !fp_lost
        && rule.flags & RULE_FLAG_FP_FROM_FP == 0
        && rule.fp_offset == rule.ra_offset - 8
    {
        // The common frame record, caller's FP just below the return
        // address: one read for both.
        let record = stack_pair(state, cfa.wrapping_add(rule.fp_offset as i64 as u64))?;
        state.fp = record[0];
        return_address = record[1];
    } else {
        return_address = stack_word(state, cfa.wrapping_add(rule.ra_offset as i64 as u64))?;
        if rule.fp_offset != 0 && !fp_lost {
            state.fp = stack_word(state, fp_base.wrapping_add(rule.fp_offset as i64 as u64))?;
        }
    }
    if fp_lost {
        state.fp = 0;
    }
    // Read from the stack unless the rule left FP as it was (a register,
    // or a value from the frame before).
    state.fp_from_record = (rule.fp_offset != 0 && !fp_lost) as u32;
    state.sp = cfa;
    let step = return_to(state, return_address);
    if rule.flags & RULE_FLAG_GO_INJECTED_CALL != 0 {
        go_injected_call_return(state, cfa)?;
    }
    Ok(step)
}

/// The frame a Go signal handler's faked call returns to (see
/// `RULE_FLAG_GO_INJECTED_CALL`), as Go's traceback finds it: its PC is the
/// interrupted one, exact; on arm64 its SP is above the slot where the
/// handler saved its LR, and that LR is its return address while it has
/// not saved it in a frame of its own.
#[inline(always)]
fn go_injected_call_return(state: &mut WalkState, cfa: u64) -> Result<(), ()> {
    state.exact_pc = 1;
    state.fp_from_record = 0;
    if machine::GO_INJECTED_CALL_SLOT != 0 {
        state.lr = machine::strip_pointer_auth(stack_word(state, cfa)?);
        state.sp = cfa + machine::GO_INJECTED_CALL_SLOT;
    }
    Ok(())
}

/// Caller of a signal trampoline: the registers the signal interrupted,
/// from the signal frame's ucontext at SP.
#[inline(always)]
fn signal_step(state: &mut WalkState) -> Result<Step, ()> {
    let frame = state.sp;
    let pc = read_user(frame + machine::SIGNAL_PC)?;
    let sp = read_user(frame + machine::SIGNAL_SP)?;
    let fp = read_user(frame + machine::SIGNAL_FP)?;
    let lr = match machine::SIGNAL_LR {
        Some(offset) => read_user(frame + offset)?,
        None => 0,
    };
    if pc == 0 || pc >= machine::USER_LIMIT {
        return Ok(Step::End(UserStackEnd::TableStop));
    }
    // The handler may have run on an alternate stack: SP may go anywhere.
    state.sp = sp;
    state.fp = fp;
    state.pc = machine::strip_pointer_auth(pc);
    state.lr = machine::strip_pointer_auth(lr);
    state.exact_pc = 1;
    state.fp_from_record = 0;
    Ok(Step::Next)
}

/// `pc` (a caller's, looked up one byte back) is in the current mapping's
/// `frame_record_callers`.
#[inline(always)]
fn is_frame_record_caller(state: &WalkState, pc: u64) -> bool {
    if !(state.mapping.start <= pc && pc < state.mapping.end) {
        return false;
    }
    let offset = pc.wrapping_sub(state.mapping.base);
    if offset > u64::from(u32::MAX) {
        return false;
    }
    let offset = offset as u32;
    let mut i = 0;
    while i < FRAME_RECORD_RANGES {
        let range = &state.mapping.frame_record_callers[i];
        if offset.wrapping_sub(range.start) < range.len {
            return true;
        }
        i += 1;
    }
    false
}

/// The rule covering `pc`: from its process's tables, or the frame-pointer
/// rule (all zero) where there is none; and whether `pc` is in a mapping
/// user space registered (with or without a table). Taken from, and kept
/// in, the walk state's rule cache.
#[inline(always)]
fn find_rule(state: &mut WalkState, pc: u64) -> (UnwindRule, bool) {
    // The cache is indexed by granule, and each entry holds the part of
    // its granule its rule covers: a leaf's PC, which falls anywhere in a
    // hot loop, hits as well as a return address. Fibonacci hashing: the
    // product's top bits mix every bit of the granule; the generation
    // keeps two processes of one binary (same addresses) apart.
    let granule = pc >> RULE_CACHE_GRANULE_SHIFT;
    let slot = ((granule ^ (u64::from(state.generation) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        >> (64 - RULE_CACHE_SLOTS.trailing_zeros())) as usize;
    if state.generation != 0
        && let Some(entry) = state.rule_cache.get(slot)
        && entry.generation == state.generation
        && pc.wrapping_sub(entry.start) < u64::from(entry.len)
    {
        return (entry.rule, entry.mapped != 0);
    }
    let (rule, mapped, start, end) =
        if !(state.mapping.start <= pc && pc < state.mapping.end) && !find_mapping(state, pc) {
            // Code mapped since the process was registered: this PC only.
            (UnwindRule::default(), false, pc, pc + 1)
        } else {
            let (rule, start, end) = rule_in_mapping(state, pc);
            (
                rule,
                true,
                start.max(state.mapping.start),
                end.min(state.mapping.end),
            )
        };
    let granule_start = granule << RULE_CACHE_GRANULE_SHIFT;
    let start = start.max(granule_start);
    let end = end.min(granule_start + (1 << RULE_CACHE_GRANULE_SHIFT));
    if state.generation != 0
        && start <= pc
        && pc < end
        && let Some(entry) = state.rule_cache.get_mut(slot)
    {
        let value = CachedRule {
            start,
            generation: state.generation,
            len: (end - start) as u16,
            mapped: mapped as u16,
            rule,
        };
        words::copy(entry, &value);
    }
    (rule, mapped)
}

/// The rule for `pc` in the mapping cached in `state`, and the addresses
/// [start, end) around `pc` it covers (empty when the arrays could not be
/// read).
#[inline(always)]
fn rule_in_mapping(state: &WalkState, pc: u64) -> (UnwindRule, u64, u64) {
    let offset = pc.wrapping_sub(state.mapping.base);
    let page_index = offset >> UNWIND_PAGE_SHIFT;
    // The table's page holding `pc` (its pages start at the mapping's
    // base). Row offsets are from its start.
    let table_page = state
        .mapping
        .base
        .wrapping_add(page_index << UNWIND_PAGE_SHIFT);
    // No table for this page: frame pointers for all of it.
    let whole_page = (
        UnwindRule::default(),
        table_page,
        table_page + (1 << UNWIND_PAGE_SHIFT),
    );
    let failed = (UnwindRule::default(), pc, pc);
    if page_index >= state.mapping.page_count as u64 {
        return whole_page;
    }
    let Some(page) = UNWIND_PAGES.get(state.mapping.first_page + page_index as u32) else {
        return failed;
    };
    let (first, count) = (page.first_row, page.row_count);
    if count == 0 {
        return whole_page;
    }
    let target = (offset & ((1 << UNWIND_PAGE_SHIFT) - 1)) as u16;
    // The last row whose pc_low <= target; a page holds at most 2^12
    // distinct pcs, so 13 halvings always finish.
    let (mut lo, mut hi) = (0u32, count);
    for _ in 0..13 {
        if lo + 1 >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        match row(first + mid) {
            Some((pc_low, _)) if pc_low <= target => lo = mid,
            Some(_) => hi = mid,
            None => return failed,
        }
    }
    let Some((pc_low, rule)) = row(first + lo) else {
        return failed;
    };
    // The row runs to the next one's start, or to the page's end.
    let next_low = if lo + 1 < count {
        match row(first + lo + 1) {
            Some((next, _)) => u64::from(next),
            None => return failed,
        }
    } else {
        1 << UNWIND_PAGE_SHIFT
    };
    match UNWIND_RULES.get(rule as u32) {
        Some(rule) => (*rule, table_page + u64::from(pc_low), table_page + next_low),
        None => failed,
    }
}

/// Row `index` of the row array: (pc_low, rule).
#[inline(always)]
fn row(index: u32) -> Option<(u16, u16)> {
    let block = UNWIND_ROWS.get(index / UNWIND_ROWS_PER_BLOCK)?;
    let row = block.rows.get((index % UNWIND_ROWS_PER_BLOCK) as usize)?;
    Some((row.pc_low, row.rule))
}

/// Finds the process's mapping holding `pc` and caches it in `state`.
#[inline(always)]
fn find_mapping(state: &mut WalkState, pc: u64) -> bool {
    let (first, count) = (state.first_mapping, state.mapping_count);
    if count == 0 || count > MAX_PROCESS_UNWIND_MAPPINGS {
        return false;
    }
    // The last mapping starting at or below pc; 13 halvings cover
    // MAX_PROCESS_UNWIND_MAPPINGS (2^12).
    let (mut lo, mut hi) = (0u32, count);
    for _ in 0..13 {
        if lo + 1 >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        match UNWIND_MAPPINGS.get(first + mid) {
            Some(m) if m.start <= pc => lo = mid,
            Some(_) => hi = mid,
            None => return false,
        }
    }
    match UNWIND_MAPPINGS.get(first + lo) {
        Some(m) if m.start <= pc && pc < m.end => {
            // Word by word (`words`: no byte-wise memmove in the loop).
            words::copy(&mut state.mapping, m);
            true
        }
        _ => false,
    }
}
