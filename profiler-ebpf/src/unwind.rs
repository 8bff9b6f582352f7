//! The user stack walker.
//!
//! Starting from the task's user registers, each step finds the caller's
//! (pc, sp, fp): by the rule of the unwind-table row that covers `pc` when
//! user space loaded a table for its object (Go's pcsp, `.eh_frame` /
//! `.debug_frame` CFI, signal trampolines), else by the frame pointer. The
//! layout of the tables and the cost of a lookup are described in
//! `profiler_common::unwind`. `bpf_loop` keeps the verifier's work to one
//! step, and the step is a global function (`profiler_walk_step`) that the
//! kernel verifies on its own: kernels that treat a loop callback as a
//! loop prune none of its states until the loop converges. The walk's
//! state lives in a per-CPU map and reaches each step through the loop's
//! context pointer, so a step does no map lookup of its own besides the
//! table's array reads. The rules found are kept in that
//! state for the next samples (`WalkState::rule_cache`): a service's stacks
//! return to the same few hundred addresses, and most lookups end there.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::bpf_loop,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use profiler_common::unwind::{
    DEFAULT_UNWIND_ROW_BLOCKS, FRAME_EXACT_PC, FRAME_RECORD_RANGES, MAX_PROCESS_UNWIND_MAPPINGS,
    MAX_UNWIND_MAPPINGS, MAX_UNWIND_PAGES, MAX_UNWIND_PROCESSES, MAX_UNWIND_RULES, ProcessUnwind,
    RULE_CACHE_GRANULE_SHIFT, RULE_CACHE_SLOTS, RULE_CFA_DEREF_FP, RULE_CFA_FP, RULE_CFA_SP,
    RULE_FLAG_FP_FROM_FP, RULE_FLAG_FP_LOST, RULE_FLAG_GO_INJECTED_CALL, RULE_FLAG_INTERPRETER,
    RULE_FLAG_UNSUPPORTED, RULE_FRAME_POINTER, RULE_GO_CGOCALL, RULE_GO_CGOCALLBACK, RULE_PLT,
    RULE_ROOT, RULE_SIGNAL, RULE_STOP, UNWIND_PAGE_SHIFT, UNWIND_ROWS_PER_BLOCK, UnwindMapping,
    UnwindPage, UnwindRowBlock, UnwindRule, UserStackEnd,
};
use profiler_common::{Counter, MAX_SAMPLE_FRAMES, MAX_USER_FRAMES, Sample, UserRegs};

use crate::walk::{CachedRule, Step, WalkState, read_user, return_to, stack_pair, stack_word};
use crate::{bump, machine, runtimes, words};

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

/// One walk state per context that can walk on a CPU at once: the
/// perf-event program (`WALK_SAMPLING`) and the scheduler's switch
/// (`WALK_SCHEDULER`). They do not interrupt each other (the switch runs
/// with interrupts off), but one state each keeps that from mattering.
#[map]
static WALK: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(2, 0);

pub const WALK_SAMPLING: u32 = 0;
pub const WALK_SCHEDULER: u32 = 1;

/// What each loop step needs, passed through `bpf_loop`'s context pointer.
#[repr(C)]
struct StepContext {
    state: *mut WalkState,
    sample: *mut Sample,
}

/// How a walk went.
pub struct Walk {
    pub frames: u32,
    pub end: UserStackEnd,
    /// The leaf PC was in no mapping registered for the process: its maps
    /// changed (see `SAMPLE_FLAG_UNKNOWN_MAPPING`).
    pub unknown_leaf: bool,
    /// A CPython eval loop was met in a thread user space has not
    /// registered (see `SAMPLE_FLAG_PY_THREAD_UNKNOWN`).
    pub python_thread_unknown: bool,
}

