//! What every language runtime's BPF walker shares with user space: the
//! runtimes' ids (one line per runtime: the list on this side), how a
//! runtime's frames are written into a stack, the chain of walker
//! programs a walk goes through, the code regions a process's runtimes
//! own, and the runtimes' kernel counters. One module per runtime holds
//! its own types (its user-space home is its `profiler-runtime-<name>`
//! crate, its BPF walker `profiler-ebpf/src/runtimes/<name>`).
//!
//! # A runtime's frames in a stack
//!
//! A runtime frame is two words: the first carries `RUNTIME_FRAME`, the
//! runtime's id in bits 56-61 and a payload of the runtime's own (a code
//! object's address, a method's); the second is the runtime's too (an
//! instruction pointer, a bytecode index). A payload of 0 is a cut: the
//! runtime's part of the stack ends there, for the reason in the second
//! word. Two kinds of runtime write them:
//!
//! - **Runtimes whose frames are on the machine stack** (HotSpot's
//!   compiled and interpreted Java): the native walker hands the walk to
//!   the runtime's walker when the PC enters the runtime's code (a code
//!   region, `ProcessRegions`, or a row `RULE_RUNTIME` marks); it writes a
//!   frame per step and hands back when the PC leaves it.
//! - **Interpreters whose frames are a chain of their own** (CPython's
//!   frames, Ruby's control frames, PHP's execute data): the native walker
//!   meets each activation of the eval loop (its rows carry
//!   `RULE_FLAG_INTERPRETER` and the runtime's id) and writes an
//!   *activation mark* in its place (`MARK_ACTIVATION`, the eval loop's
//!   PC in the second word) and goes on. Once the native walk is over,
//!   the runtime's walker writes, after every native frame, a *section*
//!   (`MARK_SECTION`) with the frames of each activation in turn, the last
//!   frame of each flagged `ACTIVATION_LAST` (an activation without frames
//!   is a `MARK_END`), in a room of its own after the native part
//!   (`MAX_SECTION_WORDS`): one program run for all of a thread's
//!   interpreter frames however many times C and the interpreter call
//!   each other. User space splices the k-th activation of a section in
//!   place of the k-th mark (`profiler_unwind::user_frames`); a mark left
//!   without frames (the runtime off, a thread it does not know, a cut
//!   section) is the eval loop's native frame.

pub mod go;
pub mod hotspot;
pub mod python;

use crate::unwind::FRAME_EXACT_PC;

/// Runtime ids, in records (bits 56-61 of a runtime frame's first word),
/// unwind rules (`UnwindRule::param` of an interpreter's rows), code
/// regions and counters. 0 is no runtime.
pub const RUNTIME_CPYTHON: u8 = 1;
pub const RUNTIME_HOTSPOT: u8 = 2;

/// Ids run from 1 to `MAX_RUNTIMES - 1`.
pub const MAX_RUNTIMES: usize = 8;

/// Marks a user-stack word as the first of a runtime frame's two words
/// (not a code address: user addresses never reach bit 62; a native
/// frame's `FRAME_EXACT_PC` is bit 63).
pub const RUNTIME_FRAME: u64 = 1 << 62;
/// The bits of a runtime frame's first word that name its runtime.
pub const RUNTIME_KIND_SHIFT: u32 = 56;
pub const RUNTIME_KIND_MASK: u64 = 0x3f << RUNTIME_KIND_SHIFT;
/// The first word's payload.
pub const RUNTIME_PAYLOAD_MASK: u64 = (1 << RUNTIME_KIND_SHIFT) - 1;

/// The first word of a frame of runtime `id`, before its payload.
pub const fn runtime_tag(id: u8) -> u64 {
    RUNTIME_FRAME | ((id as u64) << RUNTIME_KIND_SHIFT)
}

/// Payloads that are marks, not frames (any runtime; no runtime's frame
/// payload comes near them).
///
/// The runtime's part of the stack was cut here; the second word is the
/// runtime's reason.
pub const MARK_CUT: u64 = 0;
/// In the native part of a stack: an interpreter activation, standing for
/// the eval loop's native frame; the second word is that frame's PC
/// (`FRAME_EXACT_PC` set when it is not a return address).
pub const MARK_ACTIVATION: u64 = RUNTIME_PAYLOAD_MASK;
/// After the native part: the start of a runtime's section.
pub const MARK_SECTION: u64 = RUNTIME_PAYLOAD_MASK - 1;
/// In a section: the end of an activation that has no frames (one whose
/// last frame is written ends it with `ACTIVATION_LAST` instead).
pub const MARK_END: u64 = RUNTIME_PAYLOAD_MASK - 2;
/// In a section, on a frame's payload: the last frame of its activation.
/// (No interpreter's frame payload, an address, reaches bit 55.)
pub const ACTIVATION_LAST: u64 = 1 << 55;

/// The runtime of a runtime frame's first word.
pub const fn runtime_of(first: u64) -> u8 {
    ((first & RUNTIME_KIND_MASK) >> RUNTIME_KIND_SHIFT) as u8
}

/// Whether a user-stack word starts a runtime frame (two words).
pub const fn is_runtime_frame(word: u64) -> bool {
    word & RUNTIME_FRAME != 0 && word & FRAME_EXACT_PC == 0
}

