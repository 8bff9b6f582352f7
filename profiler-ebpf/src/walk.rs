//! The state of a user stack walk, and the steps every walker shares.
//!
//! A walk runs as a chain of programs (`chain`): the native walker, the
//! runtimes' walkers it hands over to, and the context's finishing
//! program, each a program of its own with its own verifier budget, which
//! tail-call each other. What they share lives here, in a per-CPU map
//! (`WALK`, one slot per context): the registers (PC, SP, FP, LR, and
//! the callee-saved ones runtimes keep state in), the frames written so
//! far, how the walk ended, where the chain goes next and how many calls
//! it took. A runtime's own cursor (its frame pointer, its layout) is in a
//! per-CPU map of its own home.

use aya_ebpf::helpers::bpf_probe_read_user;
use aya_ebpf::helpers::generated::bpf_probe_read_user as bpf_probe_read_user_bytes;
use aya_ebpf::macros::map;
use aya_ebpf::maps::{HashMap, PerCpuArray};
use profiler_common::runtimes::{
    MARK_ACTIVATION, MAX_REGION_PROCESSES, MAX_RUNTIMES, ProcessRegions, RuntimeCounter,
    runtime_tag,
};
use profiler_common::unwind::{RULE_CACHE_SLOTS, UnwindMapping, UnwindRule, UserStackEnd};
use profiler_common::{CALLEE_REGS, MAX_SAMPLE_FRAMES, MAX_USER_FRAMES, MAX_USER_WORDS, Sample};

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

/// One walk state per context that can walk on a CPU at once (`chain`'s
/// `CPU`, `SCHED`, `PROBE`): a CPU sample never runs inside a probe's
/// program (the kernel keeps tracing programs from nesting), but one state
/// each keeps that from mattering.
#[map]
static WALK: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(3, 0);

/// The code regions of processes' runtimes (JIT code no object file
/// describes), by pid, written by user space
/// (`profiler_runtime::regions`).
#[map]
static RUNTIME_REGIONS: HashMap<u32, ProcessRegions> =
    HashMap::with_max_entries(MAX_REGION_PROCESSES, 0);

/// This CPU's walk state of context `context`.
#[inline(always)]
pub(crate) fn state(context: u32) -> Option<*mut WalkState> {
    WALK.get_ptr_mut(context)
}

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
    /// The callee-saved registers at the sample (`UserRegs::callee`): what
    /// a runtime keeps in them is its own only if the leaf was its code.
    pub(crate) callee: [u64; CALLEE_REGS],
    /// The mapping the previous frame was in (most callers are in the same
    /// object as their callee): start == end when none.
    pub(crate) mapping: UnwindMapping,
    pub(crate) first_mapping: u32,
    pub(crate) mapping_count: u32,
    /// The process's `ProcessUnwind::generation` (0: not registered, no
    /// rule is cached).
    pub(crate) generation: u32,
    pub(crate) pid: u32,
    /// Rules found by this context's walks on this CPU, kept for the next
    /// ones (`RULE_CACHE_SLOTS`, direct-mapped by a hash of the PC's
    /// granule and the generation; see `native::find_rule`). Here, beside
    /// the rest of the walk's state, rather than in a map of their own: the
    /// pages a walk touches anyway are the ones whose address translations
    /// are still cached.
    pub(crate) rule_cache: [CachedRule; RULE_CACHE_SLOTS as usize],
    /// A copy of the stack from the first frame it holds up. Each native
    /// frame's words are read from here when the window holds them, else
    /// the window is read again from the frame up: one helper call for
    /// the many small frames of a deep stack, where a call per frame was
    /// the walk's main cost. Runtimes whose frames live on the same stack
    /// (HotSpot's interpreter) read them through it too.
    pub(crate) stack_window: Window<STACK_WINDOW_WORDS>,
    /// The process's runtime code regions (`regions_state`).
    pub(crate) regions: ProcessRegions,
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
    /// `SAMPLE_FLAG_*` the walk found (an unknown leaf mapping, a
    /// runtime's unknown thread).
    pub(crate) sample_flags: u32,
    /// `fp` is the current frame's frame pointer as the stack holds it:
    /// the last step read it from a frame record (a frame-pointer step,
    /// or a table row that restores it). Only then may a caller be
    /// stepped by its frame record without its rule
    /// (`UnwindMapping::frame_record_callers`): a leaf's or a signal
    /// frame's FP is a register that assembly may use for data.
    pub(crate) fp_from_record: u32,
    /// Tail calls taken by this program run (`MAX_CHAIN_CALLS`).
    pub(crate) chain_calls: u32,
    /// The chain slot to run next (`CHAIN_*`).
    pub(crate) next: u32,
    /// The current frame is in a runtime's code but the runtime found no
    /// frame of its own there: the native walker steps it by its frame
    /// pointer and does not hand it back.
    pub(crate) native_once: u32,
    /// Bit per runtime: it wrote activation marks, and its section is
    /// still to be written.
    pub(crate) marked: u32,
    /// Activation marks written, per runtime.
    pub(crate) marks: [u64; MAX_RUNTIMES],
    /// Bit per runtime: its per-walk state is set up (the runtime's own
    /// meaning; cleared at each walk's start).
    pub(crate) ready: u32,
    /// `regions`: `REGIONS_UNREAD`, `REGIONS_READ`, `REGIONS_NONE`.
    pub(crate) regions_state: u32,
    pub(crate) _pad: u32,
    /// Where the entry reads the task's saved registers
    /// (`machine::saved_user`), off its stack.
    pub(crate) regs_block: [u64; machine::REGS_BLOCK_WORDS],
}

