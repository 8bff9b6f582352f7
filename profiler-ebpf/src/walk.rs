//! The state of a user stack walk, and the steps every walker shares:
//! the native walker (`unwind`) and the runtimes' walkers
//! (`runtimes::*`) read and move the same state.

use aya_ebpf::helpers::bpf_probe_read_user;
use profiler_common::runtimes::hotspot::{BLOB_WINDOW, INTERPRETER_WORDS, JvmProcess};
use profiler_common::runtimes::python::PyProcess;
use profiler_common::unwind::{UnwindMapping, UnwindRule, UserStackEnd};
use profiler_common::{MAX_SAMPLE_FRAMES, MAX_USER_FRAMES, Sample};

use crate::machine;

/// Lookups a walk keeps (a power of two).
pub(crate) const LOOKUPS_KEPT: usize = 8;

/// Words of stack a walk copies at once (see `WalkState::stack_window`).
pub(crate) const STACK_WINDOW_WORDS: usize = 64;
const STACK_WINDOW_BYTES: u64 = (STACK_WINDOW_WORDS * 8) as u64;

/// The walk in progress on this CPU.
#[repr(C)]
pub(crate) struct WalkState {
    pub(crate) pc: u64,
    pub(crate) sp: u64,
    pub(crate) fp: u64,
    /// The link register, while it still holds a return address (arm64:
    /// the leaf frame, and the frame a signal interrupted); else 0.
    pub(crate) lr: u64,
    /// Go's g register at the sample (a g only if the leaf was Go code).
    pub(crate) go_g: u64,
    /// HotSpot's bytecode-pointer register at the sample (one only if the
    /// leaf was the interpreter's).
    pub(crate) bcp: u64,
    /// The mapping the previous frame was in (most callers are in the same
    /// object as their callee): start == end when none.
    pub(crate) mapping: UnwindMapping,
    pub(crate) first_mapping: u32,
    pub(crate) mapping_count: u32,
    /// Addresses looked up in this walk (`LOOKUPS_KEPT`, by a hash of the
    /// address; `u64::MAX` when empty), and what each lookup found: the
    /// frames of a recursion share a few return addresses, and the table
    /// search is the walk's dearest part.
    pub(crate) lookups: [u64; LOOKUPS_KEPT],
    pub(crate) lookup_rules: [UnwindRule; LOOKUPS_KEPT],
    /// Bit i: `lookups[i]` was in a registered mapping.
    pub(crate) lookups_mapped: u32,
    /// The stack window could not be read (the stack's top is near): the
    /// walk's further reads are of the words it needs only.
    pub(crate) stack_window_off: u32,
    /// The user address of `stack_window[0]`; 0 when the window is empty.
    pub(crate) stack_window_base: u64,
    /// A copy of the stack from `stack_window_base` up. Each native
    /// frame's words are read from here when the window holds them, else
    /// the window is read again from the frame up: one helper call for
    /// the many small frames of a deep stack, where a call per frame was
    /// the walk's main cost.
    pub(crate) stack_window: [u64; STACK_WINDOW_WORDS],
    /// User frames written so far, after `kernel_frames` kernel frames.
    pub(crate) frames: u32,
    pub(crate) kernel_frames: u32,
    /// `UserStackEnd` once the walk is over.
    pub(crate) end: u32,
    /// The next pc was interrupted (by a signal), not a return address:
    /// look it up as is, not one byte back.
    pub(crate) exact_pc: u32,
    /// The leaf is inside a system call: its PC is the instruction after
    /// the `syscall`/`svc`, so its rule is looked up one byte back, in the
    /// instruction that is running (they differ where a function ends with
    /// its system call: a sigreturn trampoline).
    pub(crate) leaf_in_system_call: u32,
    /// The leaf PC is in no mapping user space registered for this
    /// process (code mapped since: dlopen, a JIT).
    pub(crate) unknown_leaf: u32,
    /// CPython (`runtimes::python`): `PY_UNSTARTED`, `PY_STARTED`,
    /// `PY_OFF`.
    pub(crate) py_state: u32,
    /// An eval loop activation's Python frames are being written.
    pub(crate) py_pending: u32,
    /// Python frames written so far.
    pub(crate) py_frames: u32,
    /// The thread's thread state was not known (see
    /// `SAMPLE_FLAG_PY_THREAD_UNKNOWN`).
    pub(crate) py_unknown_thread: u32,
    /// The walk's end (a `UserStackEnd`), once the pending Python frames
    /// are written; 0 while it goes on.
    pub(crate) py_end: u32,
    pub(crate) _py_pad: u32,
    /// The next Python frame to write.
    pub(crate) py_frame: u64,
    /// The process's layout, copied once per walk.
    pub(crate) py: PyProcess,
    /// The frame being read.
    pub(crate) py_window: [u8; profiler_common::runtimes::python::FRAME_WINDOW],
    /// HotSpot (`runtimes::hotspot`): `JVM_UNSTARTED`, `JVM_ON`, `JVM_OFF`.
    pub(crate) jvm_state: u32,
    pub(crate) _jvm_pad: u32,
    /// The process's layout, copied once per walk.
    pub(crate) jvm: JvmProcess,
    /// The blob header being read.
    pub(crate) jvm_window: [u8; BLOB_WINDOW],
    /// The interpreter frame being read.
    pub(crate) jvm_frame: [u64; INTERPRETER_WORDS],
}