/// The native code addresses of a user stack as the walker wrote it:
/// runtime frames left out, activation marks as the eval loop's PC, the
/// exact-PC mark cleared.
pub fn native_pcs(words: &[u64]) -> impl Iterator<Item = u64> + '_ {
    let mut at = 0;
    core::iter::from_fn(move || {
        loop {
            let raw = *words.get(at)?;
            if is_runtime_frame(raw) {
                at += 2;
                if raw & RUNTIME_PAYLOAD_MASK == MARK_ACTIVATION {
                    let pc = *words.get(at - 1)?;
                    return Some(pc & !FRAME_EXACT_PC);
                }
                continue;
            }
            at += 1;
            return Some(raw & !FRAME_EXACT_PC);
        }
    })
}

/// The walk's chain of programs: each context (CPU samples, the
/// scheduler's switches, probe hits) has a program array with these
/// slots, and each walker tail-calls the next.
///
/// The native walker (unwind tables or frame pointers).
pub const CHAIN_NATIVE: u32 = 0;
/// What the context does with the walked stack (sends the sample).
pub const CHAIN_FINISH: u32 = 1;
/// Runtime `id`'s walker.
pub const fn chain_slot(id: u8) -> u32 {
    1 + id as u32
}
/// Slots of each program array.
pub const CHAIN_SLOTS: u32 = 1 + MAX_RUNTIMES as u32;

/// Tail calls one program run may take: the kernel allows 33
/// (`MAX_TAIL_CALL_CNT`); one is kept so the finishing program is always
/// reached. A walker hands over to another only while this leaves room
/// for the way back and the finish: a stack that switches between the
/// native walker and a runtime's more often than that (JNI and Java
/// alternating 14 times) has its innermost switches walked and the rest
/// cut (`Counter::ChainCut`). Interpreters whose frames form a chain
/// (CPython) take one call per sample however deep the mix.
pub const MAX_CHAIN_CALLS: u32 = 32;

/// Code regions of a process's runtimes the walker looks PCs up in when
/// no file-backed mapping holds them (JIT code: HotSpot's code cache).
pub const MAX_CODE_REGIONS: usize = 4;

/// One runtime's code: [low, high).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeRegion {
    pub low: u64,
    pub high: u64,
    /// `RUNTIME_*`.
    pub runtime: u32,
    pub _pad: u32,
}

/// The code regions of one process's runtimes (`count` of them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessRegions {
    pub regions: [CodeRegion; MAX_CODE_REGIONS],
    pub count: u32,
    pub _pad: u32,
}

/// Processes with code regions at once.
pub const MAX_REGION_PROCESSES: u32 = 4096;

/// What each runtime's walker counts, per runtime (`RUNTIME_COUNTERS`,
/// slot `runtime * RUNTIME_COUNTER_KINDS + counter`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeCounter {
    /// Frames the runtime's walker wrote.
    Frames = 0,
    /// Samples whose runtime frames were cut (a frame that could not be
    /// read or followed, a chain deeper than the runtime's bound).
    Cut = 1,
    /// Samples whose stack met the runtime in a thread user space had not
    /// registered yet (its frames stayed native).
    ThreadUnknown = 2,
    /// Frames in a runtime's code where the runtime found none of its own
    /// and the native walker stepped them by frame pointer instead.
    Fallback = 3,
}

impl RuntimeCounter {
    pub const ALL: [RuntimeCounter; 4] = [
        RuntimeCounter::Frames,
        RuntimeCounter::Cut,
        RuntimeCounter::ThreadUnknown,
        RuntimeCounter::Fallback,
    ];

    /// Its name in the report and in metric names.
    pub const fn name(self) -> &'static str {
        match self {
            RuntimeCounter::Frames => "frames",
            RuntimeCounter::Cut => "cut",
            RuntimeCounter::ThreadUnknown => "thread_unknown",
            RuntimeCounter::Fallback => "fallback",
        }
    }

    /// Its slot for runtime `id`.
    pub const fn slot(self, id: u8) -> u32 {
        id as u32 * RUNTIME_COUNTER_KINDS + self as u32
    }
}

/// Counters per runtime.
pub const RUNTIME_COUNTER_KINDS: u32 = 4;
/// Slots of `RUNTIME_COUNTERS`.
pub const RUNTIME_COUNTER_SLOTS: u32 = MAX_RUNTIMES as u32 * RUNTIME_COUNTER_KINDS;

#[cfg(test)]
mod tests {
    use super::*;

    // HotSpot's largest payload (kind 15, exact, a 48-bit address) and a
    // flagged address are no marks.
    const _: () = assert!((0xf << 52) | (1 << 51) | ((1 << 48) - 1) < MARK_END);
    const _: () = assert!(ACTIVATION_LAST | ((1 << 48) - 1) < MARK_END);
    const _: () = assert!(MARK_END < MARK_SECTION && MARK_SECTION < MARK_ACTIVATION);

    #[test]
    fn a_frames_runtime_is_its_tags() {
        assert_eq!(
            runtime_of(runtime_tag(RUNTIME_HOTSPOT) | 5),
            RUNTIME_HOTSPOT
        );
    }

    #[test]
    fn native_pcs_take_an_activation_as_its_eval_loop() {
        let mark = runtime_tag(RUNTIME_CPYTHON) | MARK_ACTIVATION;
        let words = [0x1000, mark, 0x2000 | FRAME_EXACT_PC, 0x3000];
        let mut pcs = native_pcs(&words);
        assert_eq!(pcs.next(), Some(0x1000));
        assert_eq!(pcs.next(), Some(0x2000));
        assert_eq!(pcs.next(), Some(0x3000));
        assert_eq!(pcs.next(), None);
    }
}
