//! Turning the raw program counters of a sample into frames to symbolize.
//!
//! The BPF walker (profiler-ebpf/src/unwind.rs) follows frame pointers and,
//! where this stage loaded a table for the code, table rows (`go` builds
//! them from Go's pcsp tables; `.eh_frame` CFI is the next source, as rows
//! of the same shape). This stage also decides which address each frame is
//! looked up as.

pub mod arch;
pub mod go;
mod tables;

pub use tables::{UnwindOccupancy, UnwindTableStats, UnwindTables};

/// An unwind table for one object: rows sorted by `pc`, each `pc` an
/// offset from `base` (an ELF virtual address of the object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRows {
    pub base: u64,
    pub rows: Vec<profiler_common::UnwindRow>,
}

/// One frame of a raw stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame {
    /// The address as sampled: the interrupted PC for the leaf, a return
    /// address for every caller.
    pub pc: u64,
    /// The address to symbolize: inside the call instruction for callers,
    /// so the caller's function and line are the call's, not the next
    /// statement's (which may be another function after a noreturn call).
    pub lookup_pc: u64,
}

/// Frames of a leaf-first stack of PCs, as `bpf_get_stack` returns them.
pub fn frames(pcs: &[u64]) -> impl Iterator<Item = RawFrame> + '_ {
    pcs.iter().enumerate().map(|(depth, &pc)| RawFrame {
        pc,
        lookup_pc: if depth == 0 { pc } else { arch::call_site(pc) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_are_looked_up_inside_the_call() {
        let frames: Vec<_> = frames(&[0x1000, 0x2005, 0x3010]).collect();
        assert_eq!(frames[0].lookup_pc, 0x1000);
        assert_eq!(frames[1].pc, 0x2005);
        assert!(frames[1].lookup_pc < 0x2005 && frames[1].lookup_pc >= 0x2005 - 4);
        assert!(frames[2].lookup_pc < 0x3010);
    }
}
