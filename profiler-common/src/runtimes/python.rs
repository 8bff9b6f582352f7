//! CPython: what the BPF walker needs to put a thread's Python frames
//! into its stack, and how they are written into the sample record.
//!
//! The native walker meets the interpreter's eval loop
//! (`_PyEval_EvalFrameDefault`: its rows carry `RULE_FLAG_INTERPRETER`,
//! see `unwind`). One C activation of it runs one or more Python frames:
//! one in 3.10 (every Python call recurses in C), a chain up to the frame
//! marked `is_entry` in 3.11, up to an entry frame owned by the C stack
//! (`owner >= 3`) from 3.12 on. The walker writes those Python frames in
//! place of the eval loop's native frame, innermost first, and goes on
//! with the native frames of its caller: Python and C frames interleave as
//! the thread really called them.
//!
//! User space gives the walker, per process, the offsets it reads
//! (`PyProcess`, from the interpreter's own `_Py_DebugOffsets` on 3.13+,
//! from a table per minor version checked against the binary before) and,
//! per thread, its thread state (`PyThread`, found by walking the
//! interpreter's thread list from user space: no thread-local storage, no
//! libc-specific recipe). A Python frame is written as two words: the code
//! object's address (tagged, see `PY_FRAME_TAG`) and the instruction
//! pointer (or 3.10's `f_lasti`); user space reads the code object's name,
//! file and line table.

/// `PyProcess::layout`: 3.10's `PyFrameObject` chain (`f_back`,
/// `f_code`, `f_lasti`), one frame per eval activation.
pub const PY_LAYOUT_310: u8 = 1;
/// 3.11's `_PyInterpreterFrame` chain; an activation ends with the frame
/// whose `is_entry` is set (that frame included).
pub const PY_LAYOUT_311: u8 = 2;
/// 3.12 on: an activation ends at an entry frame (`owner >= owner_entry`),
/// which is not a Python function and is not written.
pub const PY_LAYOUT_312: u8 = 3;

/// Where one CPython process keeps what the walker reads. Offsets are in
/// bytes; `NONE` where a version has no such field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    /// `PY_LAYOUT_*`.
    pub layout: u8,
    /// 3.12 on: frames with `owner` at or above this end an activation.
    pub owner_entry: u8,
    /// The minor version (10 for 3.10), for user space's symbolizer.
    pub minor: u8,
    pub _pad: u8,
    /// In `PyThreadState`: the current frame (3.10 `frame`, 3.13+
    /// `current_frame`), or the `_PyCFrame*` (3.11, 3.12 `cframe`).
    pub thread_frame: u16,
    /// In `_PyCFrame`: `current_frame` (3.11: 8, 3.12: 0); `NONE` when
    /// `thread_frame` is the frame itself.
    pub cframe_frame: u16,
    /// In a frame: the caller (`f_back`, `previous`).
    pub frame_previous: u16,
    /// In a frame: the code object (`f_code`, `f_executable`).
    pub frame_code: u16,
    /// In a frame: `f_lasti` (3.10, an int), `prev_instr` (3.11, 3.12),
    /// `instr_ptr` (3.13 on).
    pub frame_instr: u16,
    /// In a frame: `owner` (a byte, 3.11 on).
    pub frame_owner: u16,
    /// In a frame: `is_entry` (a byte, 3.11 only).
    pub frame_is_entry: u16,
    pub _pad2: u16,
    /// Bits cleared from the code pointer (3.14's `_PyStackRef` tags its
    /// low bits).
    pub code_tag_bits: u64,
}

impl PyProcess {
    /// An offset a version does not have.
    pub const NONE: u16 = u16::MAX;
}

/// The thread state of one thread of a CPython process, by the thread's
/// (host) id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyThread {
    /// Its `PyThreadState*`.
    pub thread_state: u64,
    /// The process (tgid) it belongs to: an entry whose tid was reused by
    /// another process is not followed.
    pub pid: u32,
    pub _pad: u32,
}

/// Bytes of a frame the BPF walker reads (alone for 3.10; from 3.11 on
/// within a larger window of the data stack), into its per-CPU walk
/// state: every field it needs lies below (3.10's `f_lasti` at 96 is the
/// farthest; `_PyInterpreterFrame` is 80 to 88 bytes and is followed by
/// its locals).
pub const FRAME_WINDOW: usize = 112;

/// The first word of a CPython frame.
pub const PY_FRAME_TAG: u64 = super::runtime_tag(super::RUNTIME_CPYTHON);

/// Reasons of a CPython cut (`super::MARK_CUT`, in its second word): a
/// frame could not be read.
pub const PY_CUT_READ_FAULT: u64 = 1;
/// The frame chain was longer than the walker follows for one sample.
pub const PY_CUT_TOO_DEEP: u64 = 2;

/// Python processes the walker knows at once.
pub const MAX_PY_PROCESSES: u32 = 4096;
/// Python threads it knows at once (all processes).
pub const MAX_PY_THREADS: u32 = 16384;

/// Python frames one sample may hold (each is two words of the user
/// stack): deep recursion is cut there, and the cut marked.
pub const MAX_PY_FRAMES: u32 = 256;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data; any bit pattern is a valid value.
    unsafe impl aya::Pod for super::PyProcess {}
    // SAFETY: plain #[repr(C)] data; any bit pattern is a valid value.
    unsafe impl aya::Pod for super::PyThread {}
}
