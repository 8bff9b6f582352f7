//! HotSpot (OpenJDK's JVM): what the BPF walker needs to put a thread's
//! Java frames into its stack, and how they are written into the sample
//! record.
//!
//! Java code runs from the JVM's code cache: the template interpreter
//! (one frame per interpreted method, a frame pointer chain) and methods
//! compiled by C1 and C2 (fixed-size frames without frame pointers, their
//! sizes in each compiled blob's header). No object file describes either,
//! so the native walker cannot; when the PC is inside the code cache the
//! walker steps the frame itself: an interpreted frame by its frame
//! pointer (the `Method*` and bytecode pointer are in fixed slots below
//! it), a compiled one by the blob found through the code heap's segment
//! map (HotSpot's own `CodeHeap::find_block_for`). Each Java frame is two
//! words; user space names it (method, file, line, and a compiled frame's
//! inlined methods) from the JVM's memory. Native frames (JNI code, the
//! JVM's C++) are the native walker's, before and after.
//!
//! Every offset comes from the JVM's own `gHotSpotVMStructs` tables, read
//! by user space from the process (`JvmProcess`): no table per JDK build.

/// The first word of a Java frame. Its payload: a frame kind
/// (`JVM_KIND_*`) in bits 52-55, `JVM_EXACT` in bit 51, an address in bits
/// 0-47.
pub const JVM_FRAME_TAG: u64 = super::runtime_tag(super::RUNTIME_HOTSPOT);

pub const JVM_KIND_SHIFT: u32 = 52;
pub const JVM_KIND_MASK: u64 = 0xf << JVM_KIND_SHIFT;
/// An interpreted frame. Address: its `Method*`; second word: the bytecode
/// pointer (0 in a native method's frame).
pub const JVM_KIND_INTERPRETED: u64 = 1;
/// A frame of compiled code (an nmethod, a native wrapper, a stub or an
/// adapter). Address: its `CodeBlob*`; second word: the blob's compile id
/// (high 32 bits; meaningful for nmethods, which user space checks so that
/// a blob freed and reused is never named as another method) and the PC's
/// offset from the blob's code start (low 32 bits).
pub const JVM_KIND_COMPILED: u64 = 2;
/// Not a frame: the Java part of the stack was cut here, for the reason in
/// the second word (`JVM_CUT_*`); native frames may follow.
pub const JVM_KIND_CUT: u64 = 0;
/// The frame's PC is the one the thread was stopped at (the innermost
/// frame), not a return address: compiled code is looked up at the PC
/// itself, and an interpreted frame's bytecode pointer comes from the
/// interpreter's register rather than its (stale) frame slot.
pub const JVM_EXACT: u64 = 1 << 51;
pub const JVM_ADDRESS_MASK: u64 = (1 << 48) - 1;

/// `JVM_KIND_CUT` reasons.
pub const JVM_CUT_READ_FAULT: u64 = 1;
/// A PC in the code cache that no blob covers (freed, or the segment map
/// could not be followed).
pub const JVM_CUT_NO_BLOB: u64 = 2;
/// A frame whose caller could not be found (a stub without a frame, a
/// frame size out of bounds).
pub const JVM_CUT_NO_CALLER: u64 = 3;

/// Code heaps the walker searches (segmented code cache: non-profiled,
/// profiled and non-nmethod code; one when unsegmented).
pub const MAX_JVM_HEAPS: usize = 4;
/// Hops through a segment map to a block's start: HotSpot keeps them
/// short (each byte of the map says how far back to jump, up to 254
/// segments).
pub const MAX_SEGMENT_HOPS: u32 = 16;
/// JVM processes the walker knows at once.
pub const MAX_JVM_PROCESSES: u32 = 1024;
/// Largest frame a compiled method may have (bytes): a bound on the
/// stack pointer's step, against forged frame sizes.
pub const MAX_COMPILED_FRAME: u64 = 1 << 20;

/// One code heap: its reserved range, and its segment map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JvmHeap {
    /// `_memory._low_boundary` and `_high_boundary`.
    pub low: u64,
    pub high: u64,
    /// `_segmap._low`: one byte per segment.
    pub segmap: u64,
    /// `_log2_segment_size` (7: 128-byte segments).
    pub log2_segment: u32,
    pub _pad: u32,
}

/// Where one JVM keeps what the walker reads: addresses in the process,
/// offsets in bytes, all from its VMStructs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JvmProcess {
    /// `CodeCache::_low_bound`, `_high_bound`: every blob is in between.
    pub code_low: u64,
    pub code_high: u64,
    /// The template interpreter's code (`AbstractInterpreter::_code`'s
    /// stub buffer).
    pub interpreter_low: u64,
    pub interpreter_high: u64,
    pub heaps: [JvmHeap; MAX_JVM_HEAPS],
    pub heap_count: u32,
    /// `sizeof(HeapBlock)`: the header before each blob.
    pub block_header: u16,
    /// `HeapBlock::Header::_used`.
    pub block_used: u16,
    /// `CodeBlob::_frame_size` (an int, in words).
    pub blob_frame_size: u16,
    /// `CodeBlob::_frame_complete_offset` (from the code start).
    pub blob_frame_complete: u16,
    /// `CodeBlob::_code_begin` (a pointer; JDK 17 to 22), or
    /// `_code_offset` (an int from the blob; JDK 23 on).
    pub blob_code: u16,
    /// `nmethod::_compile_id` (an int).
    pub nmethod_compile_id: u16,
    /// `nmethod::_verified_entry_point` (a pointer), or
    /// `_verified_entry_offset` (a u16 from the code start, JDK 23 on).
    pub nmethod_verified_entry: u16,
    /// Bit set of `JVM_FLAG_*`.
    pub flags: u16,
    /// Interpreter frame slots, in words below the frame pointer:
    /// `Method*` (3), the bytecode pointer (8 on x86_64, 9 on arm64), the
    /// sender's stack pointer (1).
    pub method_slot: u8,
    pub bcp_slot: u8,
    pub sender_sp_slot: u8,
    pub _pad: [u8; 5],
}

/// `blob_code` is an int offset from the blob (JDK 23 on), not a pointer.
pub const JVM_FLAG_CODE_OFFSET: u16 = 1 << 0;
/// `blob_frame_complete` is 16 bits wide (JDK 23 on), not 32.
pub const JVM_FLAG_FRAME_COMPLETE_16: u16 = 1 << 1;
/// `nmethod_verified_entry` is a u16 offset from the code start (JDK 23
/// on), not a pointer.
pub const JVM_FLAG_VERIFIED_ENTRY_OFFSET: u16 = 1 << 2;
/// `HeapBlock::Header::_length` is 32 bits (JDK 25 on), not 64 (unused by
/// the walker; user space enumerates blocks).
pub const JVM_FLAG_BLOCK_LENGTH_32: u16 = 1 << 3;

/// Bytes of a blob's header the walker reads at once: every `CodeBlob`
/// field it needs lies below (JDK 17's `_frame_size` at 28, 21's at 88,
/// 25's code offset at 36).
pub const BLOB_WINDOW: usize = 104;

/// Words of an interpreter frame the walker reads at once: from 9 words
/// below the frame pointer (the deepest slot used, arm64's bytecode
/// pointer) to the return address above it.
pub const INTERPRETER_WORDS: usize = 11;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data; any bit pattern is a valid value.
    unsafe impl aya::Pod for super::JvmProcess {}
}