pub(crate) enum Step {
    Next,
    End(UserStackEnd),
}

#[inline(always)]
pub(crate) fn read_user(address: u64) -> Result<u64, ()> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an Err.
    unsafe { bpf_probe_read_user(address as *const u64) }.map_err(|_| ())
}

#[inline(always)]
pub(crate) fn read_pair(address: u64) -> Result<[u64; 2], ()> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an Err.
    unsafe { bpf_probe_read_user(address as *const [u64; 2]) }.map_err(|_| ())
}

/// The word of the walked stack at `address` (through the stack window).
#[inline(always)]
pub(crate) fn stack_word(state: &mut WalkState, address: u64) -> Result<u64, ()> {
    match window_index(state, address, 1) {
        Some(i) => state.stack_window.get(i).copied().ok_or(()),
        None => read_user(address),
    }
}

/// The two words of the walked stack at `address` (a frame record; through
/// the stack window).
#[inline(always)]
pub(crate) fn stack_pair(state: &mut WalkState, address: u64) -> Result<[u64; 2], ()> {
    match window_index(state, address, 2) {
        Some(i) => match (state.stack_window.get(i), state.stack_window.get(i + 1)) {
            (Some(&first), Some(&second)) => Ok([first, second]),
            _ => Err(()),
        },
        None => read_pair(address),
    }
}

/// Where `words` words at `address` are in the stack window, reading the
/// window from `address` up when it does not hold them; None when the
/// window cannot (a word not aligned, or the stack's end within the
/// window's size: the caller reads the words alone).
#[inline(always)]
fn window_index(state: &mut WalkState, address: u64, words: u64) -> Option<usize> {
    if address & 7 != 0 {
        return None;
    }
    let offset = address.wrapping_sub(state.stack_window_base);
    if state.stack_window_base != 0 && offset + words * 8 <= STACK_WINDOW_BYTES {
        // Masked as well: the verifier loses the bound of a value it
        // compared before a shift.
        return Some(((offset >> 3) & (STACK_WINDOW_WORDS as u64 - 1)) as usize);
    }
    if state.stack_window_off != 0 || address == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_user checks the address; the destination is
    // this CPU's walk state, STACK_WINDOW_BYTES long.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            state.stack_window.as_mut_ptr().cast(),
            STACK_WINDOW_BYTES as u32,
            address as *const _,
        )
    };
    if read != 0 {
        // Stacks grow down and a walk goes up: past here it only gets
        // nearer the end.
        state.stack_window_off = 1;
        state.stack_window_base = 0;
        return None;
    }
    state.stack_window_base = address;
    Some(0)
}

/// Writes a two-word runtime frame (`profiler_common::runtimes`) after the
/// frames so far; false when the sample has no room for it.
#[inline(always)]
pub(crate) fn write_runtime_frame(
    state: &mut WalkState,
    sample: &mut Sample,
    first: u64,
    second: u64,
) -> bool {
    let n = state.frames;
    let slot = state.kernel_frames as u64 + n as u64;
    if n as usize + 2 > MAX_USER_FRAMES || slot + 2 > MAX_SAMPLE_FRAMES as u64 {
        return false;
    }
    let slot = slot as usize;
    if let Some(word) = sample.frames.get_mut(slot) {
        *word = first;
    }
    if let Some(word) = sample.frames.get_mut(slot + 1) {
        *word = second;
    }
    state.frames = n + 2;
    true
}

/// Moves to the caller at `pc`; a return address of 0 ends the stack.
#[inline(always)]
pub(crate) fn return_to(state: &mut WalkState, return_address: u64) -> Step {
    state.pc = machine::strip_pointer_auth(return_address);
    // Only the first frame (or one a signal interrupted) has its return
    // address in the link register.
    state.lr = 0;
    if state.pc == 0 {
        Step::End(UserStackEnd::Root)
    } else {
        Step::Next
    }
}
