//! The state of a user stack walk, and the steps every walker shares:
//! the native walker (`unwind`) and the runtimes' walkers
//! (`runtimes::*`) read and move the same state.

use aya_ebpf::helpers::bpf_probe_read_user;
use aya_ebpf::helpers::generated::bpf_probe_read_user as bpf_probe_read_user_bytes;
use profiler_common::runtimes::hotspot::{BLOB_WINDOW, INTERPRETER_WORDS, JvmProcess};
use profiler_common::runtimes::python::PyProcess;
use profiler_common::unwind::{RULE_CACHE_SLOTS, UnwindMapping, UnwindRule, UserStackEnd};
use profiler_common::{MAX_SAMPLE_FRAMES, MAX_USER_FRAMES, Sample};

use crate::{machine, words};

/// Words of stack a walk copies at most at once (see
/// `WalkState::stack_window` and `stack_words`).
pub(crate) const STACK_WINDOW_WORDS: usize = 256;

/// A stack window read touches no page a read of this many bytes from
/// the same address would not (see `stack_words`).
const STACK_READ_PAGES_OF: u64 = 512;

/// The smallest page size of both targets: a mapping starts and ends on a
/// multiple of it.
pub(crate) const PAGE_BYTES: u64 = 4096;

/// Words of a CPython thread's data stack a walk copies at once (see
/// `runtimes::python`).
pub(crate) const PY_WINDOW_WORDS: usize = 128;

/// A copy of user memory the walk reads words from, made with one helper
/// call where the memory's words would otherwise cost one each.
#[repr(C)]
pub(crate) struct Window<const WORDS: usize> {
    /// The user address of `words[0]`; 0 when the window holds nothing.
    pub(crate) base: u64,
    /// Bytes held from `base`: the whole window, or the one frame read
    /// alone where the whole could not be.
    pub(crate) len: u64,
    /// Nonzero once a whole-window read failed (the stack's top is near):
    /// the walk's further reads are of the words it needs only. Only the
    /// stack window sets it (`stack_words`).
    pub(crate) off: u64,
    pub(crate) words: [u64; WORDS],
}

impl<const WORDS: usize> Window<WORDS> {
    /// The window's size in bytes.
    pub(crate) const BYTES: u64 = {
        assert!(WORDS.is_power_of_two());
        (WORDS * 8) as u64
    };

    /// Empties the window at a walk's start.
    #[inline(always)]
    pub(crate) fn clear(&mut self) {
        words::set(&raw mut self.base, 0);
        words::set(&raw mut self.off, 0);
    }

    /// The index of `count` words at `address`, when the window holds
    /// every one of them.
    #[inline(always)]
    pub(crate) fn held(&self, address: u64, count: u64) -> Option<usize> {
        let offset = address.wrapping_sub(self.base);
        // `offset < BYTES` first: an address just below the base wraps to
        // an offset near 2^64 that adding `count` words would wrap back.
        if self.base == 0 || address & 7 != 0 || offset >= Self::BYTES {
            return None;
        }
        if offset + count * 8 > self.len {
            return None;
        }
        // Masked as well: the verifier loses the bound of a value it
        // compared before a shift.
        Some(((offset >> 3) & (WORDS as u64 - 1)) as usize)
    }

    /// Copies the whole window from `from` up; false (and empty) on a
    /// fault.
    #[inline(always)]
    pub(crate) fn read(&mut self, from: u64) -> bool {
        self.read_bytes(from, Self::BYTES)
    }

