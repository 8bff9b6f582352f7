//! CPython in the stack walker: the Python frames of every activation of
//! the interpreter's eval loop in a stack (see
//! `profiler_common::runtimes::python` for the layouts and the record).
//!
//! A program of the walk's chain (`chain`), run once the native walk is
//! over when it marked eval loop activations (rows with
//! `RULE_FLAG_INTERPRETER`): it follows the thread's frame chain from its
//! current frame and writes its section, each activation's frames then
//! `MARK_END`: one frame per C activation in 3.10, frames up to the one
//! marked `is_entry` in 3.11, frames up to the entry frame the C stack
//! owns (`owner >= owner_entry`, not written) from 3.12 on. User space puts
//! each activation in place of its mark. Every read is bounded: a frame is
//! read in one 112-byte window (3.11 on, several frames in one 1 KiB read
//! of the data stack), at most `MAX_PY_FRAMES` frames per sample are
//! written, and a frame that cannot be read cuts the section with a mark
//! (the activations left stay native frames).

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_loop},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::runtimes::python::{
    FRAME_WINDOW, MAX_PY_FRAMES, MAX_PY_PROCESSES, MAX_PY_THREADS, PY_CUT_READ_FAULT,
    PY_CUT_TOO_DEEP, PY_FRAME_TAG, PY_LAYOUT_310, PY_LAYOUT_311, PY_LAYOUT_312, PyProcess,
    PyThread,
};
use profiler_common::runtimes::{
    ACTIVATION_LAST, MARK_CUT, MARK_END, MARK_SECTION, RUNTIME_CPYTHON, RUNTIME_PAYLOAD_MASK,
    RuntimeCounter,
};
use profiler_common::{SAMPLE_FLAG_RUNTIME_THREAD_UNKNOWN, Sample};

use crate::walk::{
    self, PAGE_BYTES, WalkState, Window, bump_runtime, read_user, write_section_frame,
};
use crate::{chain, machine, words};

/// CPython processes and where they keep what the walker reads, written by
/// user space when it finds a process's interpreter.
#[map]
static PY_PROCESSES: HashMap<u32, PyProcess> = HashMap::with_max_entries(MAX_PY_PROCESSES, 0);

/// Thread states by thread id (the kernel's pid; 3.10: by thread pointer,
/// see `profiler_runtime_python::threads`), written by user space from
/// the interpreter's own thread list.
#[map]
static PY_THREADS: HashMap<u64, PyThread> = HashMap::with_max_entries(MAX_PY_THREADS, 0);

/// Words of a CPython thread's data stack the walker copies at once.
const PY_WINDOW_WORDS: usize = 128;

/// The walker's cursor, one slot per context (`chain`).
#[repr(C)]
pub(crate) struct PyWalk {
    /// The process's layout.
    process: PyProcess,
    /// The frame being read, and (3.11 on) the frames below it in the
    /// thread's data stack: its callers.
    window: Window<PY_WINDOW_WORDS>,
    /// The next frame to read.
    frame: u64,
    /// Python frames written.
    frames: u32,
    /// Activations still to write (their marks are in the native part).
    activations: u32,
}

#[map]
static PY_WALK: PerCpuArray<PyWalk> = PerCpuArray::with_max_entries(3, 0);

crate::walkers!(
    walk,
    walk_cpython_cpu,
    walk_cpython_sched,
    walk_cpython_probe
);

/// Bytes of a frame the walker reads ([`FRAME_WINDOW`]): alone (3.10), or
/// inside a larger window of the data stack (3.11 on).
const WINDOW: usize = FRAME_WINDOW;

#[repr(C)]
struct StepContext {
    state: *mut WalkState,
    sample: *mut Sample,
    py: *mut PyWalk,
}

/// This walker's program run: the section of every marked activation,
/// then on to the rest of the chain.
#[inline(always)]
fn walk<C: EbpfContext, const K: u32>(ctx: &C) {
    let (Some(state), Some(sample), Some(py)) =
        (walk::state(K), crate::scratch(K), PY_WALK.get_ptr_mut(K))
    else {
        return;
    };
    // SAFETY: this CPU's walk state, scratch record and cursor of context
    // K, ours while the chain runs.
    let (state, sample_ref, py_ref) = unsafe { (&mut *state, &mut *sample, &mut *py) };
    let activations = state
        .marks
        .get(RUNTIME_CPYTHON as usize)
        .copied()
        .unwrap_or(0);
    if activations > 0 && start(state, py_ref) {
        py_ref.activations = activations as u32;
        py_ref.frames = 0;
        py_ref.window.clear();
        if write_section_frame(state, sample_ref, PY_FRAME_TAG | MARK_SECTION, 0) {
            let mut context = StepContext {
                state: &raw mut *state,
                sample,
                py,
            };
            // SAFETY: the callback and its context live through the call.
            unsafe {
                bpf_loop(
                    MAX_PY_FRAMES + 64,
                    step as *mut c_void,
                    (&mut context as *mut StepContext).cast(),
                    0,
                )
            };
        }
    }
    chain::finish::<C, K>(ctx, state);
}