pub(crate) const REGIONS_UNREAD: u32 = 0;
pub(crate) const REGIONS_READ: u32 = 1;
pub(crate) const REGIONS_NONE: u32 = 2;

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
/// frames so far, in the stack's native part; false when it has no room.
#[inline(always)]
pub(crate) fn write_runtime_frame(
    state: &mut WalkState,
    sample: &mut Sample,
    first: u64,
    second: u64,
) -> bool {
    write_words(state, sample, first, second, MAX_USER_FRAMES)
}

/// Writes a two-word frame of an interpreter's section, in the room after
/// the native part (`MAX_USER_WORDS`); false when it has none left.
#[inline(always)]
pub(crate) fn write_section_frame(
    state: &mut WalkState,
    sample: &mut Sample,
    first: u64,
    second: u64,
) -> bool {
    write_words(state, sample, first, second, MAX_USER_WORDS)
}

#[inline(always)]
fn write_words(
    state: &mut WalkState,
    sample: &mut Sample,
    first: u64,
    second: u64,
    limit: usize,
) -> bool {
    let n = state.frames;
    let slot = state.kernel_frames as u64 + n as u64;
    if n as usize + 2 > limit || slot + 2 > MAX_SAMPLE_FRAMES as u64 {
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

/// Starts a walk of the current task's user stack from `regs` in `state`,
/// after the `kernel_frames` kernel frames already in the sample;
/// `in_system_call` when the registers are those of a task inside a
/// system call (`machine::SavedUser`). False when there is nothing to walk
/// (a kernel thread).
#[inline(always)]
pub(crate) fn begin(
    state: &mut WalkState,
    pid: u32,
    regs: &profiler_common::UserRegs,
    in_system_call: bool,
    kernel_frames: u32,
) -> bool {
    // Field by field (`words`: no byte-wise memset).
    words::set(&raw mut state.frames, 0);
    words::set(&raw mut state.kernel_frames, kernel_frames);
    words::set(&raw mut state.chain_calls, 0);
    words::set(&raw mut state.sample_flags, 0);
    words::set(&raw mut state.marked, 0);
    let mut i = 0;
    while i < MAX_RUNTIMES {
        if let Some(count) = state.marks.get_mut(i) {
            words::set(count, 0);
        }
        i += 1;
    }
    words::set(&raw mut state.ready, 0);
    words::set(&raw mut state.native_once, 0);
    words::set(&raw mut state.regions_state, REGIONS_UNREAD);
    words::set(&raw mut state.pid, pid);
    words::copy(&mut state.callee, &regs.callee);
    // A kernel thread has no user registers worth walking.
    if regs.pc == 0 || regs.pc >= machine::USER_LIMIT {
        words::set(&raw mut state.end, UserStackEnd::None as u32);
        return false;
    }
    state.pc = regs.pc;
    state.sp = regs.sp;
    state.fp = regs.fp;
    state.lr = machine::strip_pointer_auth(regs.lr);
    words::set(&raw mut state.mapping.start, 0);
    words::set(&raw mut state.mapping.end, 0);
    words::set(&raw mut state.first_mapping, 0);
    words::set(&raw mut state.mapping_count, 0);
    words::set(&raw mut state.generation, 0);
    state.stack_window.clear();
    words::set(&raw mut state.end, UserStackEnd::Truncated as u32);
    words::set(&raw mut state.exact_pc, 0);
    words::set(&raw mut state.leaf_in_system_call, in_system_call as u32);
    words::set(&raw mut state.fp_from_record, 0);
    true
}

/// How the walk ended (`state.end`).
#[inline(always)]
pub(crate) fn end_of(state: &WalkState) -> UserStackEnd {
    match state.end {
        0 => UserStackEnd::None,
        1 => UserStackEnd::Root,
        2 => UserStackEnd::NoTable,
        3 => UserStackEnd::TableStop,
        4 => UserStackEnd::ReadFault,
        _ => UserStackEnd::Truncated,
    }
}

/// The runtime whose code region holds `pc` (0: none), from the regions
/// user space registered for the walk's process (read once per walk).
#[inline(always)]
pub(crate) fn region_of(state: &mut WalkState, pc: u64) -> u8 {
    if state.regions_state == REGIONS_UNREAD {
        state.regions_state = REGIONS_NONE;
        // The key on this program's stack: called from a global function,
        // `state` is memory the 6.1 verifier does not take a key from.
        let pid = unsafe { core::ptr::read_volatile(&state.pid) };
        // SAFETY: the value is copied out of the map.
        if let Some(regions) = unsafe { RUNTIME_REGIONS.get(&pid) } {
            words::copy(&mut state.regions, regions);
            state.regions_state = REGIONS_READ;
        }
    }
    if state.regions_state != REGIONS_READ {
        return 0;
    }
    let mut i = 0;
    while i < profiler_common::runtimes::MAX_CODE_REGIONS {
        if i as u32 >= state.regions.count {
            break;
        }
        if let Some(region) = state.regions.regions.get(i)
            && region.low <= pc
            && pc < region.high
        {
            return region.runtime as u8;
        }
        i += 1;
    }
    0
}

/// Writes an activation mark of interpreter `runtime` for the eval loop
/// frame at `state.pc` (`runtimes` module of profiler-common); false when
/// the sample has no room for it.
#[inline(always)]
pub(crate) fn write_activation(state: &mut WalkState, sample: &mut Sample, runtime: u8) -> bool {
    let exact = if state.frames == 0 || state.exact_pc != 0 {
        profiler_common::unwind::FRAME_EXACT_PC
    } else {
        0
    };
    let written = write_runtime_frame(
        state,
        sample,
        runtime_tag(runtime) | MARK_ACTIVATION,
        state.pc | exact,
    );
    if written {
        state.marked |= 1 << (runtime & 31);
        // Masked: the verifier loses a compared bound across the shift.
        if let Some(count) = state.marks.get_mut(runtime as usize & (MAX_RUNTIMES - 1)) {
            *count += 1;
        }
    }
    written
}

/// Counts `counter` of runtime `runtime`.
#[inline(always)]
pub(crate) fn bump_runtime(runtime: u8, counter: RuntimeCounter) {
    crate::bump_runtime(counter.slot(runtime));
}