/// Walks the current task's user stack into `sample.frames`, after the
/// `kernel_frames` kernel frames already there, with the walk state of
/// context `slot` (`WALK_*`); `in_system_call` when the registers are
/// those of a task inside a system call (`machine::SavedUser`).
#[inline(always)]
pub fn walk_user_stack(
    slot: u32,
    pid: u32,
    regs: &UserRegs,
    in_system_call: bool,
    sample: *mut Sample,
    kernel_frames: u32,
) -> Walk {
    let nothing = Walk {
        frames: 0,
        end: UserStackEnd::None,
        unknown_leaf: false,
        python_thread_unknown: false,
    };
    // A kernel thread has no user registers worth walking.
    if regs.pc == 0 || regs.pc >= machine::USER_LIMIT {
        return nothing;
    }
    let Some(state) = WALK.get_ptr_mut(slot) else {
        return nothing;
    };
    // SAFETY: this CPU's walk state, used only by this program run.
    unsafe {
        (*state).pc = regs.pc;
        (*state).sp = regs.sp;
        (*state).fp = regs.fp;
        (*state).lr = machine::strip_pointer_auth(regs.lr);
        (*state).go_g = regs.go_g;
        (*state).bcp = regs.bcp;
        // Field by field (`words`: no byte-wise memset).
        words::set(&raw mut (*state).mapping.start, 0);
        words::set(&raw mut (*state).mapping.end, 0);
        words::set(&raw mut (*state).first_mapping, 0);
        words::set(&raw mut (*state).mapping_count, 0);
        words::set(&raw mut (*state).generation, 0);
        (*state).stack_window.clear();
        (*state).py_window.clear();
        words::set(&raw mut (*state).frames, 0);
        words::set(&raw mut (*state).kernel_frames, kernel_frames);
        words::set(&raw mut (*state).end, UserStackEnd::Truncated as u32);
        words::set(&raw mut (*state).exact_pc, 0);
        words::set(&raw mut (*state).leaf_in_system_call, in_system_call as u32);
        words::set(&raw mut (*state).unknown_leaf, 0);
        words::set(&raw mut (*state).fp_from_record, 0);
        words::set(&raw mut (*state).py_state, runtimes::python::PY_UNSTARTED);
        words::set(&raw mut (*state).py_pending, 0);
        words::set(&raw mut (*state).py_unknown_thread, 0);
        words::set(&raw mut (*state).py_end, 0);
        words::set(
            &raw mut (*state).jvm_state,
            runtimes::hotspot::JVM_UNSTARTED,
        );
        if let Some(process) = UNWIND_PROCESSES.get(&pid) {
            (*state).first_mapping = process.first_mapping;
            (*state).mapping_count = process.mapping_count;
            (*state).generation = process.generation;
        }
        let mut context = StepContext { state, sample };
        bpf_loop(
            MAX_USER_FRAMES as u32,
            step as *mut c_void,
            (&mut context as *mut StepContext).cast(),
            0,
        );
        let end = match (*state).end {
            1 => UserStackEnd::Root,
            2 => UserStackEnd::NoTable,
            3 => UserStackEnd::TableStop,
            4 => UserStackEnd::ReadFault,
            _ => UserStackEnd::Truncated,
        };
        if end == UserStackEnd::Truncated {
            bump(Counter::UserStackTruncated);
        }
        Walk {
            frames: (*state).frames,
            end,
            unknown_leaf: (*state).unknown_leaf != 0,
            python_thread_unknown: (*state).py_unknown_thread != 0,
        }
    }
}

const CONTINUE: i64 = 0;
const STOP: i64 = 1;

/// `bpf_loop`'s callback: one frame, by `profiler_walk_step`.
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `context` is the StepContext on walk_user_stack's stack.
    let context = unsafe { &*(context as *const StepContext) };
    // The verifier knows nothing of a global function's result, and a
    // callback must return 0 or 1.
    let stepped = profiler_walk_step(context.state, context.sample);
    // SAFETY: a local; the volatile read keeps the compiler, which sees
    // the function's body, from folding the test away.
    if unsafe { core::ptr::read_volatile(&stepped) } == CONTINUE {
        CONTINUE
    } else {
        STOP
    }
}

