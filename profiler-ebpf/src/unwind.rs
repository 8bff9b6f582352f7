//! The user stack walker.
//!
//! Starting from the task's user registers, each step finds the caller's
//! (pc, sp, fp): by an unwind-table row when user space loaded a table for
//! the code at `pc` (Go's pcsp today; `.eh_frame` next), else by the frame
//! pointer. This repairs what frame pointers get wrong — code that uses the
//! frame-pointer register for data (Go's crypto assembly), samples in
//! prologues and frameless leaves — and walks deeper than the kernel's
//! 127-frame limit. `bpf_loop` keeps the verifier's work to one step.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_loop, bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use profiler_common::{
    Counter, MAX_UNWIND_MAPPINGS, MAX_UNWIND_PROCESSES, MAX_UNWIND_ROWS, MAX_USER_FRAMES,
    ProcessUnwind, SAMPLE_FLAG_USER_STACK_AT_ROOT, SAMPLE_FLAG_USER_STACK_FAILED,
    SAMPLE_FLAG_USER_STACK_TRUNCATED, UNWIND_CFA_FP, UNWIND_FRAME_POINTER, UNWIND_ROOT,
    UNWIND_STOP, UnwindRow, UserRegs,
};

use crate::{SCRATCH, arch, bump};

/// Rows of every loaded unwind table.
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(MAX_UNWIND_ROWS, 0);

/// Which of a process's mappings have tables, and where their rows are.
#[map]
static UNWIND_PROCESSES: HashMap<u32, ProcessUnwind> =
    HashMap::with_max_entries(MAX_UNWIND_PROCESSES, 0);

/// The walk in progress on this CPU (bpf_loop's callback reads it here).
#[repr(C)]
struct WalkState {
    pc: u64,
    sp: u64,
    fp: u64,
    frames: u32,
    flags: u32,
    process: ProcessUnwind,
}

#[map]
static WALK: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(1, 0);

/// Walks the current task's user stack into this CPU's scratch sample.
/// Returns the number of frames and `SAMPLE_FLAG_USER_*` bits.
#[inline(always)]
pub fn walk_user_stack(pid: u32, regs: &UserRegs) -> (u32, u32) {
    // A kernel thread has no user registers worth walking.
    if regs.pc == 0 || regs.pc >= arch::USER_LIMIT {
        return (0, 0);
    }
    let Some(state) = WALK.get_ptr_mut(0) else {
        return (0, 0);
    };
    // SAFETY: this CPU's walk state, used only by this program run.
    unsafe {
        (*state).pc = regs.pc;
        (*state).sp = regs.sp;
        (*state).fp = regs.fp;
        (*state).frames = 0;
        (*state).flags = 0;
        (*state).process.count = 0;
        if arch::TABLE_UNWINDING
            && let Some(process) = UNWIND_PROCESSES.get(&pid)
        {
            (*state).process = *process;
        }
        bpf_loop(
            MAX_USER_FRAMES as u32,
            step as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        ((*state).frames, (*state).flags)
    }
}

const CONTINUE: i64 = 0;
const STOP: i64 = 1;

/// One frame: record `pc`, then move to the caller. Returns STOP when
/// the walk is over.
extern "C" fn step(_index: u64, _ctx: *mut c_void) -> i64 {
    let (Some(state), Some(sample)) = (WALK.get_ptr_mut(0), SCRATCH.get_ptr_mut(0)) else {
        return STOP;
    };
    // SAFETY: this CPU's walk state and scratch sample, exclusively ours
    // while the program runs.
    let (state, sample) = unsafe { (&mut *state, &mut *sample) };
    let n = state.frames as usize;
    if n >= MAX_USER_FRAMES {
        state.flags |= SAMPLE_FLAG_USER_STACK_TRUNCATED;
        bump(Counter::UserStackTruncated);
        return STOP;
    }
    sample.user_stack[n] = state.pc;
    state.frames += 1;

    // A caller's pc is a return address: look up the call instruction.
    let lookup = if n == 0 { state.pc } else { state.pc - 1 };
    let stepped = match find_row(&state.process, lookup) {
        Some(row) if row.flags & UNWIND_STOP != 0 => {
            if row.flags & UNWIND_ROOT != 0 {
                state.flags |= SAMPLE_FLAG_USER_STACK_AT_ROOT;
            }
            return STOP;
        }
        Some(row) if row.flags & UNWIND_FRAME_POINTER == 0 => {
            bump(Counter::FramesFromTables);
            table_step(state, &row)
        }
        _ => frame_pointer_step(state),
    };
    match stepped {
        Ok(true) => CONTINUE,
        Ok(false) => STOP,
        Err(()) => {
            state.flags |= SAMPLE_FLAG_USER_STACK_FAILED;
            bump(Counter::UserStackFailed);
            STOP
        }
    }
}

#[inline(always)]
fn read_user(address: u64) -> Result<u64, ()> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an Err.
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| ())
}