/// Finds the current frame of the sampled thread; false when its frames
/// cannot be read (not a registered process or thread: its marks stay
/// native).
#[inline(always)]
fn start(state: &mut WalkState, py: &mut PyWalk) -> bool {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out of the map.
    let Some(process) = (unsafe { PY_PROCESSES.get(&state.pid) }) else {
        return false;
    };
    words::copy(&mut py.process, process);
    // 3.10's thread states record no thread id, only `pthread_self()`:
    // the thread pointer.
    let key = if py.process.layout == PY_LAYOUT_310 {
        machine::thread_pointer().unwrap_or(0)
    } else {
        u64::from(tid)
    };
    // SAFETY: as above.
    let thread = match unsafe { PY_THREADS.get(&key) } {
        Some(thread) if thread.pid == state.pid => *thread,
        _ => {
            state.sample_flags |= SAMPLE_FLAG_RUNTIME_THREAD_UNKNOWN as u32;
            bump_runtime(RUNTIME_CPYTHON, RuntimeCounter::ThreadUnknown);
            return false;
        }
    };
    let Ok(mut frame) = read_user(
        thread
            .thread_state
            .wrapping_add(u64::from(py.process.thread_frame)),
    ) else {
        return false;
    };
    if py.process.cframe_frame != PyProcess::NONE {
        if !plausible(frame) {
            return false;
        }
        let Ok(current) = read_user(frame.wrapping_add(u64::from(py.process.cframe_frame))) else {
            return false;
        };
        frame = current;
    }
    py.frame = frame;
    plausible(frame)
}

/// `bpf_loop`'s callback: one frame, by `profiler_python_step`.
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `context` is the StepContext on walk's stack.
    let context = unsafe { &*(context as *const StepContext) };
    let stepped = profiler_python_step(context.state, context.sample, context.py);
    // SAFETY: a local; see `native::step`.
    if unsafe { core::ptr::read_volatile(&stepped) } == 0 {
        0
    } else {
        1
    }
}

/// One frame of the chain: written, or (an entry frame) the end of an
/// activation. Returns 1 when the section is over (every activation
/// written, the chain's end, a cut, or no room). A global function,
/// verified on its own (see `native::profiler_walk_step`).
#[inline(never)]
#[unsafe(no_mangle)]
pub(crate) extern "C" fn profiler_python_step(
    state: *mut WalkState,
    sample: *mut Sample,
    py: *mut PyWalk,
) -> i64 {
    if state.is_null() || sample.is_null() || py.is_null() {
        return 1;
    }
    // SAFETY: the StepContext's pointers, ours while the program runs.
    let (state, sample, py) = unsafe { (&mut *state, &mut *sample, &mut *py) };
    if py.activations == 0 {
        return 1;
    }
    let frame = py.frame;
    if !plausible(frame) {
        // The chain ends: so does this activation; those left have no
        // frames to show.
        let _ = end_activation(state, sample, py);
        return 1;
    }
    if py.frames >= MAX_PY_FRAMES {
        return cut(state, sample, PY_CUT_TOO_DEEP);
    }
    let Some(at) = read_frame(py, frame) else {
        return cut(state, sample, PY_CUT_READ_FAULT);
    };
    let (window, process) = (&py.window.words, &py.process);
    let previous = field(window, at, process.frame_previous);
    let code = field(window, at, process.frame_code);
    let (code, instr, ends) = match process.layout {
        PY_LAYOUT_310 => (
            code,
            field(window, at, process.frame_instr) & 0xffff_ffff,
            true,
        ),
        PY_LAYOUT_311 => (
            code,
            field(window, at, process.frame_instr),
            byte(window, at, process.frame_is_entry) != 0,
        ),
        PY_LAYOUT_312 => {
            // An entry frame (owned by the C stack) ends the activation
            // and is no Python function: not written.
            if byte(window, at, process.frame_owner) >= process.owner_entry {
                py.frame = previous;
                return end_activation(state, sample, py);
            }
            (
                code & !process.code_tag_bits,
                field(window, at, process.frame_instr),
                false,
            )
        }
        _ => return cut(state, sample, PY_CUT_READ_FAULT),
    };
    // An address: no payload of a mark, no flag bit.
    let payload = code & RUNTIME_PAYLOAD_MASK;
    if payload == MARK_CUT || payload >= ACTIVATION_LAST {
        return cut(state, sample, PY_CUT_READ_FAULT);
    }
    let last = if ends { ACTIVATION_LAST } else { 0 };
    if !write_section_frame(state, sample, PY_FRAME_TAG | payload | last, instr) {
        return 1;
    }
    bump_runtime(RUNTIME_CPYTHON, RuntimeCounter::Frames);
    py.frames += 1;
    py.frame = previous;
    if ends {
        return next_activation(py);
    }
    0
}

/// Ends the current activation with a `MARK_END` (an entry frame, or the
/// chain's end: where the last frame written could not say it was the
/// last); 1 when it was the last one to write (or there is no room).
#[inline(always)]
fn end_activation(state: &mut WalkState, sample: &mut Sample, py: &mut PyWalk) -> i64 {
    if !write_section_frame(state, sample, PY_FRAME_TAG | MARK_END, 0) {
        return 1;
    }
    next_activation(py)
}

/// On to the next activation; 1 when none is left to write.
#[inline(always)]
fn next_activation(py: &mut PyWalk) -> i64 {
    py.activations = py.activations.saturating_sub(1);
    (py.activations == 0) as i64
}

/// Marks the section as cut here (the activations left stay native).
#[inline(always)]
fn cut(state: &mut WalkState, sample: &mut Sample, reason: u64) -> i64 {
    bump_runtime(RUNTIME_CPYTHON, RuntimeCounter::Cut);
    let _ = write_section_frame(state, sample, PY_FRAME_TAG | MARK_CUT, reason);
    1
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
fn read_frame(py: &mut PyWalk, frame: u64) -> Option<usize> {
    const FRAME_WORDS: u64 = (WINDOW / 8) as u64;
    let layout = py.process.layout;
    let window = &mut py.window;
    if let Some(at) = window.held(frame, FRAME_WORDS) {
        return Some(at);
    }
    if layout != PY_LAYOUT_310 {
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