    /// Copies `bytes` bytes (cut to whole words and to the window's size)
    /// from `from` up; false (and empty) on a fault.
    #[inline(always)]
    pub(crate) fn read_bytes(&mut self, from: u64, bytes: u64) -> bool {
        let bytes = bytes.min(Self::BYTES) & !7;
        // SAFETY: `words` is BYTES bytes of this CPU's walk state, and
        // `bytes` at most that.
        if !unsafe { read_into(self.words.as_mut_ptr().cast(), bytes, from) } {
            self.base = 0;
            return false;
        }
        self.base = from;
        self.len = bytes;
        true
    }
}

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
    /// The process's `ProcessUnwind::generation` (0: not registered, no
    /// rule is cached).
    pub(crate) generation: u32,
    pub(crate) _generation_pad: u32,
    /// Rules found by this context's walks on this CPU, kept for the next
    /// ones (`RULE_CACHE_SLOTS`, direct-mapped by a hash of the PC's
    /// granule and the generation; see `unwind::find_rule`). Here, beside the rest of the walk's state, rather
    /// than in a map of their own: the pages a walk touches anyway are
    /// the ones whose address translations are still cached.
    pub(crate) rule_cache: [CachedRule; RULE_CACHE_SLOTS as usize],
    /// A copy of the stack from the first frame it holds up. Each native
    /// frame's words are read from here when the window holds them, else
    /// the window is read again from the frame up: one helper call for
    /// the many small frames of a deep stack, where a call per frame was
    /// the walk's main cost. HotSpot's interpreted frames, which live on
    /// the same stack, are read through it too.
    pub(crate) stack_window: Window<STACK_WINDOW_WORDS>,
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
    /// `fp` is the current frame's frame pointer as the stack holds it:
    /// the last step read it from a frame record (a frame-pointer step,
    /// or a table row that restores it). Only then may a caller be
    /// stepped by its frame record without its rule
    /// (`UnwindMapping::frame_record_callers`): a leaf's or a signal
    /// frame's FP is a register that assembly may use for data.
    pub(crate) fp_from_record: u32,
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
    /// The next Python frame to write.
    pub(crate) py_frame: u64,
    /// The process's layout, copied once per walk.
    pub(crate) py: PyProcess,
    /// The frame being read, and (3.11 on) the frames below it in the
    /// thread's data stack: its callers.
    pub(crate) py_window: Window<PY_WINDOW_WORDS>,
    /// HotSpot (`runtimes::hotspot`): `JVM_UNSTARTED`, `JVM_ON`, `JVM_OFF`.
    pub(crate) jvm_state: u32,
    pub(crate) _jvm_pad: u32,
    /// The process's layout, copied once per walk.
    pub(crate) jvm: JvmProcess,
    /// The blob header being read.
    pub(crate) jvm_window: [u8; BLOB_WINDOW],
    /// The interpreter frame being read, where the stack window could not
    /// hold it.
    pub(crate) jvm_frame: [u64; INTERPRETER_WORDS],
}

/// A rule a walk found, kept for the next walks: valid while the process's
/// registration is `generation` (`ProcessUnwind::generation`, never 0, so
/// an empty slot matches nothing).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CachedRule {
    /// The addresses [start, start + len) the rule covers: the part of
    /// one granule (`RULE_CACHE_GRANULE_SHIFT`) inside the rule's row.
    pub(crate) start: u64,
    pub(crate) generation: u32,
    pub(crate) len: u16,
    /// The addresses are in a mapping user space registered.
    pub(crate) mapped: u16,
    pub(crate) rule: UnwindRule,
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

/// Copies `bytes` bytes of user memory at `from` to `to`; false on a fault
/// (the helper checks the user address).
///
/// # Safety
/// `to` must be `bytes` writable bytes of this program's memory (its walk
/// state, or a local).
#[inline(always)]
pub(crate) unsafe fn read_into(to: *mut u8, bytes: u64, from: u64) -> bool {
    // SAFETY: the caller's promise for `to`.
    unsafe { bpf_probe_read_user_bytes(to.cast(), bytes as u32, from as *const _) == 0 }
}

/// The word of the walked stack at `address` (through the stack window).
#[inline(always)]
pub(crate) fn stack_word(state: &mut WalkState, address: u64) -> Result<u64, ()> {
    match stack_words(state, address, 1) {
        Some(i) => state.stack_window.words.get(i).copied().ok_or(()),
        None => read_user(address),
    }
}

/// The two words of the walked stack at `address` (a frame record; through
/// the stack window).
#[inline(always)]
pub(crate) fn stack_pair(state: &mut WalkState, address: u64) -> Result<[u64; 2], ()> {
    match stack_words(state, address, 2) {
        Some(i) => match (
            state.stack_window.words.get(i),
            state.stack_window.words.get(i + 1),
        ) {
            (Some(&first), Some(&second)) => Ok([first, second]),
            _ => Err(()),
        },
        None => read_pair(address),
    }
}

/// Where `count` words of the stack at `address` are in the stack window,
/// reading the window from `address` up when it does not hold them; None
/// when it cannot (a word not aligned, or the stack's end within the
/// window's size: the caller reads the words alone).
#[inline(always)]
pub(crate) fn stack_words(state: &mut WalkState, address: u64, count: u64) -> Option<usize> {
    let window = &mut state.stack_window;
    if let Some(i) = window.held(address, count) {
        return Some(i);
    }
    if window.off != 0 || address == 0 || address & 7 != 0 {
        return None;
    }
    // As much of the stack as lies in the pages that 512 bytes from here
    // would reach (2 KiB at most): a read into a page past the stack's
    // end faults, which costs more than the read, and a window kept inside
    // those pages fails exactly where 512 bytes would. Measured inside one
    // program against fixed 512-byte windows, the walks alternating
    // (docs/architecture.md): 0.86-0.88x the walk on C without frame
    // pointers, 0.88-0.89x on 100-frame C stacks, 0.89-0.91x on the Go
    // service. A fixed 2 KiB read was 2x on the C program, whose stack
    // ends a little above its frames.
    let pages_end = ((address + STACK_READ_PAGES_OF - 1) | (PAGE_BYTES - 1)) + 1;
    if !window.read_bytes(address, pages_end - address) {
        // Stacks grow down and a walk goes up: past here it only gets
        // nearer the end.
        window.off = 1;
        return None;
    }
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