/// One frame: record `pc`, then move to the caller. Returns STOP when the
/// walk is over (with `state.end` saying why).
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
    // An eval loop activation's Python frames, one per iteration, before
    // its native caller is recorded (`runtimes::python`).
    if state.py_pending != 0 {
        if !runtimes::python::step(state, sample) {
            return STOP; // no room left: end stays Truncated
        }
        if state.py_pending == 0 && state.py_end != 0 {
            state.end = state.py_end;
            return STOP;
        }
        return CONTINUE;
    }
    // Java code in a JVM's code cache: its frame, and its caller, by the
    // JVM's own layout (`runtimes::hotspot`).
    if let Some(stepped) = runtimes::hotspot::step(state, sample) {
        state.fp_from_record = 0;
        return match stepped {
            Ok(Step::Next) => CONTINUE,
            Ok(Step::End(end)) => {
                state.end = end as u32;
                STOP
            }
            Err(()) => {
                bump(Counter::UserStackFailed);
                state.end = UserStackEnd::ReadFault as u32;
                STOP
            }
        };
    }
    let n = state.frames;
    // 64-bit arithmetic and one bounds check on the very value used as the
    // index: the verifier must see the write stay inside the sample.
    let slot = state.kernel_frames as u64 + n as u64;
    if n as usize >= MAX_USER_FRAMES || slot >= MAX_SAMPLE_FRAMES as u64 {
        return STOP; // end stays Truncated
    }
    let slot = slot as usize;
    let exact = if state.exact_pc != 0 {
        FRAME_EXACT_PC
    } else {
        0
    };
    if let Some(frame) = sample.frames.get_mut(slot) {
        *frame = state.pc | exact;
    }
    state.frames = n + 1;

    // A caller's pc is a return address: look up the call instruction.
    let exact_pc = state.exact_pc != 0;
    let lookup = if (n == 0 && state.leaf_in_system_call == 0) || exact_pc {
        state.pc
    } else {
        state.pc - 1
    };
    state.exact_pc = 0;
    // A Go caller whose frame record is its unwind: the step without the
    // rule (a lookup, most often a hit in the rule cache, is one cold line
    // of memory a frame where the record's words are already in the
    // stack window).
    if n > 0 && !exact_pc && state.fp_from_record != 0 && is_frame_record_caller(state, lookup) {
        bump(Counter::FramesFromFrameRecords);
        let end = match frame_pointer_step(state) {
            Ok(Step::Next) => return CONTINUE,
            Ok(Step::End(end)) => end as u32,
            Err(()) => {
                bump(Counter::UserStackFailed);
                UserStackEnd::ReadFault as u32
            }
        };
        state.end = end;
        return STOP;
    }
    let (rule, mapped) = find_rule(state, lookup);
    if n == 0 && !mapped && state.mapping_count > 0 {
        state.unknown_leaf = 1;
    }
    // An interpreter's eval loop: its Python frames take the place of its
    // native frame (written by the next iterations), and it is unwound
    // natively by the rest of its rule.
    if rule.flags & RULE_FLAG_INTERPRETER != 0 && runtimes::python::enter(state) {
        state.frames = n;
    }
    let stepped = match rule.kind {
        RULE_FRAME_POINTER => {
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
            if let Ok(Some(system_sp)) = runtimes::go::stacks::system_stack_of(state.go_g, state.sp)
            {
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
    let end = match stepped {
        Ok(Step::Next) => return CONTINUE,
        Ok(Step::End(end)) => end as u32,
        Err(()) => {
            bump(Counter::UserStackFailed);
            UserStackEnd::ReadFault as u32
        }
    };
    if state.py_pending != 0 {
        // The walk ends here, after this activation's Python frames.
        state.py_end = end;
        return CONTINUE;
    }
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