#[inline(always)]
fn read_frame_record(address: u64) -> Result<[u64; 2], ()> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an Err.
    unsafe { bpf_probe_read_user(address as *const [u64; 2]) }.map_err(|_| ())
}

/// Caller by frame-pointer record. Ok(false) at the end of the chain.
#[inline(always)]
fn frame_pointer_step(state: &mut WalkState) -> Result<bool, ()> {
    let fp = state.fp;
    // A frame record lives above the stack pointer; anything else is not a
    // frame pointer (or the outermost frame's 0).
    if fp == 0 || fp < state.sp {
        return Ok(false);
    }
    // One read of the whole two-word record: half the helper calls of
    // reading the words one by one (the walker's main per-frame cost).
    let record = read_frame_record(fp)?;
    let return_address = record[(arch::FRAME_RECORD_RETURN_ADDRESS / 8) as usize];
    let caller_fp = record[(arch::FRAME_RECORD_CALLER_FP / 8) as usize];
    state.sp = fp + arch::FRAME_RECORD_SIZE;
    state.fp = caller_fp;
    state.pc = return_address;
    Ok(return_address != 0)
}

/// Caller by an unwind-table row (x86_64 rules, see `UnwindRow`).
#[inline(always)]
fn table_step(state: &mut WalkState, row: &UnwindRow) -> Result<bool, ()> {
    let base = if row.flags & UNWIND_CFA_FP != 0 {
        state.fp
    } else {
        state.sp
    };
    let cfa = base.wrapping_add(row.cfa_offset as i64 as u64);
    if cfa <= state.sp {
        return Ok(false);
    }
    let return_address = read_user(cfa - 8)?;
    if row.fp_offset != 0 {
        state.fp = read_user(cfa.wrapping_add(row.fp_offset as i64 as u64))?;
    }
    state.sp = cfa;
    state.pc = return_address;
    Ok(return_address != 0)
}

/// The row covering `pc` in the process's tables, if any.
#[inline(always)]
fn find_row(process: &ProcessUnwind, pc: u64) -> Option<UnwindRow> {
    let mut found: Option<(u32, u32, u32)> = None;
    for i in 0..MAX_UNWIND_MAPPINGS {
        if i as u32 >= process.count {
            break;
        }
        let m = &process.mappings[i];
        if m.start <= pc && pc < m.end && pc >= m.base && m.row_count > 0 {
            let offset = pc - m.base;
            if offset <= u32::MAX as u64 {
                found = Some((m.first_row, m.row_count, offset as u32));
            }
            break;
        }
    }
    let (first, count, offset) = found?;
    // Binary search: the last row whose pc <= offset. 21 halvings cover
    // MAX_UNWIND_ROWS (2^20).
    let (mut lo, mut hi) = (0u32, count);
    for _ in 0..21 {
        if lo + 1 >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let row = UNWIND_ROWS.get(first + mid)?;
        if row.pc <= offset {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let row = *UNWIND_ROWS.get(first + lo)?;
    (row.pc <= offset).then_some(row)
}
