//! CPython in the stack walker: the Python frames of each activation of the
//! interpreter's eval loop, written in place of its native frame (see
//! `profiler_common::runtimes::python` for the layouts and the record).
//!
//! The native walker calls [`enter`] at a frame whose rule carries
//! `RULE_FLAG_INTERPRETER`; when it returns true, the walker has not
//! recorded the eval loop's own frame, unwinds it natively, and calls
//! [`step`] once per loop iteration until the activation's Python frames
//! are written (one frame each), before it records the caller. Every read
//! is bounded: a frame is read in one 112-byte window (3.11 on, several
//! frames in one 1 KiB read of the data stack), at most
//! `MAX_PY_FRAMES` frames per sample are written, and a frame that cannot
//! be read ends the Python part of the stack with a mark (its native
//! frames go on).

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::HashMap};
use profiler_common::runtimes::python::{
    FRAME_WINDOW, MAX_PY_FRAMES, MAX_PY_PROCESSES, MAX_PY_THREADS, PY_CUT_READ_FAULT,
    PY_CUT_TOO_DEEP, PY_FRAME_TAG, PY_LAYOUT_310, PY_LAYOUT_311, PY_LAYOUT_312, PyProcess,
    PyThread, RUNTIME_PAYLOAD_MASK,
};
use profiler_common::{Counter, Sample};

use crate::walk::{PAGE_BYTES, PY_WINDOW_WORDS, WalkState, Window, read_user, write_runtime_frame};
use crate::{bump, machine, words};

/// CPython processes and where they keep what the walker reads, written by
/// user space when it finds a process's interpreter.
#[map]
static PY_PROCESSES: HashMap<u32, PyProcess> = HashMap::with_max_entries(MAX_PY_PROCESSES, 0);

/// Thread states by thread id (the kernel's pid; 3.10: by thread pointer,
/// see `profiler_runtimes::python::threads`), written by user space from
/// the interpreter's own thread list.
#[map]
static PY_THREADS: HashMap<u64, PyThread> = HashMap::with_max_entries(MAX_PY_THREADS, 0);

/// `WalkState::py_state`: nothing looked up yet in this walk.
pub(crate) const PY_UNSTARTED: u32 = 0;
/// The thread's frame chain is being followed.
pub(crate) const PY_STARTED: u32 = 1;
/// No Python frames in this walk (not a Python process, an unknown
/// thread, or the chain was cut): eval loops stay native frames.
pub(crate) const PY_OFF: u32 = 2;

/// Bytes of a frame the walker reads ([`FRAME_WINDOW`]): alone (3.10), or
/// inside a larger window of the data stack (3.11 on).
const WINDOW: usize = FRAME_WINDOW;

/// Starts the Python frames of an eval loop activation. False when there
/// are none to write (the walker then records the eval loop natively).
#[inline(always)]
pub(crate) fn enter(state: &mut WalkState) -> bool {
    if state.py_state == PY_UNSTARTED {
        state.py_state = PY_OFF;
        let pid_tgid = bpf_get_current_pid_tgid();
        let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
        // SAFETY: the value is copied out of the map.
        let Some(process) = (unsafe { PY_PROCESSES.get(&pid) }) else {
            return false;
        };
        // 3.10's thread states record no thread id, only `pthread_self()`:
        // the thread pointer.
        let key = if process.layout == PY_LAYOUT_310 {
            machine::thread_pointer().unwrap_or(0)
        } else {
            u64::from(tid)
        };
        // SAFETY: as above.
        let thread = match unsafe { PY_THREADS.get(&key) } {
            Some(thread) if thread.pid == pid => *thread,
            _ => {
                state.py_unknown_thread = 1;
                bump(Counter::PythonThreadUnknown);
                return false;
            }
        };
        words::copy(&mut state.py, process);
        let Ok(mut frame) = read_user(
            thread
                .thread_state
                .wrapping_add(u64::from(state.py.thread_frame)),
        ) else {
            return false;
        };
        if state.py.cframe_frame != PyProcess::NONE {
            if !plausible(frame) {
                return false;
            }
            let Ok(current) = read_user(frame.wrapping_add(u64::from(state.py.cframe_frame)))
            else {
                return false;
            };
            frame = current;
        }
        state.py_frame = frame;
        state.py_frames = 0;
        state.py_state = PY_STARTED;
    }
    if state.py_state != PY_STARTED || !plausible(state.py_frame) {
        return false;
    }
    state.py_pending = 1;
    true
}

