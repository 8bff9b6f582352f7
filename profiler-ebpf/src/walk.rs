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
    pub(crate) _lookups_pad: u32,
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