/// One loop iteration while an activation's Python frames are pending:
/// writes the next one, or ends the activation. False when the sample
/// has no room left (the walk is then over, truncated).
#[inline(always)]
pub(crate) fn step(state: &mut WalkState, sample: &mut Sample) -> bool {
    let frame = state.py_frame;
    if !plausible(frame) {
        state.py_pending = 0;
        return true;
    }
    if state.py_frames >= MAX_PY_FRAMES {
        return cut(state, sample, PY_CUT_TOO_DEEP);
    }
    let Some(at) = read_frame(state, frame) else {
        return cut(state, sample, PY_CUT_READ_FAULT);
    };
    let (window, py) = (&state.py_window.words, &state.py);
    let previous = field(window, at, py.frame_previous);
    let code = field(window, at, py.frame_code);
    let (code, instr, ends) = match py.layout {
        PY_LAYOUT_310 => (code, field(window, at, py.frame_instr) & 0xffff_ffff, true),
        PY_LAYOUT_311 => (
            code,
            field(window, at, py.frame_instr),
            byte(window, at, py.frame_is_entry) != 0,
        ),
        PY_LAYOUT_312 => {
            // An entry frame (owned by the C stack) ends the activation
            // and is no Python function: not written.
            if byte(window, at, py.frame_owner) >= py.owner_entry {
                state.py_frame = previous;
                state.py_pending = 0;
                return true;
            }
            (
                code & !py.code_tag_bits,
                field(window, at, py.frame_instr),
                false,
            )
        }
        _ => return cut(state, sample, PY_CUT_READ_FAULT),
    };
    if !write_runtime_frame(
        state,
        sample,
        PY_FRAME_TAG | (code & RUNTIME_PAYLOAD_MASK),
        instr,
    ) {
        return false;
    }
    bump(Counter::PythonFrames);
    state.py_frames += 1;
    state.py_frame = previous;
    if ends {
        state.py_pending = 0;
    }
    true
}

/// Marks the Python part of the stack as cut here and stops following it.
#[inline(always)]
fn cut(state: &mut WalkState, sample: &mut Sample, reason: u64) -> bool {
    bump(Counter::PythonCut);
    state.py_state = PY_OFF;
    state.py_pending = 0;
    write_runtime_frame(state, sample, PY_FRAME_TAG, reason)
}

/// Where the frame at `frame` (its first `WINDOW` bytes) is in the walk
/// state's window, reading the window when it does not hold them; None on
/// a fault.
///
/// From 3.11 on, frames sit one after the other in the thread's data
/// stack, each caller below its callee: a window that ends where this
/// frame's bytes end holds the next few callers too, one helper call for
/// several frames. It starts no lower than the frame's own page, which may
/// be the first of its chunk (it then reaches further above the frame,
/// into the same chunk). The frame is read alone where that read fails
/// all the same (a fault a page cannot explain; not expected). 3.10's
/// frames are objects of their own on the heap: read one by one.
#[inline(always)]
fn read_frame(state: &mut WalkState, frame: u64) -> Option<usize> {
    const FRAME_WORDS: u64 = (WINDOW / 8) as u64;
    let window = &mut state.py_window;
    if let Some(at) = window.held(frame, FRAME_WORDS) {
        return Some(at);
    }
    if state.py.layout != PY_LAYOUT_310 {
        let end = frame.wrapping_add(WINDOW as u64);
        let from = end
            .saturating_sub(Window::<PY_WINDOW_WORDS>::BYTES)
            // Never below the frame's own page.
            .max(frame & !(PAGE_BYTES - 1));
        // A base of 0 means an empty window: not for a frame in page 0.
        if from != 0 && window.read(from) {
            return window.held(frame, FRAME_WORDS);
        }
    }
    if window.read_bytes(frame, WINDOW as u64) {
        return window.held(frame, FRAME_WORDS);
    }
    None
}

/// The u64 at byte `offset` of the frame at word `at` of the window (0 past
/// the frame's `WINDOW` bytes).
#[inline(always)]
fn field(window: &[u64; PY_WINDOW_WORDS], at: usize, offset: u16) -> u64 {
    if offset as usize > WINDOW - 8 {
        return 0;
    }
    let word = at + (offset as usize >> 3);
    let low = window.get(word).copied().unwrap_or(0);
    let shift = u32::from(offset & 7) * 8;
    if shift == 0 {
        return low;
    }
    // A field across two words (no layout has one; read right all the same).
    let high = window.get(word + 1).copied().unwrap_or(0);
    (low >> shift) | (high << (64 - shift))
}

/// The byte at `offset` of the frame at word `at` of the window (0 past
/// the frame's `WINDOW` bytes).
#[inline(always)]
fn byte(window: &[u64; PY_WINDOW_WORDS], at: usize, offset: u16) -> u8 {
    if offset as usize >= WINDOW {
        return 0;
    }
    let word = window
        .get(at + (offset as usize >> 3))
        .copied()
        .unwrap_or(0);
    (word >> (u32::from(offset & 7) * 8)) as u8
}

/// A pointer that may be a frame: in user space and aligned.
#[inline(always)]
fn plausible(address: u64) -> bool {
    address != 0 && address < machine::USER_LIMIT && address & 7 == 0
}
